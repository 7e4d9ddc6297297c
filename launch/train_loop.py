"""The job's training loop: the checkpoints opened, the state to start from (fresh from
--seed, or the newest intact checkpoint on --resume: launch/resume.py), then the steps to
--steps or a stop signal, the metrics fetched every --log-every steps (launch/metrics.py),
the held-out loss and samples (launch/held_out.py) and a checkpoint every
--checkpoint-every steps and at the end (never a non-finite state). The log files of a
resumed run are checked before the restore and trimmed only once a new step is trained.
Imports jax.
"""

import pathlib

import jax

import checkpoints
from checkpoints.failures import newest_phrase
from launch import cli
from launch import data
from launch import memory
from launch import metrics
from launch import report
from launch import resume
from launch import run_contents
from launch import steps
from launch import throughput
from launch.optim import build_schedule
from launch.processes import say
from launch.profile import ProfileWindow
from launch.training_setup import counted_step
from launch.training_setup import init_params

__all__ = ["open_manager", "restore_and_train", "storage_error"]

# Steps dispatched ahead of the host at most, whatever --log-every: XLA:CPU aborts a
# collective whose participants wait more than 40 s, which a long queue of steps reached
# on a loaded 2-core machine (--log-every 200).
_MAX_STEPS_IN_FLIGHT = 16


def _initial_state(args, model, abstract, opt, abstract_state, manager, resumed, config):
  """(params, opt_state, first step, damaged steps were set aside): fresh from
  --seed, or the newest intact checkpoint when ``resumed`` (same run
  configuration required)."""
  if resumed:
    is_main = jax.process_index() == 0
    for name in run_contents.LOGS:  # a bad line refused before anything is set aside or read
      resume.check_lines(pathlib.Path(args.out) / name)
    target = {"params": abstract, "opt_state": abstract_state}
    restored = resume.restore(manager, target, config, args.steps, say, is_main=is_main,
                              auto=args.resume == "auto")
    say(f"resumed from step {restored.step} ({args.checkpoint_dir})")
    return (restored.state["params"], restored.state["opt_state"], restored.step,
            bool(restored.skipped))
  param_shardings = jax.tree.map(lambda a: a.sharding, abstract)
  params = jax.jit(lambda key: init_params(args, model, key),
                   out_shardings=param_shardings)(jax.random.key(args.seed))
  return params, opt.init(params), 0, False


def open_manager(args) -> checkpoints.CheckpointManager:
  """The checkpoints of --checkpoint-dir as given: a URL (gs://...) kept, a local path made
  absolute by the manager."""
  return checkpoints.CheckpointManager(
      args.checkpoint_dir, checkpoints.CheckpointPolicy(keep_last=args.keep_checkpoints))


def _save(manager, step, params, opt_state, meta, guard) -> int:
  """Starts an async save of ``step`` (our interval, not orbax's first-step
  rule); a state holding NaN or Inf is not saved (``guard``)."""
  guard.check_state(step, (params, opt_state))
  manager.save(step, {"params": params, "opt_state": opt_state}, metadata=meta, force=True)
  return step


def _due(every: int, step: int, last: int) -> bool:
  return bool(every) and (step % every == 0 or step == last)


def _train(args, mesh, step_fn, evaluation, initial, manager, guard, config, stop, train_bytes,
           counted, claim):
  """Trains from ``initial`` (params, optimizer state, step) with ``step_fn`` (the traced
  ``steps.train_step``) on batches of ``train_bytes`` (the corpus's training slice) to --steps
  or a stop signal (``stop``); returns (the last step, the signal that stopped it or None).
  ``counted``: the step its FLOPs are counted from (``counted_step``); ``claim.trained`` is
  set once a step is trained (the log files are trimmed then: ``_trim_logs``)."""
  params, opt_state, start = initial
  meta = {"seed": args.seed, "optimizer": args.optimizer, "mesh": dict(mesh.shape),
          "config": config}
  out, is_main = pathlib.Path(args.out), jax.process_index() == 0
  batch = lambda step: data.sharded_batch(train_bytes, args.seed, step, args.batch,
                                          args.seq_len, mesh)
  train_step, flops = throughput.compile_step(step_fn, params, opt_state, batch(start),
                                              counted=counted)
  peak = throughput.peak_flops(args.peak_tflops)
  unrolled = ", its layers' scan written out" if counted is not None else ""
  say(evaluation.describe(args),
      f"FLOPs per step: {flops / 1e9:.3g} GFLOP (XLA's cost analysis of the step lowered for"
      f" the whole mesh{unrolled}); MFU against a peak of {peak.source}" if flops else
      "FLOPs per step: not reported by XLA (no MFU)",
      *memory.describe(params, opt_state, train_step), "")
  log = metrics.MetricsLog(out, build_schedule(args), args.batch * (args.seq_len - 1), flops,
                           peak, report.Progress(args.steps, args.log_every, quiet=not is_main),
                           guard, start, is_main)
  profile = ProfileWindow(cli.step_range(args.profile_steps) if args.profile_steps else None,
                          out if is_main else out / f"process-{jax.process_index()}", say)
  step, saved, sampled, pending = start, start, None, []
  window = throughput.Window()
  try:
    window.start(step)
    while step < args.steps and not stop.agreed():
      profile.before(step + 1)
      params, opt_state, loss, norms = train_step(params, opt_state, batch(step))
      stats = steps.stats(loss, norms)
      step += 1
      if not claim.trained:  # the run's folder changes only once it has a step to write
        _trim_logs(out, start, is_main)
        if is_main:
          run_contents.record_checkpoint_dir(out, args.checkpoint_dir)
        claim.trained = True
      profile.after(step, stats)
      pending.append((step, stats, *guard.per_step(opt_state)))
      checkpoint = args.checkpoint_every and step % args.checkpoint_every == 0
      evaluate = _due(args.eval_every, step, args.steps)
      sample = _due(args.sample_every, step, args.steps)
      if step % args.log_every == 0 or checkpoint or evaluate or sample:
        records = log.fetch(pending, window, step)
        if evaluate:
          records[-1]["eval_loss"] = evaluation.loss(params)
        log.write(records)
        if sample:
          evaluation.sample(params, step, out / "samples.jsonl")
          sampled = step
        if checkpoint:
          saved = _save(manager, step, params, opt_state, meta, guard)
        window.start(step)
      elif len(pending) % _MAX_STEPS_IN_FLIGHT == 0:
        jax.block_until_ready(stats)  # a wait, not a fetch: bounds the queue of steps
    log.write(log.fetch(pending, window, step))
    profile.stop(step)
    if sampled != step and step > start:
      evaluation.sample(params, step, out / "samples.jsonl")
    if saved != step:
      _save(manager, step, params, opt_state, meta, guard)
    manager.wait_until_finished()
  finally:
    log.close()
  return step, stop.stopped_by


def _trim_logs(out: pathlib.Path, start: int, is_main: bool) -> None:
  """Before the first new step is written: each log file's torn last line set aside
  (``resume.set_aside_torn_line``) and its records after ``start`` dropped (a resume)."""
  for name in run_contents.LOGS:
    resume.set_aside_torn_line(out / name, say, is_main)
    if is_main:
      report.truncate_metrics(out / name, start)


def restore_and_train(args, mesh, model, opt, step_fn, abstract, abstract_state, evaluation,
                      resumed, config, guard, stop, train_bytes, claim):
  """(last step, first step, the signal that stopped it or None): opens the checkpoints,
  restores on --resume, trains on ``train_bytes``, and closes the checkpoints (the last save
  finalized)."""
  manager = open_manager(args)
  try:
    params, opt_state, start, set_aside = _initial_state(
        args, model, abstract, opt, abstract_state, manager, resumed, config)
    if set_aside:  # damaged steps were renamed: list the steps afresh to save them again
      manager.close()
      manager = open_manager(args)
    guard.resume_from(opt_state)
    step, stopped = _train(args, mesh, step_fn, evaluation, (params, opt_state, start),
                           manager, guard, config, stop, train_bytes,
                           counted_step(args, opt, model), claim)
  except OSError as e:  # a write the storage refused (CheckpointWriteError is one)
    raise storage_error(e, args, manager.newest_finalized()) from e
  finally:
    manager.close()
  return step, start, stopped


def storage_error(e: OSError, args, newest: tuple[int | None, bool]) -> cli.StorageError:
  """One line for a write the storage refused: the path, the step being saved (checkpoints),
  the newest complete checkpoint and what to run once the cause is fixed: --resume continues
  from that checkpoint; with none, --resume auto starts afresh in the folder (--resume would
  find nothing to resume), its earlier log files set aside. ``newest``: (that step, whether
  --checkpoint-dir was listed for it; else the step seen before a filesystem went away)."""
  if isinstance(e, checkpoints.CheckpointWriteError):
    text, step = str(e), e.newest
  else:
    step, listed = newest
    text = (f"{e.strerror or e}: {e.filename or args.out};"
            f" {newest_phrase(step, listed, args.checkpoint_dir)}.")
  remedy = ("run again with --resume to continue from it" if step is not None else
            "run again with --resume auto to start afresh in it (there is nothing to resume;"
            " the metrics and samples written are kept as *.before-N.jsonl)")
  return cli.StorageError(f"{text} Free space (or restore the permissions, the mount), then"
                          f" {remedy}")
