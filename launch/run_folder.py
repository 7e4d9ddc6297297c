"""Where a run lives: its folders taken, checked and settled (the newest resumable run where
none is named).

A run takes its folders in two parts: ``take`` checks them against the
arguments (read only, launch/folder_checks.py; a folder a live run holds is
reported in use first, whatever it holds), creates them and takes their locks
(launch/run_lock.py), a single-process run before it imports jax (its process
owns the folder); ``prepare`` settles them once every argument and the mesh
are checked. What a run holds is a ``run_claim.Claim``: its locks and the
folders it created, removed again by one mechanism (``Claim.remove``) wherever
the run ends before it started. What an existing folder holds is read by
launch/run_contents.py.

Nothing here imports jax or orbax: a single-process run takes its folders before jax starts.
"""

import argparse
import pathlib

from launch import folder_checks
from launch import run_contents
from launch import run_lock
from launch.errors import UsageError
from launch.run_claim import Claim
from launch.run_claim import claim_new
from launch.run_claim import make_folders
from launch.run_claim import new_name

__all__ = ["prepare", "set_aside_logs", "take"]


def set_aside_logs(folder, is_main: bool = True) -> list[str]:
  """Renames each of the run's log files (``LOGS``) of an earlier start in ``folder`` to
  ``<name>.before-<n>.jsonl``, one ``n`` for all (nothing is deleted); returns the new names.
  Only ``is_main`` renames."""
  folder = pathlib.Path(folder)
  found = [name for name in run_contents.LOGS if (folder / name).exists()]
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
      args.out = str(run_contents.newest_resumable())
      args.checkpoint_dir = run_contents.checkpoints_of(args.out)
      args.out_is_newest_run = True
      return True, None, []
    except UsageError:
      if args.resume == "required":
        raise
  path, created = claim_new(new_name())
  args.out = str(path)
  args.checkpoint_dir = run_contents.checkpoints_in(args.out)
  note = f"--resume auto: nothing to resume in {run_contents.RUNS}/: starting fresh in {args.out}"
  return False, note if args.resume else None, created


def _make(flag: str, path: str) -> list[str]:
  """Creates the folder ``path`` and the missing folders above it; those it created."""
  try:
    return make_folders(pathlib.Path(path))
  except OSError as e:
    raise UsageError(f"{flag} {path}: cannot create it ({e.strerror})") from None


def _hold(args: argparse.Namespace, default_out: bool, say, claim: Claim) -> None:
  """Takes the run's locks into ``claim``, creating their folders; then, with them held, refuses
  a folder locked that another live run holds, lies in or holds (``run_lock.refuse_if_held``),
  and with ``default_out`` (no --out given) ``RUNS`` in another run's folder. Of two runs
  starting at once whose folders nest, the later to take its lock sees the other's. The
  caller removes what ``claim`` holds on failure."""
  locks = folder_checks.folders_to_lock(args)
  for flag, folder, fix in locks:
    claim.created += _make(flag, folder)
    claim.locks.append(run_lock.RunLock.acquire(folder, flag, warn=say, fix=fix))
  own = [lock.path for lock in claim.locks]
  if default_out:
    run_lock.refuse_if_inside(folder_checks.DEFAULT_PLACE, run_contents.RUNS, own)
  for flag, folder, fix in locks:
    run_lock.refuse_if_held(flag, folder, own, fix)


def _claim_given(args: argparse.Namespace, is_main: bool) -> list[str]:
  """Checks the folders given against the arguments (read only; ``is_main``: a folder a live
  run holds is in use, whatever it holds), then, with --checkpoint-dir alone, creates a new
  run folder (``claim_new``); the folders created."""
  if args.checkpoint_dir is None:  # a resume continues where the run recorded its checkpoints
    args.checkpoint_dir = (run_contents.checkpoints_of if args.resume
                           else run_contents.checkpoints_in)(args.out)
  if args.out is not None:
    folder_checks.check_writable("--out", args.out)
  folder_checks.check_writable("--checkpoint-dir", args.checkpoint_dir)
  if is_main:
    folder_checks.refuse_if_in_use(args)
  folder_checks.check_fits(args, run_contents.finalized_steps(args.checkpoint_dir),
                           locks=is_main)  # nothing created yet
  if args.out is not None:
    return []
  path, created = claim_new(new_name())
  args.out = str(path)
  return created


def _settle(args: argparse.Namespace, is_main: bool, claim: Claim) -> tuple[bool, str | None]:
  """(resume?, note) of the folders given, checked again now that no other run can change
  them; a fresh start sets the earlier log files aside (``set_aside_logs``); creates the run
  folder and a --checkpoint-dir in it (a signal before step 1 removes both where new)."""
  steps = run_contents.finalized_steps(args.checkpoint_dir)
  folder_checks.check_fits(args, steps, [lock.path for lock in claim.locks], locks=is_main)
  note = None if steps else _fresh_note(args, is_main)
  claim.created += _make("--out", args.out)
  if "://" not in args.checkpoint_dir and run_contents.inside(args.checkpoint_dir, args.out):
    claim.created += _make("--checkpoint-dir", args.checkpoint_dir)
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
        folder_checks.refuse_if_in_use(args)
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
