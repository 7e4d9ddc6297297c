"""Where a run lives: its folder, what an existing folder holds, which one to resume.

A run takes its folders in two parts: ``take`` checks them against the
arguments (read only; a folder a live run holds is reported in use first,
whatever it holds), creates them and takes their locks (launch/run_lock.py),
a single-process run before it imports jax (its process owns the folder);
``prepare`` settles them once every argument and the mesh are checked. What a
run holds is a ``Claim``: its locks and the folders it created, removed again
by one mechanism (``Claim.remove``) wherever the run ends before it started.

Nothing here imports jax or orbax, so the local launcher can use it. A step
of a checkpoint folder is finalized when its directory has an integer name
(Orbax writes into ``<step>.orbax-checkpoint-tmp-*`` and renames it when the
save is complete).
"""

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import time

from etils import epath

from checkpoints import digest
from launch import run_lock
from launch.cli import UsageError
from launch.cli import blocking_part

__all__ = ["LOGS", "RUNS", "Claim", "claim_new", "describe", "finalized_steps",
           "metrics_records", "new_name", "newest_resumable", "prepare", "refuse_if_in_use",
           "saved_config", "set_aside_logs", "take", "unfinished_saves"]

RUNS = pathlib.Path("runs")
LOGS = ("metrics.jsonl", "samples.jsonl")  # a run's own log files: set aside by a fresh start
_DEFAULT_PLACE = f"{RUNS} (where a run without --out goes)"  # named when it is in use


def new_name(tag: str = "", now: float | None = None) -> pathlib.Path:
  """``runs/lm-<YYYYmmdd-HHMMSS>[-tag]`` for the time ``now`` (default: now)."""
  stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
  return RUNS / (f"lm-{stamp}-{tag}" if tag else f"lm-{stamp}")


def _make_folders(path: pathlib.Path) -> list[str]:
  """Creates the folder ``path`` and the folders above it that are missing; those it created,
  outermost first (a folder another run creates meanwhile is that run's). Raises OSError."""
  missing = [p for p in (path, *path.parents) if not p.is_dir()][::-1]
  created = []
  for folder in missing:
    try:
      folder.mkdir()
      created.append(str(folder))
    except FileExistsError:
      if not folder.is_dir():
        raise
  return created


def claim_new(base: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
  """Creates ``base`` (or ``base-2``, ``base-3``, ... when taken): (it, the folders created,
  outermost first: ``runs`` too when it was missing).

  ``mkdir`` without ``exist_ok`` is atomic: of two runs started in the same
  second, each gets a folder of its own.
  """
  blocked = blocking_part(str(base.parent))
  if blocked is not None:
    raise UsageError(f"cannot create the run folder {base}: {blocked[0]} is {blocked[1]} (new run"
                     " folders go in it); move it away, or pass --out")
  try:
    created = _make_folders(base.parent)
  except OSError as e:
    raise UsageError(f"cannot create the run folder {base} ({e.strerror}); pass --out") from None
  for n in range(1, 1000):
    path = base if n == 1 else base.with_name(f"{base.name}-{n}")
    try:
      path.mkdir()
      return path, [*created, str(path)]
    except FileExistsError:
      continue
    except OSError as e:
      _remove_folders(created)
      raise UsageError(f"cannot create the run folder {path} ({e.strerror}); pass --out") from None
  raise UsageError(f"{base}: 999 run folders of that name exist already; pass --out")


def finalized_steps(checkpoint_dir) -> list[int]:
  """Steps of the finalized checkpoints in ``checkpoint_dir``, ascending."""
  path = epath.Path(checkpoint_dir)  # also gs:// and other URLs
  if not path.is_dir():
    return []
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir())


def saved_config(checkpoint_dir) -> tuple[dict, int] | None:
  """(the flags saved with the newest finalized step whose record vouches for its metadata,
  that step), or None when no step has any: read from the step's JSON items
  (``<step>/layout/metadata``, ``<step>/metadata/metadata``) and checked against the record's
  digest (``checkpoints.digest``) without jax; a step that fails is passed over, as the
  restore passes over it."""
  for step in reversed(finalized_steps(checkpoint_dir)):
    folder = epath.Path(checkpoint_dir) / str(step)
    try:
      metadata = json.loads((folder / "metadata" / "metadata").read_text())
      digest.check(json.loads((folder / "layout" / "metadata").read_text()), metadata)
    except (OSError, ValueError):
      continue
    if isinstance(metadata, dict) and isinstance(metadata.get("config"), dict):
      return metadata["config"], step
  return None


def unfinished_saves(checkpoint_dir) -> list[str]:
  """Names of the temporary folders of saves that never finished."""
  path = epath.Path(checkpoint_dir)
  if not path.is_dir():
    return []
  return sorted(p.name for p in path.iterdir() if "tmp" in p.name)


def metrics_records(folder) -> int:
  """How many lines ``folder/metrics.jsonl`` has (0 if none)."""
  path = pathlib.Path(folder) / "metrics.jsonl"
  return len(path.read_text().splitlines()) if path.is_file() else 0


def _contents(folder: pathlib.Path, checkpoint_dir, run_folder: bool) -> str:
  """The checkpoints' steps and, in a run folder (not a bare --checkpoint-dir),
  its metrics records."""
  steps, unfinished = finalized_steps(checkpoint_dir), unfinished_saves(checkpoint_dir)
  parts = [f"checkpoint steps {steps}" if steps else "no checkpoints"]
  if unfinished:
    parts.append(f"unfinished saves {', '.join(unfinished)}")
  if run_folder:
    parts.append(f"metrics.jsonl with {metrics_records(folder)} records")
  return "; ".join(parts)


def describe(folder, checkpoint_dir=None, run_folder: bool = True) -> str:
  """What a run folder (or, not ``run_folder``, a bare --checkpoint-dir)
  holds, in a few words (for error messages)."""
  folder = pathlib.Path(folder)
  checkpoint_dir = folder / "checkpoints" if checkpoint_dir is None else checkpoint_dir
  if not folder.exists() and not epath.Path(checkpoint_dir).exists():
    return f"{folder} (does not exist)"
  return f"{folder} ({_contents(folder, checkpoint_dir, run_folder)})"


def newest_resumable(root: pathlib.Path = RUNS) -> pathlib.Path:
  """The newest ``root/lm-*`` folder holding a finalized checkpoint.

  Raises UsageError listing every run folder found when none has one.
  """
  folders = sorted(p for p in root.glob("lm-*") if p.is_dir())  # names start with the time
  for folder in reversed(folders):
    if finalized_steps(folder / "checkpoints"):
      return folder
  found = "; ".join(describe(f) for f in folders) if folders else f"no {root}/lm-* folders"
  raise UsageError(f"--resume: nothing to resume in {os.path.abspath(root)}: found {found}."
                   " Start without --resume, name the run with --out, or use --resume auto"
                   " to start fresh when there is nothing to resume")


def _check_writable(flag: str, path: str) -> None:
  if "://" not in path and os.path.exists(path) and not os.access(path, os.W_OK | os.X_OK):
    raise UsageError(f"{flag} {path}: not writable (the job writes metrics and checkpoints"
                     " there); make it writable or name another folder")


def set_aside_logs(folder, is_main: bool = True) -> list[str]:
  """Renames each of the run's log files (``LOGS``) of an earlier start in ``folder`` to
  ``<name>.before-<n>.jsonl``, one ``n`` for all (nothing is deleted); returns the new names.
  Only ``is_main`` renames."""
  folder = pathlib.Path(folder)
  found = [name for name in LOGS if (folder / name).exists()]
  if not found:
    return []
  for n in range(1, 1000):
    kept = {name: name.replace(".jsonl", f".before-{n}.jsonl") for name in found}
    if not any((folder / new).exists() for new in kept.values()):
      if is_main:
        for name, new in kept.items():
          (folder / name).rename(folder / new)
      return list(kept.values())
  raise UsageError(f"{folder}: 999 earlier metrics files; pass another --out")


def _fresh_note(args: argparse.Namespace, is_main: bool) -> str | None:
  """A fresh start in an existing folder: its earlier log files set aside (``set_aside_logs``);
  the line that says so (and, with ``--resume auto``, that it starts fresh)."""
  kept = set_aside_logs(args.out, is_main)
  files = f"the earlier run's log files kept as {', '.join(kept)}"
  if args.resume == "auto":
    note = f"--resume auto: no checkpoint in {args.checkpoint_dir}: starting fresh"
    return note + (f" ({files})" if kept else "")
  return f"starting fresh in {args.out} ({files})" if kept else None


def _resolve_default_out(args: argparse.Namespace) -> tuple[bool, str | None, list[str]]:
  """Sets ``args.out`` (and ``args.checkpoint_dir`` in it) when neither is given: the newest
  resumable run, or a new folder; (resume?, note, the folders created)."""
  if args.resume:
    try:
      args.out = str(newest_resumable())
      args.checkpoint_dir = os.path.join(args.out, "checkpoints")
      args.out_is_newest_run = True
      return True, None, []
    except UsageError:
      if args.resume == "required":
        raise
  path, created = claim_new(new_name())
  args.out = str(path)
  args.checkpoint_dir = os.path.join(args.out, "checkpoints")
  note = f"--resume auto: nothing to resume in {RUNS}/: starting fresh in {args.out}"
  return False, note if args.resume else None, created


def _check_contents(args: argparse.Namespace, steps: list[int]) -> None:
  """Raises UsageError when the folder does not fit --resume (read only)."""
  is_run = args.out is not None  # a run folder, not a bare --checkpoint-dir
  holder = args.out if is_run else args.checkpoint_dir  # named in messages
  apart = is_run and not _inside(args.checkpoint_dir, args.out)  # --checkpoint-dir elsewhere
  if args.resume == "required" and not steps:
    found = (f"--checkpoint-dir {describe(args.checkpoint_dir, args.checkpoint_dir, False)}"
             if apart else describe(holder, args.checkpoint_dir, is_run))
    raise UsageError(f"--resume: nothing to resume: {found}."
                     " Start without --resume, or use --resume auto to start fresh when"
                     " there is no checkpoint")
  if args.resume and apart:
    _refuse_another_runs_folder(args, steps)
  if not args.resume and (steps or (is_run and metrics_records(args.out))):
    contents = _contents(pathlib.Path(holder), args.checkpoint_dir, is_run)
    raise UsageError(f"{'--out' if is_run else '--checkpoint-dir'} {holder} already holds a"
                     f" run ({contents}): pass --resume to continue it, or choose another"
                     " --out or --checkpoint-dir to start afresh")


def _refuse_another_runs_folder(args: argparse.Namespace, steps: list[int]) -> None:
  """Raises UsageError when --out holds another run than the --checkpoint-dir (elsewhere) a
  --resume continues or, with --resume auto, starts afresh in: runs told apart by what they
  record, --out's own checkpoints and the folder the checkpoints' run saved as its --out."""
  own = finalized_steps(pathlib.Path(args.out) / "checkpoints")
  records = metrics_records(args.out)
  if not steps and own:
    raise UsageError(f"--resume auto: --out {describe(args.out)} holds a run, and"
                     f" --checkpoint-dir {args.checkpoint_dir} holds no checkpoint to continue it:"
                     f" pass --checkpoint-dir {os.path.join(args.out, 'checkpoints')} to continue"
                     " it, or choose another --out to start afresh")
  saved = saved_config(args.checkpoint_dir) if steps and records else None
  run_out = saved and saved[0].get("out")
  if isinstance(run_out, str) and os.path.realpath(run_out) != os.path.realpath(args.out):
    raise UsageError(f"--resume: --out {describe(args.out)} holds the metrics of another run than"
                     f" the checkpoints in --checkpoint-dir {args.checkpoint_dir} (written by the"
                     f" run in {run_out}): pass --out {run_out}, or a new folder, to continue"
                     " that run without mixing the two")


def _check_fits(args: argparse.Namespace, steps: list[int], own=(), locks: bool = True) -> None:
  """``_check_contents``; where the folder does not fit and (``locks``) a live run other than
  this one (whose lock files are ``own``) holds it, that it is in use instead: what was found
  may be that run's, started a moment ago; --resume onto a live run is never advised."""
  try:
    _check_contents(args, steps)
  except UsageError:
    if locks:
      refuse_if_in_use(args, own)
    raise


def _make(flag: str, path: str) -> list[str]:
  """Creates the folder ``path`` and the missing folders above it; those it created."""
  try:
    return _make_folders(pathlib.Path(path))
  except OSError as e:
    raise UsageError(f"{flag} {path}: cannot create it ({e.strerror})") from None


def _out_named(args: argparse.Namespace) -> tuple[str, str | None]:
  """How messages name --out and the remedy they give (None: choose another --out): the
  newest run where --resume found it."""
  if args.out_is_newest_run:
    return ("--resume: the newest run",
            "pass --out naming the run to resume, or a new folder to start afresh")
  return "--out", None


def _locks(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
  """(how messages name it, folder, the remedy they give or None) of each folder to lock:
  --out, and --checkpoint-dir when it lies elsewhere (local paths only: a bucket has no lock
  file)."""
  named, fix = _out_named(args)
  triples = [(named, args.out, fix)]
  if "://" not in args.checkpoint_dir and not _inside(args.checkpoint_dir, args.out):
    triples.append(("--checkpoint-dir", args.checkpoint_dir, None))
  return triples


def _inside(checkpoint_dir: str, out: str) -> bool:
  """Whether ``checkpoint_dir`` is ``out`` or lies under it (``out``'s lock covers it)."""
  checkpoint_dir, out = os.path.abspath(checkpoint_dir), os.path.abspath(out)
  return checkpoint_dir == out or checkpoint_dir.startswith(out + os.sep)


def refuse_if_in_use(args: argparse.Namespace, own=()) -> None:
  """Raises UsageError when a live run other than this one (whose lock files are ``own``) holds
  a folder of the arguments as given (``run_lock``): --out or, not given, ``RUNS`` (where the
  run folder goes then), and --checkpoint-dir. Reads only."""
  if args.out is None:
    run_lock.refuse_if_inside(_DEFAULT_PLACE, RUNS, own)
  else:
    named, fix = _out_named(args)
    run_lock.refuse_if_held(named, args.out, own, fix)
    if args.checkpoint_dir and _inside(args.checkpoint_dir, args.out):
      return  # --out's check covered it (a lock taken between the two was named --checkpoint-dir)
  run_lock.refuse_if_held("--checkpoint-dir", args.checkpoint_dir, own)


class Claim:
  """What a run holds of its folders: ``locks`` (``run_lock.RunLock``) and ``created``, the
  folders it created, outermost first. ``taken``: ``take`` is done; ``settled``: ``prepare``
  is (the run starts); ``trained``: a step was trained (what the run wrote is kept);
  ``default``: (resumed?, note) where no --out or --checkpoint-dir was given."""

  def __init__(self):
    self.locks, self.created = [], []
    self.taken = self.settled = self.trained = self._aborted = False
    self.default = None

  def adopt(self, folder: str) -> None:
    """Counts ``folder`` as created by this run (another process of it may have made it)."""
    if os.path.realpath(folder) not in map(os.path.realpath, self.created):
      self.created.append(folder)

  def remove(self, written: bool = False) -> list[str]:
    """Removes what this run created and releases its locks: each folder created, innermost
    first, when empty once its lock is released; with ``written``, also what this run wrote in
    the folders it created and locked (nobody else writes there). Returns the folders removed,
    innermost first. A lock refused, a failure before the run started and a signal before
    step 1 all end here: nothing created is left."""
    mine = {os.path.realpath(lock.path.parent): lock for lock in self.locks}
    removed = []
    for folder in reversed(self.created):
      lock = mine.pop(os.path.realpath(folder), None)
      if lock is not None:
        if written:
          _remove_contents(folder, keep=lock.path.name)
        lock.release()
      if _remove_folders([folder]):
        removed.append(folder)
    for lock in mine.values():
      lock.release()
    self.locks, self.created = [], [f for f in self.created if f not in removed]
    return removed

  def abort(self) -> str | None:
    """What a second signal leaves (``stop.StopRequest.on_abort``): before the run trained a
    step (``trained``, set by the job), what it created is removed, what it wrote there too,
    as a signal before step 1 removes it; the line saying so (None once a step was trained:
    the locks released, the rest kept). Done once."""
    if self._aborted:
      return None
    self._aborted = True
    if self.trained:
      self.end()
      return None
    removed = self.remove(written=True)
    return ("no step was trained; " + (f"removed the folders it created: {', '.join(removed)}"
                                       if removed else "it had created no folder"))

  def end(self) -> None:
    """At the end of the run: releases the locks; where the run never started (not
    ``settled``), removes the folders it created too. Done once; calling it again does
    nothing."""
    if self.settled:
      for lock in self.locks:
        lock.release()
      self.locks = []
    else:
      self.remove()


def _remove_contents(folder: str, keep: str) -> None:
  """Removes everything in ``folder`` but the entry ``keep``."""
  for entry in os.scandir(folder):
    if entry.name == keep:
      continue
    if entry.is_dir(follow_symlinks=False):
      shutil.rmtree(entry.path, ignore_errors=True)
    else:
      with contextlib.suppress(OSError):
        os.unlink(entry.path)


def _remove_folders(created: list[str]) -> list[str]:
  """Removes the folders ``created`` (outermost first) that are empty, innermost first; those
  removed (a folder another run wrote into is kept)."""
  removed = []
  for folder in reversed(created):
    try:
      os.rmdir(folder)
      removed.append(folder)
    except OSError:
      pass
  return removed


def _hold(args: argparse.Namespace, default_out: bool, say, claim: Claim) -> None:
  """Takes the run's locks into ``claim``, creating their folders; then, with them held, refuses
  a folder locked that another live run holds, lies in or holds (``run_lock.refuse_if_held``),
  and with ``default_out`` (no --out given) ``RUNS`` in another run's folder. Of two runs
  starting at once whose folders nest, the later to take its lock sees the other's. The
  caller removes what ``claim`` holds on failure."""
  locks = _locks(args)
  for flag, folder, fix in locks:
    claim.created += _make(flag, folder)
    claim.locks.append(run_lock.RunLock.acquire(folder, flag, warn=say, fix=fix))
  own = [lock.path for lock in claim.locks]
  if default_out:
    run_lock.refuse_if_inside(_DEFAULT_PLACE, RUNS, own)
  for flag, folder, fix in locks:
    run_lock.refuse_if_held(flag, folder, own, fix)


def _claim_given(args: argparse.Namespace, is_main: bool) -> list[str]:
  """Checks the folders given against the arguments (read only; ``is_main``: a folder a live
  run holds is in use, whatever it holds), then, with --checkpoint-dir alone, creates a new
  run folder (``claim_new``); the folders created."""
  if args.checkpoint_dir is None:
    args.checkpoint_dir = os.path.join(args.out, "checkpoints")
  if args.out is not None:
    _check_writable("--out", args.out)
  _check_writable("--checkpoint-dir", args.checkpoint_dir)
  if is_main:
    refuse_if_in_use(args)
  _check_fits(args, finalized_steps(args.checkpoint_dir), locks=is_main)  # nothing created yet
  if args.out is not None:
    return []
  path, created = claim_new(new_name())
  args.out = str(path)
  return created


def _settle(args: argparse.Namespace, is_main: bool, claim: Claim) -> tuple[bool, str | None]:
  """(resume?, note) of the folders given, checked again now that no other run can change
  them; a fresh start sets the earlier log files aside (``set_aside_logs``); creates the run
  folder."""
  steps = finalized_steps(args.checkpoint_dir)
  _check_fits(args, steps, [lock.path for lock in claim.locks], locks=is_main)
  note = None if steps else _fresh_note(args, is_main)
  claim.created += _make("--out", args.out)
  return bool(steps), note


def take(args: argparse.Namespace, is_main: bool = True, say=print, lock: bool = True,
         claim: Claim | None = None) -> Claim:
  """Sets ``args.out`` and ``args.checkpoint_dir``, checks the folders against the arguments
  (read only), creates them and, with ``lock`` and ``is_main``, takes their locks; returns what
  the run holds (``claim``, else a new ``Claim``). Restores nothing and imports no jax: a
  single-process run calls it first (``launch/train.py``), so a second run on its folder is
  refused at once. Raises UsageError (StorageError where a lock file cannot be written), with
  nothing left created."""
  claim = Claim() if claim is None else claim
  default_out = args.out is None
  try:
    if default_out and args.checkpoint_dir is None:
      if is_main:
        refuse_if_in_use(args)
      resumed, note, created = _resolve_default_out(args)
      claim.created += created
      claim.default = resumed, note
    else:
      claim.created += _claim_given(args, is_main)
    if lock and is_main:
      _hold(args, default_out, say, claim)
  except Exception:
    claim.remove()
    raise
  claim.taken = True
  return claim


def prepare(args: argparse.Namespace, is_main: bool = True, held=None, say=print,
            claim: Claim | None = None) -> tuple[bool, str | None]:
  """Settles the run folder for the checked arguments; returns (resume?, note).

  Sets ``args.out`` and ``args.checkpoint_dir`` and creates the run folder;
  call it only once every argument and the mesh are known to be good. Takes the
  folders first (``take``) unless ``claim`` was taken already (the caller then
  ends it: ``Claim.end``); with ``held`` (a ``contextlib.ExitStack``) and
  ``is_main``, the lock of the run folder (and of a --checkpoint-dir outside it)
  is taken before anything in it is read or changed, released when ``held``
  closes (launch/run_lock.py). A fresh start in an existing folder sets its
  earlier log files aside (``set_aside_logs``). Raises UsageError (nothing left
  created or changed) when the folder does not fit the arguments: ``--resume``
  with no checkpoint, a fresh start into a folder that holds a run, a folder that
  is not writable, a folder another run holds, lies in or holds.
  """
  if claim is None:
    claim = Claim()
    if held is not None:
      held.callback(claim.end)
  if not claim.taken:
    take(args, is_main, say, lock=held is not None, claim=claim)
  try:
    resumed, note = (claim.default if claim.default is not None
                      else _settle(args, is_main, claim))
  except Exception:
    claim.remove()
    raise
  claim.settled = True
  return resumed, note
