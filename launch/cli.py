"""Command line of the main job. Importing this module does not import jax, so
the job can set XLA_FLAGS (simulated CPU devices) from the arguments first.

``parse_args`` checks every argument that can be checked without devices
(``check_args``); the mesh and what depends on it are checked by the job
before it creates anything. A bad argument is a ``UsageError``: ``train.main``
prints it as one ``error: ...`` line and exits 2.
"""

import argparse
import math
import os

__all__ = ["NonFiniteError", "UsageError", "check_args", "parse_args", "set_cpu_devices",
           "several_processes"]


class UsageError(Exception):
  """A bad argument or a state of the run folder the arguments do not fit (exit 2)."""


class NonFiniteError(Exception):
  """The loss or the training state became non-finite (exit 3)."""


class _Parser(argparse.ArgumentParser):
  """argparse whose errors are a UsageError (one line), not usage text and exit."""

  def error(self, message):
    raise UsageError(f"{message} (see python -m launch.train --help)")


def _key_value(text: str) -> tuple[str, float]:
  key, eq, value = text.partition("=")
  if not eq or not key.isidentifier():
    raise argparse.ArgumentTypeError(f"{text!r} is not NAME=NUMBER (e.g. decay_rate=0.8)")
  return key, float(value)


def _add_layout(p) -> None:
  g = p.add_argument_group("layout")
  g.add_argument("--mesh", default="data=4,model=2",
                 help="mesh shape over all devices of all processes, axes named data and"
                 " model; one axis may be -1")
  g.add_argument("--rules", default="tp",
                 help="partition-rule preset of partitioning.decoder_rules: replicated,"
                 " fsdp (d_model over the data axis), tp (heads, mlp and vocab over the"
                 " model axis) or fsdp_tp")
  g.add_argument("--zero", action=argparse.BooleanOptionalAction, default=True,
                 help="also shard optimizer state over the data axis (ZeRO)")


def _add_optimizer(p) -> None:
  g = p.add_argument_group("optimizer")
  g.add_argument("--optimizer", default="adamw", help="a shardopt alias (see launch/optim.py)")
  g.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
  for name in ("b1", "b2", "eps", "weight_decay", "momentum"):
    g.add_argument("--" + name.replace("_", "-"), type=float, default=None,
                   help="passed to the optimizer if given (its default otherwise)")
  g.add_argument("--opt", type=_key_value, action="append", default=[], metavar="NAME=NUMBER",
                 help="any other keyword argument of the optimizer; repeatable")
  g.add_argument("--schedule", default="warmup_cosine",
                 choices=("constant", "cosine", "warmup_cosine", "linear"))
  g.add_argument("--schedule-steps", type=int, default=None,
                 help="horizon of the cosine/linear schedule; default --steps. Keep it when"
                 " a resume extends --steps, so the learning rate does not jump")
  g.add_argument("--warmup-steps", type=int, default=20)
  g.add_argument("--final-lr-ratio", type=float, default=0.1,
                 help="end learning rate as a fraction of --lr (cosine, linear)")
  g.add_argument("--clip-norm", type=float, default=1.0,
                 help="clip updates by global norm first; 0 turns it off")
  g.add_argument("--state-bits", type=int, choices=(8, 4), default=None,
                 help="store the optimizer's moments block-wise quantized in 8 or 4"
                 " bits (shardopt.quantized_state, blocks fitted to the shards)")


def _add_model_and_data(p) -> None:
  g = p.add_argument_group("model and data")
  g.add_argument("--layers", type=int, default=2)
  g.add_argument("--scan-layers", action="store_true",
                 help="run the layers under nn.scan: params stacked under layers/ with a"
                 " leading layer dimension (the stacked partition rules)")
  g.add_argument("--d-model", type=int, default=64)
  g.add_argument("--heads", type=int, default=4)
  g.add_argument("--head-dim", type=int, default=16)
  g.add_argument("--mlp", type=int, default=256)
  g.add_argument("--batch", type=int, default=32,
                 help="global batch (sequences); a multiple of the data axis")
  g.add_argument("--seq-len", type=int, default=65, help="bytes per sequence (inputs + 1)")
  g.add_argument("--steps", type=int, default=200)
  g.add_argument("--seed", type=int, default=0, help="init and data order")
  g.add_argument("--skip-nonfinite", action="store_true",
                 help="skip a step whose loss or gradients are not finite (counted in the"
                 " metrics) instead of stopping the job with exit code 3")


def _add_outputs(p) -> None:
  g = p.add_argument_group("outputs and checkpoints")
  g.add_argument("--out", default=None,
                 help="metrics.jsonl, loss.png and (by default) checkpoints go here;"
                 " default: a new runs/lm-<time> (with --resume: the newest runs/lm-*"
                 " holding a checkpoint)")
  g.add_argument("--checkpoint-dir", default=None, help="default: OUT/checkpoints")
  g.add_argument("--checkpoint-every", type=int, default=50, help="0: only at the end")
  g.add_argument("--keep-checkpoints", type=int, default=3, help="keep the newest N")
  g.add_argument("--resume", nargs="?", const="required", default=None,
                 choices=("required", "auto"),
                 help="continue from the newest valid checkpoint (an error if there is"
                 " none); '--resume auto' starts fresh when there is none (cluster"
                 " scripts that resubmit one command)")
  g.add_argument("--log-every", type=int, default=10)
  g.add_argument("--debug", action="store_true", help="show tracebacks of errors")


def _add_processes(p) -> None:
  g = p.add_argument_group("processes and devices")
  g.add_argument("--cpu-devices", type=int, default=8,
                 help="simulated CPU devices per process; 0 leaves the platform alone"
                 " (TPU/GPU hosts)")
  g.add_argument("--coordinator", default=None,
                 help="HOST:PORT of process 0: join a multi-process job explicitly")
  g.add_argument("--num-processes", type=int, default=None)
  g.add_argument("--process-id", type=int, default=None)
  g.add_argument("--auto-distributed", action="store_true",
                 help="jax.distributed.initialize() with cluster auto-detection"
                 " (SLURM, TPU pod)")
  g.add_argument("--init-timeout", type=int, default=300,
                 help="seconds to wait for all processes to join")
  g.add_argument("--heartbeat-timeout", type=int, default=100,
                 help="seconds before a silent peer aborts the job")


def parser() -> argparse.ArgumentParser:
  """The job's argument parser (its defaults are the reference of run_config)."""
  p = _Parser(
      prog="python -m launch.train",
      description="Train a byte-level transformer LM with sharded params and"
      " sharded optimizer state. The defaults finish in under 2 minutes on 2 CPU"
      " cores with 8 simulated devices. Exit codes: 0 done (or stopped by a"
      " signal, checkpoint saved), 2 bad arguments or run folder, 3 non-finite"
      " loss or state.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  for add in (_add_layout, _add_optimizer, _add_model_and_data, _add_outputs, _add_processes):
    add(p)
  return p


# Checks ------------------------------------------------------------------

_AT_LEAST = {  # flag: smallest value
    "steps": 1, "batch": 1, "seq_len": 2, "layers": 1, "d_model": 1, "heads": 1,
    "head_dim": 1, "mlp": 1, "warmup_steps": 0, "checkpoint_every": 0,
    "keep_checkpoints": 1, "log_every": 1, "cpu_devices": 0, "schedule_steps": 1,
    "init_timeout": 1, "heartbeat_timeout": 1, "num_processes": 1, "process_id": 0,
}


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _check_numbers(args: argparse.Namespace) -> None:
  for name, low in _AT_LEAST.items():
    value = getattr(args, name)
    if value is not None and value < low:
      raise UsageError(f"{_flag(name)} {value}: must be at least {low}")
  if not (math.isfinite(args.lr) and args.lr > 0):
    raise UsageError(f"--lr {args.lr}: the learning rate must be a finite number > 0")
  for name in ("clip_norm", "final_lr_ratio"):
    value = getattr(args, name)
    if not (math.isfinite(value) and value >= 0):
      raise UsageError(f"{_flag(name)} {value}: must be a finite number >= 0")
  for name in ("b1", "b2", "eps", "weight_decay", "momentum"):
    value = getattr(args, name)
    if value is not None and not math.isfinite(value):
      raise UsageError(f"{_flag(name)} {value}: must be a finite number")
  for key, value in args.opt:
    if not math.isfinite(value):
      raise UsageError(f"--opt {key}={value}: must be a finite number")


def several_processes(args: argparse.Namespace) -> bool:
  """Whether the arguments join a multi-process job."""
  return bool(args.coordinator or args.auto_distributed or (args.num_processes or 1) > 1)


def _check_processes(args: argparse.Namespace) -> None:
  if several_processes(args) and args.out is None:
    raise UsageError("a multi-process job needs --out (the same folder for every process)")
  if args.coordinator and (args.num_processes is None or args.process_id is None):
    raise UsageError("--coordinator needs --num-processes and --process-id")
  if args.process_id is not None and args.num_processes is not None and (
      args.process_id >= args.num_processes):
    raise UsageError(f"--process-id {args.process_id}: must be below --num-processes"
                     f" {args.num_processes}")


def _check_paths(args: argparse.Namespace) -> None:
  for name in ("out", "checkpoint_dir"):
    path = getattr(args, name)
    if path is not None and "://" not in path and os.path.exists(path) and (
        not os.path.isdir(path)):
      raise UsageError(f"{_flag(name)} {path}: is a file, not a folder; name a folder")


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError naming the first flag whose value cannot work."""
  _check_numbers(args)
  _check_processes(args)
  _check_paths(args)


def parse_args(argv=None) -> argparse.Namespace:
  """The checked arguments; ``schedule_steps`` defaults to ``steps``."""
  args = parser().parse_args(argv)
  check_args(args)
  if args.schedule_steps is None:
    args.schedule_steps = args.steps
  return args


def set_cpu_devices(count: int) -> None:
  """Asks XLA for ``count`` simulated CPU devices; call before importing jax."""
  if count > 0:
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
