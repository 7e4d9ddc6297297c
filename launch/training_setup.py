"""What the job trains, built from the flags on abstract values before anything is written:
the model, its params sharded by a partition-rule preset, the optimizer with its state
sharded by shardopt's derived shardings (ZeRO over the data axis on request), the traced
training step; and the header that describes them. Imports jax.
"""

import dataclasses

import jax
import jax.numpy as jnp

import partitioning
import shardopt
from launch import defaults
from launch import steps
from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
from launch.optim import update_arguments
from launch.processes import say
from launch.validation import as_usage_error
from launch.validation import built_optimizer

__all__ = ["build_model", "counted_step", "describe", "init_params", "param_layout",
           "planned_step", "quantized_lines", "sharded_optimizer"]


def build_model(args) -> Transformer:
  """The model of the flags (--layers, --d-model, --heads, --head-dim, --mlp, --scan-layers)."""
  return Transformer(ModelConfig(layers=args.layers, d_model=args.d_model,
                                 heads=args.heads, head_dim=args.head_dim, mlp=args.mlp,
                                 scan_layers=args.scan_layers))


def param_layout(args, mesh, model):
  """(the partition rules, the params' specs, the abstract sharded params); a --mesh or
  --rules the model sizes do not fit is a UsageError naming them."""
  shapes = jax.eval_shape(lambda key: init_params(args, model, key), jax.random.key(0))
  with as_usage_error(f"--mesh {args.mesh} --rules {args.rules} and the model sizes"):
    rules = partitioning.decoder_rules(args.rules, fsdp_axis="data", model_axis="model",
                                       stacked=args.scan_layers)
    specs = partitioning.match_partition_rules(rules, shapes)
    partitioning.validate_specs(shapes, specs, mesh)
  abstract = partitioning.abstract_params(shapes, partitioning.named_shardings(mesh, specs))
  return rules, specs, abstract


def sharded_optimizer(args, abstract) -> shardopt.sharding.ShardedOptimizer:
  """The optimizer of the arguments, with --state-bits and --param-dtype, sharded for the
  params ``abstract`` (ZeRO over data with --zero, its state in --state-memory-kind)."""
  return shardopt.make_sharded_optimizer(
      built_optimizer(args), abstract, jax.tree.map(lambda a: a.sharding, abstract),
      shard_state_over="data" if args.zero else None,
      state_memory_kind=None if args.state_memory_kind == "device" else args.state_memory_kind)


def planned_step(args, model, abstract):
  """(the sharded optimizer, its abstract state, the training step), the step traced on
  abstract values, compiling nothing: what fails there fails before anything is written."""
  opt = sharded_optimizer(args, abstract)
  abstract_state = partitioning.abstract_params(jax.eval_shape(opt.init, abstract),
                                                opt.state_shardings)
  step_fn = _step_for(args, opt, model)
  steps.trace(step_fn, abstract, abstract_state, (args.batch, args.seq_len))
  return opt, abstract_state, step_fn


def counted_step(args, opt, model):
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


def init_params(args, model, key):
  """The model's params from ``key``, in --param-dtype (float32 ones rounded)."""
  params = model.init(key, jnp.zeros((1, args.seq_len - 1), jnp.int32))["params"]
  return jax.tree.map(lambda p: p.astype(args.param_dtype), params)


def quantized_lines(args, opt, abstract) -> list[str]:
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


def describe(args, mesh, rules, specs, abstract, state, opt) -> None:
  """Prints the header (process 0): the devices, the mesh, the optimizer, the partition-rule
  table, the per-device memory plan and, with --state-bits, the quantized state."""
  plan = partitioning.memory_plan(abstract, state, num_devices=mesh.size)
  say(f"processes: {jax.process_count()}  devices: {jax.device_count()}"
      f" ({jax.local_device_count()} local, {jax.devices()[0].platform})",
      f"mesh: {dict(mesh.shape)}, {partitioning.describe_axis_types(mesh)}",
      f"optimizer: {args.optimizer}  lr: {args.lr:g} (default for {args.optimizer}:"
      f" {defaults.learning_rate(args.optimizer):g}, {defaults.source(args.optimizer)})"
      f"  schedule: {args.schedule}  ZeRO: {args.zero}",
      "", f"partition rules (preset {args.rules!r}):",
      partitioning.rule_table(rules, abstract, specs),
      "", "per-device memory plan:", plan.table(), "", *quantized_lines(args, opt, abstract))
