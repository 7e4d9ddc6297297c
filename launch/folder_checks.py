"""Whether a run's folders fit its arguments, read only: writable, holding what --resume (or a
fresh start) needs, not another run's, not held by a live run (launch/run_lock.py).

Each failure is a ``UsageError`` naming the flag. Nothing here imports jax, so
``refuse_if_in_use`` runs before jax starts (launch/train.py, the local launcher).
"""

import argparse
import os
import pathlib

from launch import run_contents
from launch import run_lock
from launch.errors import UsageError

__all__ = ["DEFAULT_PLACE", "check_fits", "check_writable", "folders_to_lock",
           "refuse_if_in_use"]

DEFAULT_PLACE = f"{run_contents.RUNS} (where a run without --out goes)"  # named when in use


def check_writable(flag: str, path: str) -> None:
  """Raises UsageError when the local folder ``path`` exists and is not writable."""
  if "://" not in path and os.path.exists(path) and not os.access(path, os.W_OK | os.X_OK):
    raise UsageError(f"{flag} {path}: not writable (the job writes metrics and checkpoints"
                     " there); make it writable or name another folder")


def _check_contents(args: argparse.Namespace, steps: list[int]) -> None:
  """Raises UsageError when the folder does not fit --resume (read only)."""
  is_run = args.out is not None  # a run folder, not a bare --checkpoint-dir
  holder = args.out if is_run else args.checkpoint_dir  # named in messages
  # --checkpoint-dir elsewhere:
  apart = is_run and not run_contents.inside(args.checkpoint_dir, args.out)
  if is_run:
    run_contents.refuse_a_record_that_is_no_file(args.out)
  if args.resume and not steps and is_run:
    _refuse_a_recorded_folder_gone(args)
  if args.resume == "auto" and not steps and is_run:
    _refuse_leaving_the_runs_checkpoints(args)
  if args.resume == "required" and not steps:
    found = (f"--checkpoint-dir"
             f" {run_contents.describe(args.checkpoint_dir, args.checkpoint_dir, False)}"
             if apart else run_contents.describe(holder, args.checkpoint_dir, is_run))
    raise UsageError(f"--resume: nothing to resume: {found}."
                     " Start without --resume, or use --resume auto to start fresh when"
                     " there is no checkpoint")
  if args.resume and apart and steps:
    _refuse_another_runs_checkpoints(args)
  if args.resume and steps and is_run:
    _refuse_a_gap_in_the_metrics(args)
  if not args.resume and (steps or (is_run and run_contents.metrics_records(args.out))):
    contents = run_contents.contents(pathlib.Path(holder), args.checkpoint_dir, is_run)
    raise UsageError(f"{'--out' if is_run else '--checkpoint-dir'} {holder} already holds a"
                     f" run ({contents}): pass --resume to continue it, or choose another"
                     " --out or --checkpoint-dir to start afresh")


def _refuse_a_recorded_folder_gone(args: argparse.Namespace) -> None:
  """Raises UsageError when a resume's checkpoint folder is the one --out's run recorded
  (``run_contents.record_checkpoint_dir``) and it is gone: moved or deleted, not a run
  that never saved (the job creates the folder before its first step)."""
  recorded = _recorded(args.out)
  if (recorded is not None and "://" not in recorded and not os.path.exists(recorded)
      and run_contents.same_folder(recorded, args.checkpoint_dir)):
    record = os.path.join(args.out, run_contents.CHECKPOINT_DIR_RECORD)
    raise UsageError(f"--resume: the run in {args.out} keeps its checkpoints in {recorded}"
                     f" ({record}), which does not exist: pass --checkpoint-dir naming where"
                     " they are now, or another --out to start afresh")


def _refuse_a_gap_in_the_metrics(args: argparse.Namespace) -> None:
  """Raises UsageError when --out's metrics end before the newest checkpoint a resume restores:
  another run folder continued those checkpoints (the job writes a step's metrics before it
  saves the step), and resuming here would leave its steps out of this run's metrics."""
  last = run_contents.last_metrics_step(args.out)
  saved = run_contents.saved_config(args.checkpoint_dir)
  if last is None or saved is None or saved[1] <= last:
    return
  run_out = saved[0].get("out")
  by = f" (saved by the run in {run_out})" if isinstance(run_out, str) else ""
  raise UsageError(f"--resume: the metrics in --out {args.out} end at step {last}, but"
                   f" {_named(args)} holds step {saved[1]}{by}: another run continued them,"
                   f" and resuming here would leave steps {last + 1}-{saved[1]} out of these"
                   " metrics. Resume that run's folder, or choose a new --out")


def _recorded(folder: str) -> str | None:
  """The checkpoint folder the run in ``folder`` recorded; None where there is no record, or
  one that does not read (a resume given --checkpoint-dir writes it anew; one without the
  flag was refused naming it: launch/flags.py)."""
  try:
    return run_contents.recorded_checkpoint_dir(folder)
  except UsageError:
    return None


def _records(folder: str, checkpoint_dir: str) -> bool:
  """Whether the run in ``folder`` recorded ``checkpoint_dir`` as its checkpoint folder."""
  recorded = _recorded(folder)
  return recorded is not None and run_contents.same_folder(recorded, checkpoint_dir)


def _named(args: argparse.Namespace) -> str:
  """The checkpoint folder as messages name it: the flag, and the record where --out's run
  recorded it."""
  if _records(args.out, args.checkpoint_dir):
    return (f"--checkpoint-dir {args.checkpoint_dir} (recorded in"
            f" {os.path.join(args.out, run_contents.CHECKPOINT_DIR_RECORD)})")
  return f"--checkpoint-dir {args.checkpoint_dir}"


def _refuse_leaving_the_runs_checkpoints(args: argparse.Namespace) -> None:
  """Raises UsageError when --resume auto's checkpoint folder holds no step while --out's run
  keeps steps in another (the folder it recorded, or ``checkpoints_in``): --resume auto would start
  afresh in --out and record the empty folder in place of the run's."""
  recorded = _recorded(args.out)
  homes = [*([recorded] if recorded else []), run_contents.checkpoints_in(args.out)]
  own = [home for home in homes if run_contents.finalized_steps(home)
         and not run_contents.same_folder(home, args.checkpoint_dir)]
  if own:
    raise UsageError(f"--resume auto: --out {run_contents.describe(args.out)} holds a run, and"
                     f" {_named(args)} holds no checkpoint to continue it:"
                     f" pass --checkpoint-dir {own[0]} to continue it, or choose another --out"
                     " to start afresh")


def _refuse_another_runs_checkpoints(args: argparse.Namespace) -> None:
  """Raises UsageError when --out holds the metrics of another run than the one whose
  checkpoints (elsewhere) a --resume continues: the checkpoints' run saved another folder as
  its --out, and ``out`` is not that folder moved (``_moved_here``)."""
  saved = run_contents.saved_config(args.checkpoint_dir)
  run_out = saved and saved[0].get("out")
  if (run_contents.metrics_records(args.out) and isinstance(run_out, str)
      and os.path.realpath(run_out) != os.path.realpath(args.out)
      and not _moved_here(args.out, args.checkpoint_dir, run_out)):
    raise UsageError(f"--resume: --out {run_contents.describe(args.out)} holds the metrics of"
                     f" another run than the checkpoints in {_named(args)}"
                     f" (written by the run in {run_out}): pass --out"
                     f" {run_out}, or a new folder, to continue that run without mixing the two")


def _moved_here(out: str, checkpoint_dir: str, run_out: str) -> bool:
  """Whether ``out`` is the run folder the checkpoints' run saved as ``run_out``, moved: ``out``
  records ``checkpoint_dir`` as its checkpoint folder and ``run_out`` does not (it is gone,
  or its run records another folder)."""
  return _records(out, checkpoint_dir) and not _records(run_out, checkpoint_dir)


def check_fits(args: argparse.Namespace, steps: list[int], own=(), locks: bool = True) -> None:
  """``_check_contents``; where the folder does not fit and (``locks``) a live run other than
  this one (whose lock files are ``own``) holds it, that it is in use instead: what was found
  may be that run's, started a moment ago; --resume onto a live run is never advised."""
  try:
    _check_contents(args, steps)
  except UsageError:
    if locks:
      refuse_if_in_use(args, own)
    raise


def _out_named(args: argparse.Namespace) -> tuple[str, str | None]:
  """How messages name --out and the remedy they give (None: choose another --out): the
  newest run where --resume found it."""
  if args.out_is_newest_run:
    return ("--resume: the newest run",
            "pass --out naming the run to resume, or a new folder to start afresh")
  return "--out", None


def folders_to_lock(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
  """(how messages name it, folder, the remedy they give or None) of each folder to lock:
  --out, and --checkpoint-dir when it lies elsewhere (local paths only: a bucket has no lock
  file)."""
  named, fix = _out_named(args)
  triples = [(named, args.out, fix)]
  if "://" not in args.checkpoint_dir and not run_contents.inside(args.checkpoint_dir, args.out):
    triples.append(("--checkpoint-dir", args.checkpoint_dir, None))
  return triples


def refuse_if_in_use(args: argparse.Namespace, own=()) -> None:
  """Raises UsageError when a live run other than this one (whose lock files are ``own``) holds
  a folder of the arguments as given (``run_lock``): --out or, not given, ``RUNS`` (where the
  run folder goes then), and --checkpoint-dir. Reads only."""
  if args.out is None:
    run_lock.refuse_if_inside(DEFAULT_PLACE, run_contents.RUNS, own)
  else:
    named, fix = _out_named(args)
    run_lock.refuse_if_held(named, args.out, own, fix)
    if args.checkpoint_dir and run_contents.inside(args.checkpoint_dir, args.out):
      return  # --out's check covered it (a lock taken between the two was named --checkpoint-dir)
  run_lock.refuse_if_held("--checkpoint-dir", args.checkpoint_dir, own)
