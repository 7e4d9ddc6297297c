"""The training job behind ``python -m launch.train`` (imports jax: the caller
sets XLA_FLAGS first).

One run: join the other processes (if any), build the mesh, shard the model's
params by a partition-rule preset and the optimizer state by shardopt's derived
shardings (ZeRO over the data axis on request), all checked before the run
folder is settled and created (launch/validation.py, launch/run_folder.py);
restore the newest intact checkpoint on --resume after comparing the saved
flags (launch/resume.py), then train with deterministic batches,
checkpointing every --checkpoint-every steps (never a non-finite state).
SIGTERM/SIGINT stop it cleanly: every process agrees on the step to stop at,
the checkpoint in flight is finished, the current state is saved and the job
exits 0.
"""

import argparse
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

import checkpoints
import partitioning
import shardopt
from launch import data, report, resume, run_config, run_folder
from launch.model import ModelConfig, Transformer, next_token_loss
from launch.optim import build_schedule, with_state_bits
from launch.validation import NonFiniteGuard, as_usage_error, checked_mesh, checked_optimizer

# Steps dispatched ahead of the host at most, whatever --log-every: XLA:CPU aborts a
# collective whose participants wait more than 40 s, which a long queue of steps reached
# on a loaded 2-core machine (--log-every 200).
_MAX_STEPS_IN_FLIGHT = 16

__all__ = ["init_distributed", "run"]


def init_distributed(args: argparse.Namespace) -> None:
  """Joins the multi-process job described by the arguments, if any."""
  if args.coordinator:
    jax.distributed.initialize(
        coordinator_address=args.coordinator, num_processes=args.num_processes,
        process_id=args.process_id, initialization_timeout=args.init_timeout,
        heartbeat_timeout_seconds=args.heartbeat_timeout)
  elif args.auto_distributed:
    jax.distributed.initialize(initialization_timeout=args.init_timeout,
                               heartbeat_timeout_seconds=args.heartbeat_timeout)


class StopRequest:
  """Remembers SIGTERM/SIGINT; ``agreed()`` is True on every process once any got one."""

  def __init__(self):
    self.signum = None
    self._previous = {s: signal.signal(s, self._handle)
                      for s in (signal.SIGTERM, signal.SIGINT)}

  def _handle(self, signum, frame):
    self.signum = signum
    for s, handler in self._previous.items():  # A second signal acts at once.
      signal.signal(s, handler)

  def agreed(self) -> bool:
    mine = np.array(self.signum is not None)
    if jax.process_count() == 1:
      return bool(mine)
    return bool(np.any(multihost_utils.process_allgather(mine)))

  def restore(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


def _say(*lines) -> None:
  if jax.process_index() == 0:
    print(*lines, sep="\n", flush=True)


def _model(args) -> Transformer:
  return Transformer(ModelConfig(layers=args.layers, d_model=args.d_model,
                                 heads=args.heads, head_dim=args.head_dim, mlp=args.mlp,
                                 scan_layers=args.scan_layers))


def _layout(args, mesh, model, tx):
  """Abstract sharded params, their specs, and the sharded optimizer."""
  tokens = jax.ShapeDtypeStruct((1, args.seq_len - 1), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  rules = partitioning.decoder_rules(args.rules, fsdp_axis="data", model_axis="model",
                                     stacked=args.scan_layers)
  specs = partitioning.match_partition_rules(rules, shapes)
  partitioning.validate_specs(shapes, specs, mesh)
  abstract = partitioning.abstract_params(shapes, partitioning.named_shardings(mesh, specs))
  zero_axis = "data" if args.zero else None
  tx = with_state_bits(args, tx, partitioning.named_shardings(mesh, specs), zero_axis)
  opt = shardopt.make_sharded_optimizer(
      tx, abstract, partitioning.named_shardings(mesh, specs), shard_state_over=zero_axis)
  return rules, specs, abstract, opt


def _describe(args, mesh, rules, specs, abstract, state) -> None:
  plan = partitioning.memory_plan(abstract, state, num_devices=mesh.size)
  _say(f"processes: {jax.process_count()}  devices: {jax.device_count()}"
       f" ({jax.local_device_count()} local, {jax.devices()[0].platform})",
       f"mesh: {dict(mesh.shape)}",
       f"optimizer: {args.optimizer}  schedule: {args.schedule}  ZeRO: {args.zero}",
       "", f"partition rules (preset {args.rules!r}):",
       partitioning.rule_table(rules, abstract, specs),
       "", "per-device memory plan:", plan.table(), "")


def _log(pending, schedule, progress, metrics_path, guard) -> None:
  """Fetches the losses of the steps since the last log (one host sync for
  all of them) and writes one metrics record per step; a non-finite loss
  stops the job there (``guard``)."""
  if not pending:
    return
  fetched = jax.device_get([entry[1:] for entry in pending])
  speed = progress.tokens_per_s(pending[-1][0])
  for (step, *_), (loss, *extra) in zip(pending, fetched):
    loss, lr = float(loss), float(schedule(step - 1))
    fields = guard.fields(step, loss, extra)
    if jax.process_index() == 0:
      report.append_metrics(metrics_path, {"step": step, "loss": loss, "lr": lr,
                                           "tokens_per_s": speed, "time": time.time(),
                                           **fields})
    progress.show(step, loss, lr, speed)
  pending.clear()


def _initial_state(args, model, abstract, opt, abstract_state, manager, resumed, config):
  """(params, opt_state, first step, damaged steps were set aside): fresh from
  --seed, or the newest intact checkpoint when ``resumed`` (same run
  configuration required)."""
  if resumed:
    is_main = jax.process_index() == 0
    target = {"params": abstract, "opt_state": abstract_state}
    restored = resume.restore(manager, target, config, args.steps, _say, is_main=is_main,
                              auto=args.resume == "auto", out=args.out)
    if restored is not None:
      _say(f"resumed from step {restored.step} ({args.checkpoint_dir})")
      return (restored.state["params"], restored.state["opt_state"], restored.step,
              bool(restored.skipped))
  init = lambda key: model.init(key, jnp.zeros((1, args.seq_len - 1), jnp.int32))["params"]
  param_shardings = jax.tree.map(lambda a: a.sharding, abstract)
  params = jax.jit(init, out_shardings=param_shardings)(jax.random.key(args.seed))
  return params, opt.init(params), 0, resumed


def _open_manager(args) -> checkpoints.CheckpointManager:
  return checkpoints.CheckpointManager(
      pathlib.Path(args.checkpoint_dir).absolute(),
      checkpoints.CheckpointPolicy(keep_last=args.keep_checkpoints))


def _save(manager, step, params, opt_state, meta, guard) -> int:
  """Starts an async save of ``step`` (our interval, not orbax's first-step
  rule); a state holding NaN or Inf is not saved (``guard``)."""
  guard.check_state(step, (params, opt_state))
  manager.save(step, {"params": params, "opt_state": opt_state}, metadata=meta, force=True)
  return step


def run(args: argparse.Namespace) -> int:
  init_distributed(args)
  mesh = checked_mesh(args)
  model, tx = _model(args), checked_optimizer(args)
  with as_usage_error(f"--mesh {args.mesh} --rules {args.rules} and the model sizes"):
    rules, specs, abstract, opt = _layout(args, mesh, model, tx)
  abstract_state = partitioning.abstract_params(
      jax.eval_shape(opt.tx.init, abstract), opt.state_shardings)
  resumed, note = run_folder.prepare(args, is_main=jax.process_index() == 0)
  if note:
    _say(note)
  out = pathlib.Path(args.out)
  config = run_config.config_of(args, jax.process_count(), jax.device_count())
  guard = NonFiniteGuard(args.skip_nonfinite, hint="Lower --lr or --clip-norm, or pass"
                         " --skip-nonfinite to skip such steps.")
  _describe(args, mesh, rules, specs, abstract, abstract_state)
  manager = _open_manager(args)
  try:
    params, opt_state, start, set_aside = _initial_state(
        args, model, abstract, opt, abstract_state, manager, resumed, config)
  except BaseException:
    manager.close()
    raise
  if set_aside:  # damaged steps were renamed: list the steps afresh to save them again
    manager.close()
    manager = _open_manager(args)
  guard.resume_from(opt_state)
  train_step = opt.train_step(lambda p, tokens: next_token_loss(model, p, tokens))
  corpus, schedule = data.load_corpus(), build_schedule(args)
  metrics_path = out / "metrics.jsonl"
  progress = report.Progress(args.steps, args.batch * (args.seq_len - 1), args.log_every,
                             quiet=jax.process_index() != 0)
  if jax.process_index() == 0:
    report.truncate_metrics(metrics_path, start)
  meta = {"seed": args.seed, "optimizer": args.optimizer, "mesh": dict(mesh.shape),
          "config": config}
  stop, step, saved, pending = StopRequest(), start, start, []
  try:
    while step < args.steps and not stop.agreed():
      tokens = data.sharded_batch(corpus, args.seed, step, args.batch, args.seq_len, mesh)
      params, opt_state, loss = train_step(params, opt_state, tokens)
      step += 1
      # fetched every --log-every steps, not per step
      pending.append((step, loss, *guard.per_step(opt_state)))
      checkpoint = args.checkpoint_every and step % args.checkpoint_every == 0
      if step % args.log_every == 0 or checkpoint:
        _log(pending, schedule, progress, metrics_path, guard)
      elif len(pending) % _MAX_STEPS_IN_FLIGHT == 0:
        jax.block_until_ready(loss)  # a wait, not a fetch: bounds the queue of steps
      if checkpoint:
        saved = _save(manager, step, params, opt_state, meta, guard)
    _log(pending, schedule, progress, metrics_path, guard)
    if saved != step:
      _save(manager, step, params, opt_state, meta, guard)
    manager.wait_until_finished()
  finally:
    stop.restore()
    manager.close()
  if jax.process_index() == 0 and metrics_path.exists():
    report.plot_losses(metrics_path, out / "loss.png")
  if stop.signum is not None:
    _say(f"stopped by signal {stop.signum} after step {step}; checkpoint saved:"
         " run again with --resume to continue")
  else:
    _say(f"done: {step} steps; metrics {metrics_path}, curve {out / 'loss.png'},"
         f" checkpoints {args.checkpoint_dir}")
  return 0
