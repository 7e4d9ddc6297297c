"""The training job behind ``python -m launch.train`` (imports jax: the caller
sets XLA_FLAGS first).

One run: join the other processes (if any: launch/processes.py), build the mesh,
shard the model's params by a partition-rule preset and the optimizer state by
shardopt's derived shardings (ZeRO over the data axis on request:
launch/training_setup.py), all checked before the run folder is settled and
created (launch/validation.py, launch/run_folder.py); restore the newest intact
checkpoint on --resume after comparing the saved flags (launch/resume.py), then
train with deterministic batches of the training slice of the corpus,
checkpointing every --checkpoint-every steps (never a non-finite state:
launch/train_loop.py). Every --eval-every steps the loss on the held-out slice
is computed, every --sample-every steps (and at the end) a greedy sample is
printed (launch/held_out.py); each step's loss and norms are fetched every
--log-every steps and written with the step time, tokens/s and MFU
(launch/metrics.py). SIGTERM/SIGINT stop it cleanly: every process agrees on the
step to stop at, the checkpoint in flight is finished, the current state is
saved and the job exits 0 (before step 1 of a new run, what the run created is
removed: the run folder, the folders above it and a --checkpoint-dir it made; a
second signal ends it at once, removing them too before step 1: launch/stop.py).
The log files of a resumed run are checked before the restore and trimmed only
once a new step is trained. The run folder is locked for the whole run
(launch/run_lock.py; a single-process run took it before importing jax:
``run_folder.take``); library log lines go to OUT/job.log; a write the storage
refuses ends the job with one line naming the path and the newest complete
checkpoint (``cli.StorageError``).
"""

import argparse
import contextlib
import os
import pathlib

import jax
from jax.experimental import multihost_utils
import numpy as np

from launch import cli
from launch import job_log
from launch import report
from launch import run_config
from launch import run_contents
from launch import run_folder
from launch import training_setup
from launch.held_out import HeldOut
from launch.processes import init_distributed
from launch.processes import say
from launch.run_claim import Claim
from launch.run_claim import missing_folders
from launch.stop import StopRequest
from launch.train_loop import restore_and_train
from launch.train_loop import storage_error
from launch.validation import NonFiniteGuard
from launch.validation import blame_values
from launch.validation import checked_flags
from launch.validation import checked_mesh

__all__ = ["run"]


def _agreed(failure: Exception | None) -> None:
  """Every process stops when one of them could not settle the run folder (process 0 alone
  takes its lock): the process that failed raises its error, the others one naming it."""
  failed = np.array(failure is not None)
  if jax.process_count() > 1:
    failed = np.reshape(multihost_utils.process_allgather(failed), -1)
  if failure is not None:
    raise failure
  if np.any(failed):
    bad = [int(i) for i in np.flatnonzero(failed)]
    raise cli.UsageError(f"process(es) {bad} could not settle the run folder (see their error)")


def _stopped_before_training(args, signum: int, start: int, resumed: bool, claim: Claim) -> str:
  """What a signal that came before the first step leaves: what this run created is removed
  (``Claim.remove``: the new run folder, the folders made for it and its --checkpoint-dir)."""
  where = f"stopped by signal {signum} before step {start + 1}"
  if resumed:
    return f"{where}: nothing trained or saved; {args.out} is as it was (step {start})"
  removed = claim.remove(written=True) if jax.process_index() == 0 else []
  out = os.path.normpath(args.out)
  others = [folder for folder in removed if os.path.normpath(folder) != out]
  made = f"the folders created for it: {', '.join(others)}"
  if len(others) < len(removed):
    return (f"{where}: nothing trained; removed the new run folder {args.out}"
            + (f" and {made}" if others else ""))
  return (f"{where}: nothing trained; {args.out} holds no run (no checkpoint, no metrics):"
          f" a later run may use it" + (f"; removed {made}" if others else ""))


def run(args: argparse.Namespace, stop: StopRequest, claim: Claim | None = None) -> int:
  """Runs the job; the run folder's lock is held until it returns or raises (or a second
  signal ends the process). ``claim``: the folders a single-process run took before importing
  jax (``run_folder.take``); what it created is removed if the run ends before it starts."""
  claim = Claim() if claim is None else claim
  with contextlib.ExitStack() as held:
    held.callback(claim.end)
    stop.on_abort(held.close)
    stop.on_abort(claim.abort)  # first: before step 1, what the run created goes, as it wrote it
    return _run(args, stop, held, claim)


def _run(args: argparse.Namespace, stop: StopRequest, held: contextlib.ExitStack,
         claim: Claim) -> int:
  init_distributed(args)
  train_bytes, held_out, eval_batches = checked_flags(args)  # those of --print-config, first
  mesh = checked_mesh(args)
  model = training_setup.build_model(args)
  rules, specs, abstract = training_setup.param_layout(args, mesh, model)
  opt, abstract_state, step_fn = blame_values(  # every value checked before the run folder
      args, lambda given: training_setup.planned_step(given, model, abstract))
  evaluation = HeldOut(args, mesh, model, opt.param_shardings, held_out, eval_batches)
  # A multi-process run takes its folder below: which of --out and the folders above it are
  # new is seen by every process before the collective in agreed(), after which another
  # process may have created them; process 0 counts them all as the run's.
  new_folders = ([] if claim.taken or args.out is None else
                 [str(p) for p in missing_folders(pathlib.Path(os.path.normpath(args.out)))])
  failure = None
  if stop.agreed():  # what a claim taken before jax created is removed as the job returns
    say(f"stopped by signal {stop.signum or 'on another process'} before the run started:"
        " nothing was created")
    return 0
  try:
    resumed, note = run_folder.prepare(args, is_main=jax.process_index() == 0, held=held, say=say,
                                       claim=claim)
  except cli.UsageError as e:
    failure = e
  _agreed(failure)
  if jax.process_index() == 0:
    for folder in new_folders:
      claim.adopt(folder)
  out = pathlib.Path(args.out)
  held.callback(job_log.to_file(job_log.log_path(out, jax.process_index())))
  if note:
    say(note)
  config = run_config.config_of(args, jax.process_count(), jax.device_count())
  guard = NonFiniteGuard(args.skip_nonfinite, hint="Lower --lr or --clip-norm, or pass"
                         " --skip-nonfinite to skip such steps.")
  training_setup.describe(args, mesh, rules, specs, abstract, abstract_state, opt)
  try:
    step, start, stopped = restore_and_train(args, mesh, model, opt, step_fn, abstract,
                                             abstract_state, evaluation, resumed, config, guard,
                                             stop, train_bytes, claim)
    if stopped is not None and step == start:
      say(_stopped_before_training(args, stopped, start, resumed, claim))
      return 0
    metrics_path = out / "metrics.jsonl"
    if jax.process_index() == 0 and metrics_path.exists():
      report.plot_losses(metrics_path, out / "loss.png", run_config.title(out.name, config))
  except OSError as e:  # a write the storage refused (the loss curve's)
    raise storage_error(e, args, run_contents.newest_finalized(args.checkpoint_dir)) from e
  if stopped is not None:
    say(f"stopped by signal {stopped} after step {step}; checkpoint saved:"
        " run again with --resume to continue")
  else:
    say(f"done: {step} steps; metrics {metrics_path}, curve {out / 'loss.png'},"
        f" TensorBoard: tensorboard --logdir {out.parent}, checkpoints {args.checkpoint_dir}")
  return 0
