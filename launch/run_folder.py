"""Where a run lives: its folder, what an existing folder holds, which one to resume.

Nothing here imports jax or orbax, so the local launcher can use it. A step
of a checkpoint folder is finalized when its directory has an integer name
(Orbax writes into ``<step>.orbax-checkpoint-tmp-*`` and renames it when the
save is complete).
"""

import argparse
import os
import pathlib
import time

from etils import epath

from launch import run_lock
from launch.cli import UsageError
from launch.cli import blocking_part

__all__ = ["RUNS", "claim_new", "describe", "finalized_steps", "metrics_records",
           "new_name", "newest_resumable", "prepare", "refuse_if_in_use", "set_aside_metrics",
           "unfinished_saves"]

RUNS = pathlib.Path("runs")
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
      _undo([], created)
      raise UsageError(f"cannot create the run folder {path} ({e.strerror}); pass --out") from None
  raise UsageError(f"{base}: 999 run folders of that name exist already; pass --out")


def finalized_steps(checkpoint_dir) -> list[int]:
  """Steps of the finalized checkpoints in ``checkpoint_dir``, ascending."""
  path = epath.Path(checkpoint_dir)  # also gs:// and other URLs
  if not path.is_dir():
    return []
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir())


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


def set_aside_metrics(folder, is_main: bool = True) -> str | None:
  """Renames ``folder/metrics.jsonl`` of an earlier start to
  ``metrics.before-<n>.jsonl`` (nothing is deleted); returns the new name, or
  None when there is no such file. Only ``is_main`` renames."""
  metrics = pathlib.Path(folder) / "metrics.jsonl"
  if not metrics.exists():
    return None
  for n in range(1, 1000):
    kept = metrics.with_name(f"metrics.before-{n}.jsonl")
    if not kept.exists():
      if is_main:
        metrics.rename(kept)
      return kept.name
  raise UsageError(f"{metrics.parent}: 999 earlier metrics files; pass another --out")


def _fresh_into_existing(args: argparse.Namespace, is_main: bool) -> str:
  """``--resume auto`` with no checkpoint in an existing --out: start fresh, say so."""
  note = f"--resume auto: no checkpoint in {args.checkpoint_dir}: starting fresh"
  kept = set_aside_metrics(args.out, is_main)
  return note + (f" (earlier metrics kept as {kept})" if kept else "")


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
  if args.resume == "required" and not steps:
    found = describe(holder, args.checkpoint_dir, is_run)
    raise UsageError(f"--resume: nothing to resume: {found}."
                     " Start without --resume, or use --resume auto to start fresh when"
                     " there is no checkpoint")
  if not args.resume and (steps or (is_run and metrics_records(args.out))):
    contents = _contents(pathlib.Path(holder), args.checkpoint_dir, is_run)
    raise UsageError(f"{'--out' if is_run else '--checkpoint-dir'} {holder} already holds a"
                     f" run ({contents}): pass --resume to continue it, or choose another"
                     " --out or --checkpoint-dir to start afresh")


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
  out, checkpoint_dir = os.path.abspath(args.out), os.path.abspath(args.checkpoint_dir)
  named, fix = _out_named(args)
  triples = [(named, args.out, fix)]
  inside = checkpoint_dir == out or checkpoint_dir.startswith(out + os.sep)
  if "://" not in args.checkpoint_dir and not inside:
    triples.append(("--checkpoint-dir", args.checkpoint_dir, None))
  return triples


def refuse_if_in_use(args: argparse.Namespace) -> None:
  """Raises UsageError when another live run holds a folder of the arguments as given
  (``run_lock``): --out or, not given, ``RUNS`` (where the run folder goes then), and
  --checkpoint-dir. Reads only: the check before the job imports jax."""
  if args.out is None:
    run_lock.refuse_if_inside(_DEFAULT_PLACE, RUNS)
  else:
    named, fix = _out_named(args)
    run_lock.refuse_if_held(named, args.out, fix=fix)
  run_lock.refuse_if_held("--checkpoint-dir", args.checkpoint_dir)


def _hold(args: argparse.Namespace, default_out: bool,
          say) -> tuple[list[run_lock.RunLock], list[str]]:
  """Takes the run's locks, creating their folders: (locks, folders created); then, with them
  held, refuses a folder locked that another live run holds, lies in or holds
  (``run_lock.refuse_if_held``), and with ``default_out`` (no --out given) ``RUNS`` in another
  run's folder. Of two runs starting at once whose folders nest, the later to take its lock
  sees the other's. On failure releases what it took and removes the folders it created."""
  taken, created = [], []
  locks = _locks(args)
  try:
    for flag, folder, fix in locks:
      created += _make(flag, folder)
      taken.append(run_lock.RunLock.acquire(folder, flag, warn=say, fix=fix))
    own = [lock.path for lock in taken]
    if default_out:
      run_lock.refuse_if_inside(_DEFAULT_PLACE, RUNS, own)
    for flag, folder, fix in locks:
      run_lock.refuse_if_held(flag, folder, own, fix)
  except UsageError:
    _undo(taken, created)
    raise
  return taken, created


def _undo(taken: list, created: list[str]) -> None:
  """Releases the locks ``taken`` and removes the folders ``created`` (outermost first) that
  are still empty."""
  for lock in taken:
    lock.release()
  for folder in reversed(created):
    try:
      os.rmdir(folder)
    except OSError:
      pass  # not empty: another run wrote into it


def _claim_given(args: argparse.Namespace) -> list[str]:
  """Checks the folders given against the arguments (read only), then, with --checkpoint-dir
  alone, creates a new run folder (``claim_new``); the folders created."""
  if args.checkpoint_dir is None:
    args.checkpoint_dir = os.path.join(args.out, "checkpoints")
  if args.out is not None:
    _check_writable("--out", args.out)
  _check_writable("--checkpoint-dir", args.checkpoint_dir)
  _check_contents(args, finalized_steps(args.checkpoint_dir))  # before anything is created
  if args.out is not None:
    return []
  path, created = claim_new(new_name())
  args.out = str(path)
  return created


def _settle(args: argparse.Namespace, is_main: bool) -> tuple[bool, str | None]:
  """(resume?, note) of the folders given, checked again now that no other run can change
  them; creates the run folder."""
  steps = finalized_steps(args.checkpoint_dir)
  _check_contents(args, steps)
  note = _fresh_into_existing(args, is_main) if args.resume == "auto" and not steps else None
  _make("--out", args.out)
  return bool(steps), note


def prepare(args: argparse.Namespace, is_main: bool = True, held=None,
            say=print) -> tuple[bool, str | None]:
  """Settles the run folder for the checked arguments; returns (resume?, note).

  Sets ``args.out`` and ``args.checkpoint_dir`` and creates the run folder;
  call it only once every argument and the mesh are known to be good. With
  ``held`` (a ``contextlib.ExitStack``) and ``is_main``, takes the lock of the
  run folder (and of a --checkpoint-dir outside it) before anything in it is
  read or changed, released when ``held`` closes (launch/run_lock.py). Raises
  UsageError (nothing left created or changed) when the folder does not fit the
  arguments: ``--resume`` with no checkpoint, a fresh start into a folder that
  holds a run, a folder that is not writable, a folder another run holds, lies
  in or holds.
  """
  default_out = args.out is None
  default = default_out and args.checkpoint_dir is None
  if default:
    resumed, note, created = _resolve_default_out(args)
  else:
    created = _claim_given(args)
  taken = []
  try:
    if held is not None and is_main:
      taken, made = _hold(args, default_out, say)
      created += made
    if not default:
      resumed, note = _settle(args, is_main)
  except UsageError:
    _undo(taken, created)
    raise
  if held is not None:
    held.callback(_undo, taken, [])
  return resumed, note
