"""The training job behind ``python -m launch.train`` (imports jax: the caller
sets XLA_FLAGS first).

One run: join the other processes (if any), build the mesh, shard the model's
params by a partition-rule preset and the optimizer state by shardopt's derived
shardings (ZeRO over the data axis on request), all checked before the run
folder is settled and created (launch/validation.py, launch/run_folder.py);
restore the newest intact checkpoint on --resume after comparing the saved
flags (launch/resume.py), then train with deterministic batches of the
training slice of the corpus, checkpointing every --checkpoint-every steps
(never a non-finite state). Every --eval-every steps the loss on the held-out
slice is computed, every --sample-every steps (and at the end) a greedy
sample is printed; each step's loss and norms are fetched every --log-every
steps and written with the step time, tokens/s and MFU (launch/metrics.py).
SIGTERM/SIGINT stop it cleanly: every process agrees on the step to stop at,
the checkpoint in flight is finished, the current state is saved and the job
exits 0 (before step 1 of a new run, what the run created is removed: the run
folder, the folders above it and a --checkpoint-dir it made; a second signal
ends it at once, removing them too before step 1: launch/stop.py). The log
files of a resumed run are checked before the restore and trimmed only once a
new step is trained. The run folder is locked for the whole run
(launch/run_lock.py; a single-process run took it before importing jax:
``run_folder.take``); library log lines go to OUT/job.log; a write
the storage refuses ends the job with one line naming the path and the newest
complete checkpoint (``cli.StorageError``).
"""

import argparse
import contextlib
import dataclasses
import pathlib
import os
import socket
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import checkpoints
import partitioning
import shardopt
from launch import cli, data, defaults, metrics, report, resume, run_config, run_folder
from launch import job_log, memory, steps, throughput
from launch.model import ModelConfig, Transformer, next_token_loss
from launch.profile import ProfileWindow
from launch.stop import StopRequest
from launch.optim import build_schedule, update_arguments
from launch.validation import NonFiniteGuard, as_usage_error, blame_values, built_optimizer
from launch.validation import checked_flags, checked_mesh

# Steps dispatched ahead of the host at most, whatever --log-every: XLA:CPU aborts a
# collective whose participants wait more than 40 s, which a long queue of steps reached
# on a loaded 2-core machine (--log-every 200).
_MAX_STEPS_IN_FLIGHT = 16

__all__ = ["init_distributed", "run"]


def init_distributed(args: argparse.Namespace) -> None:
  """Joins the multi-process job described by the arguments, if any. jax's preemption service
  is turned off first: its C++ SIGTERM handler would replace the job's (launch/stop.py), which
  stops every process at one step itself (``StopRequest.agreed``). Still joining --init-timeout
  seconds later, the process ends with one error line, exit 1 (``_ended_unless_joined``)."""
  if not (args.coordinator or args.auto_distributed):
    return
  jax.config.update("jax_enable_preemption_service", False)
  given = (dict(coordinator_address=args.coordinator, num_processes=args.num_processes,
                process_id=args.process_id) if args.coordinator else {})
  with _ended_unless_joined(args):
    jax.distributed.initialize(
        **given, initialization_timeout=args.init_timeout + _JAX_JOIN_SLACK_S,
        heartbeat_timeout_seconds=args.heartbeat_timeout)


# jax aborts a process whose peers have not all joined by its initialization_timeout (a C++
# check failure and its stack, exit 134): it gets this much more than --init-timeout.
_JAX_JOIN_SLACK_S = 30


@contextlib.contextmanager
def _ended_unless_joined(args: argparse.Namespace):
  """Ends the process (``_not_joined``) if the block still runs --init-timeout s after it began
  (jax's join releases the GIL, so a timer thread runs)."""
  timer = threading.Timer(args.init_timeout, _not_joined, (args,))
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    timer.cancel()


def _not_joined(args: argparse.Namespace) -> None:
  print(f"error: {_join_failure(args)}", file=sys.stderr, flush=True)
  os._exit(cli.EXIT_ERROR)


def _join_failure(args: argparse.Namespace) -> str:
  """What had not joined by --init-timeout: with --coordinator, for a process but 0, whether
  anything listens at the address at all."""
  waited = f"within --init-timeout {args.init_timeout} s"
  if not args.coordinator:
    return f"--auto-distributed: the processes jax detected did not all join {waited}"
  where, everyone = f"--coordinator {args.coordinator}", f"--num-processes {args.num_processes}"
  remedy = f"start every process with the same --coordinator and {everyone}"
  if args.process_id != 0:
    host, _, port = args.coordinator.rpartition(":")
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError as e:
      return (f"{where}: nothing listens there ({e.strerror or e}) after --init-timeout"
              f" {args.init_timeout} s: start process 0 (it serves the coordinator) or correct"
              " the address")
  return (f"{where}: not all of the {args.num_processes} processes ({everyone}) joined"
          f" {waited} (this is process {args.process_id}): {remedy}")


def _say(*lines) -> None:
  if jax.process_index() == 0:
    print(*lines, sep="\n", flush=True)


def _model(args) -> Transformer:
  return Transformer(ModelConfig(layers=args.layers, d_model=args.d_model,
                                 heads=args.heads, head_dim=args.head_dim, mlp=args.mlp,
                                 scan_layers=args.scan_layers))


def _param_layout(args, mesh, model):
  """(the partition rules, the params' specs, the abstract sharded params); a --mesh or
  --rules the model sizes do not fit is a UsageError naming them."""
  shapes = jax.eval_shape(lambda key: _init_params(args, model, key), jax.random.key(0))
  with as_usage_error(f"--mesh {args.mesh} --rules {args.rules} and the model sizes"):
    rules = partitioning.decoder_rules(args.rules, fsdp_axis="data", model_axis="model",
                                       stacked=args.scan_layers)
    specs = partitioning.match_partition_rules(rules, shapes)
    partitioning.validate_specs(shapes, specs, mesh)
  abstract = partitioning.abstract_params(shapes, partitioning.named_shardings(mesh, specs))
  return rules, specs, abstract


def _sharded_optimizer(args, abstract) -> shardopt.sharding.ShardedOptimizer:
  """The optimizer of the arguments, with --state-bits and --param-dtype, sharded for the
  params ``abstract`` (ZeRO over data with --zero, its state in --state-memory-kind)."""
  return shardopt.make_sharded_optimizer(
      built_optimizer(args), abstract, jax.tree.map(lambda a: a.sharding, abstract),
      shard_state_over="data" if args.zero else None,
      state_memory_kind=None if args.state_memory_kind == "device" else args.state_memory_kind)


def _planned_step(args, model, abstract):
  """(the sharded optimizer, its abstract state, the training step), the step traced on
  abstract values, compiling nothing: what fails there fails before anything is written."""
  opt = _sharded_optimizer(args, abstract)
  abstract_state = partitioning.abstract_params(jax.eval_shape(opt.init, abstract),
                                                opt.state_shardings)
  step_fn = _step_for(args, opt, model)
  steps.trace(step_fn, abstract, abstract_state, (args.batch, args.seq_len))
  return opt, abstract_state, step_fn


def _counted_step(args, opt, model):
  """The step whose lowering the FLOPs are counted from (``throughput.compile_step``): with
  --scan-layers the same step with the layers written out (XLA counts a loop's body once);
  otherwise None, the step itself."""
  if not args.scan_layers:
    return None
  return _step_for(args, opt, Transformer(dataclasses.replace(model.cfg, unroll_scan=True)))


def _step_for(args, opt, model):
  """The job's training step (``steps.train_step``) of ``model`` with ``opt``."""
  return steps.train_step(opt, lambda p, tokens: next_token_loss(model, p, tokens),
                          update_arguments(args.optimizer))


def _init_params(args, model, key):
  """The model's params from ``key``, in --param-dtype (float32 ones rounded)."""
  params = model.init(key, jnp.zeros((1, args.seq_len - 1), jnp.int32))["params"]
  return jax.tree.map(lambda p: p.astype(args.param_dtype), params)


def _quantized_lines(args, opt, abstract) -> list[str]:
  """With --state-bits: how many moments are quantized, and every float leaf
  kept as it is or moment stored wider than asked, with why."""
  if not args.state_bits:
    return []
  report = shardopt.describe_quantized_state(opt.tx, abstract, opt.update_shardings)
  quantized = len(report.leaves) - len(report.kept)
  return ([f"{args.state_bits}-bit optimizer state: {quantized} moments quantized,"
           f" {len(report.kept)} float leaves kept:"]
          + [f"  {l.path} {l.shape}: {l.reason}"
             for l in report.kept + report.widened] + [""])


def _describe(args, mesh, rules, specs, abstract, state, opt) -> None:
  plan = partitioning.memory_plan(abstract, state, num_devices=mesh.size)
  _say(f"processes: {jax.process_count()}  devices: {jax.device_count()}"
       f" ({jax.local_device_count()} local, {jax.devices()[0].platform})",
       f"mesh: {dict(mesh.shape)}, {args.axis_types} axes",
       f"optimizer: {args.optimizer}  lr: {args.lr:g} (default for {args.optimizer}:"
       f" {defaults.learning_rate(args.optimizer):g}, {defaults.source(args.optimizer)})"
       f"  schedule: {args.schedule}  ZeRO: {args.zero}",
       "", f"partition rules (preset {args.rules!r}):",
       partitioning.rule_table(rules, abstract, specs),
       "", "per-device memory plan:", plan.table(), "", *_quantized_lines(args, opt, abstract))


def _initial_state(args, model, abstract, opt, abstract_state, manager, resumed, config):
  """(params, opt_state, first step, damaged steps were set aside): fresh from
  --seed, or the newest intact checkpoint when ``resumed`` (same run
  configuration required)."""
  if resumed:
    is_main = jax.process_index() == 0
    for name in run_folder.LOGS:  # a bad line refused before anything is set aside or read
      resume.check_lines(pathlib.Path(args.out) / name)
    target = {"params": abstract, "opt_state": abstract_state}
    restored = resume.restore(manager, target, config, args.steps, _say, is_main=is_main,
                              auto=args.resume == "auto")
    _say(f"resumed from step {restored.step} ({args.checkpoint_dir})")
    return (restored.state["params"], restored.state["opt_state"], restored.step,
            bool(restored.skipped))
  param_shardings = jax.tree.map(lambda a: a.sharding, abstract)
  params = jax.jit(lambda key: _init_params(args, model, key),
                   out_shardings=param_shardings)(jax.random.key(args.seed))
  return params, opt.init(params), 0, False


def _open_manager(args) -> checkpoints.CheckpointManager:
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


class _HeldOut:
  """The loss on the held-out slice (one jitted program) and greedy samples
  whose prompt is the start of that slice."""

  def __init__(self, args, mesh, model, param_shardings, held_out, batches):
    """``batches``: the held-out batches (``data.eval_batches``), None with --eval-every 0."""
    self.held_out_bytes = held_out.size
    self.batches = None if batches is None else data.sharded_eval_batches(batches, mesh)
    loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
    self._loss = steps.eval_loss(loss_fn, param_shardings,
                                 NamedSharding(mesh, P(None, "data", None)))
    window = args.seq_len - 1
    self.prompt_len = window // 2
    self._prompt = np.zeros((1, window), np.int32)
    self._prompt[0, :self.prompt_len] = held_out[:self.prompt_len]
    self._sample = steps.greedy_sample(model, param_shardings, self.prompt_len)

  def describe(self, args) -> str:
    return (f"held-out: the last {self.held_out_bytes} bytes of {data.CORPUS_PATH.name}, never"
            f" trained on; {self.batches.shape[0]} batches of {args.batch} x {args.seq_len}"
            f" bytes every {args.eval_every} steps and at the last" if args.eval_every else
            "held-out loss: off (--eval-every 0)")

  def loss(self, params) -> float:
    return float(self._loss(params, self.batches))

  def sample(self, params, step: int, path: pathlib.Path) -> None:
    """Prints the greedy continuation of the prompt and appends it to ``path``."""
    tokens = np.asarray(jax.device_get(self._sample(params, self._prompt)))[0]
    text = lambda t: bytes(t.astype(np.uint8).tolist()).decode("utf-8", errors="replace")
    prompt, continuation = text(tokens[:self.prompt_len]), text(tokens[self.prompt_len:])
    _say(f"sample at step {step} (greedy): {prompt!r} -> {continuation!r}")
    if jax.process_index() == 0:
      report.append_metrics(path, {"step": step, "prompt": prompt,
                                   "continuation": continuation})


def _due(every: int, step: int, last: int) -> bool:
  return bool(every) and (step % every == 0 or step == last)


def _train(args, mesh, step_fn, evaluation, initial, manager, guard, config, stop, train_bytes,
           counted, claim):
  """Trains from ``initial`` (params, optimizer state, step) with ``step_fn`` (the traced
  ``steps.train_step``) on batches of ``train_bytes`` (the corpus's training slice) to --steps
  or a stop signal (``stop``); returns (the last step, the signal that stopped it or None).
  ``counted``: the step its FLOPs are counted from (``_counted_step``); ``claim.trained`` is
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
  _say(evaluation.describe(args),
       f"FLOPs per step: {flops / 1e9:.3g} GFLOP (XLA's cost analysis of the step lowered for"
       f" the whole mesh{unrolled}); MFU against a peak of {peak.source}" if flops else
       "FLOPs per step: not reported by XLA (no MFU)",
       *memory.describe(params, opt_state, train_step), "")
  log = metrics.MetricsLog(out, build_schedule(args), args.batch * (args.seq_len - 1), flops,
                           peak, report.Progress(args.steps, args.log_every, quiet=not is_main),
                           guard, start, is_main)
  profile = ProfileWindow(cli.step_range(args.profile_steps) if args.profile_steps else None,
                          out if is_main else out / f"process-{jax.process_index()}", _say)
  step, saved, sampled, pending = start, start, None, []
  window = throughput.Window()
  try:
    window.start(step)
    while step < args.steps and not stop.agreed():
      profile.before(step + 1)
      params, opt_state, loss, norms = train_step(params, opt_state, batch(step))
      stats = steps.stats(loss, norms)
      step += 1
      if not claim.trained:  # the run's logs change only once it has a step to write
        _trim_logs(out, start, is_main)
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
  for name in run_folder.LOGS:
    resume.set_aside_torn_line(out / name, _say, is_main)
    if is_main:
      report.truncate_metrics(out / name, start)


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


def _storage_error(e: OSError, args) -> cli.StorageError:
  """One line for a write the storage refused: the path, the step being saved (checkpoints),
  the newest complete checkpoint, and what to run once the cause is fixed: --resume continues
  from that checkpoint; with none, --resume auto starts afresh in the folder (--resume would
  find nothing to resume), its earlier log files set aside."""
  if isinstance(e, checkpoints.CheckpointWriteError):
    text, newest = str(e), e.newest
  else:
    try:
      steps_there = run_folder.finalized_steps(args.checkpoint_dir)
    except OSError:
      steps_there = []
    newest = steps_there[-1] if steps_there else None
    intact = (f"the newest complete checkpoint is step {newest}" if newest is not None
              else "there is no complete checkpoint")
    text = f"{e.strerror or e}: {e.filename or args.out}; {intact} in {args.checkpoint_dir}."
  remedy = ("run again with --resume to continue from it" if newest is not None else
            "run again with --resume auto to start afresh in it (there is nothing to resume;"
            " the metrics and samples written are kept as *.before-N.jsonl)")
  return cli.StorageError(f"{text} Free space (or restore the permissions, the mount), then"
                          f" {remedy}")


def _stopped_before_training(args, signum: int, start: int, resumed: bool,
                             claim: run_folder.Claim) -> str:
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


def run(args: argparse.Namespace, stop: StopRequest, claim: run_folder.Claim | None = None) -> int:
  """Runs the job; the run folder's lock is held until it returns or raises (or a second
  signal ends the process). ``claim``: the folders a single-process run took before importing
  jax (``run_folder.take``); what it created is removed if the run ends before it starts."""
  claim = run_folder.Claim() if claim is None else claim
  with contextlib.ExitStack() as held:
    held.callback(claim.end)
    stop.on_abort(held.close)
    stop.on_abort(claim.abort)  # first: before step 1, what the run created goes, as it wrote it
    return _run(args, stop, held, claim)


def _run(args: argparse.Namespace, stop: StopRequest, held: contextlib.ExitStack,
         claim: run_folder.Claim) -> int:
  init_distributed(args)
  train_bytes, held_out, eval_batches = checked_flags(args)  # those of --print-config, first
  mesh = checked_mesh(args)
  model = _model(args)
  rules, specs, abstract = _param_layout(args, mesh, model)
  opt, abstract_state, step_fn = blame_values(  # every value checked before the run folder
      args, lambda given: _planned_step(given, model, abstract))
  evaluation = _HeldOut(args, mesh, model, opt.param_shardings, held_out, eval_batches)
  # A multi-process run takes its folder below: whether it is new is seen by every process
  # before the collective in agreed(), after which another process may have created it.
  new_out = not claim.taken and args.out is not None and not os.path.exists(args.out)
  failure = None
  if stop.agreed():  # what a claim taken before jax created is removed as the job returns
    _say(f"stopped by signal {stop.signum or 'on another process'} before the run started:"
         " nothing was created")
    return 0
  try:
    resumed, note = run_folder.prepare(args, is_main=jax.process_index() == 0, held=held, say=_say,
                                       claim=claim)
  except cli.UsageError as e:
    failure = e
  _agreed(failure)
  if new_out and jax.process_index() == 0:
    claim.adopt(os.path.normpath(args.out))
  out = pathlib.Path(args.out)
  held.callback(job_log.to_file(job_log.log_path(out, jax.process_index())))
  if note:
    _say(note)
  config = run_config.config_of(args, jax.process_count(), jax.device_count())
  guard = NonFiniteGuard(args.skip_nonfinite, hint="Lower --lr or --clip-norm, or pass"
                         " --skip-nonfinite to skip such steps.")
  _describe(args, mesh, rules, specs, abstract, abstract_state, opt)
  try:
    step, start, stopped = _restore_and_train(args, mesh, model, opt, step_fn, abstract,
                                              abstract_state, evaluation, resumed, config, guard,
                                              stop, train_bytes, claim)
    if stopped is not None and step == start:
      _say(_stopped_before_training(args, stopped, start, resumed, claim))
      return 0
    metrics_path = out / "metrics.jsonl"
    if jax.process_index() == 0 and metrics_path.exists():
      report.plot_losses(metrics_path, out / "loss.png", run_config.title(out.name, config))
  except OSError as e:  # a write the storage refused (CheckpointWriteError is one)
    raise _storage_error(e, args) from e
  if stopped is not None:
    _say(f"stopped by signal {stopped} after step {step}; checkpoint saved:"
         " run again with --resume to continue")
  else:
    _say(f"done: {step} steps; metrics {metrics_path}, curve {out / 'loss.png'},"
         f" TensorBoard: tensorboard --logdir {out.parent}, checkpoints {args.checkpoint_dir}")
  return 0


def _restore_and_train(args, mesh, model, opt, step_fn, abstract, abstract_state, evaluation,
                       resumed, config, guard, stop, train_bytes, claim):
  """(last step, first step, the signal that stopped it or None): opens the checkpoints,
  restores on --resume, trains on ``train_bytes``, and closes the checkpoints (the last save
  finalized)."""
  manager = _open_manager(args)
  try:
    params, opt_state, start, set_aside = _initial_state(
        args, model, abstract, opt, abstract_state, manager, resumed, config)
    if set_aside:  # damaged steps were renamed: list the steps afresh to save them again
      manager.close()
      manager = _open_manager(args)
    guard.resume_from(opt_state)
    step, stopped = _train(args, mesh, step_fn, evaluation, (params, opt_state, start),
                           manager, guard, config, stop, train_bytes,
                           _counted_step(args, opt, model), claim)
  finally:
    manager.close()
  return step, start, stopped
