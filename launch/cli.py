"""Command line of the main job. Importing this module does not import jax, so
the job can set XLA_FLAGS (simulated CPU devices) from the arguments first."""

import argparse
import os
import pathlib
import time

__all__ = ["default_out", "parse_args", "set_cpu_devices"]


def _key_value(text: str) -> tuple[str, float]:
  key, eq, value = text.partition("=")
  if not eq or not key.isidentifier():
    raise argparse.ArgumentTypeError(f"{text!r} is not NAME=NUMBER (e.g. decay_rate=0.8)")
  return key, float(value)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m launch.train",
      description="Train a byte-level transformer LM with sharded params and"
      " sharded optimizer state. The defaults finish in under 2 minutes on 2 CPU"
      " cores with 8 simulated devices.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
  g.add_argument("--warmup-steps", type=int, default=20)
  g.add_argument("--final-lr-ratio", type=float, default=0.1,
                 help="end learning rate as a fraction of --lr (cosine, linear)")
  g.add_argument("--clip-norm", type=float, default=1.0,
                 help="clip updates by global norm first; 0 turns it off")
  g = p.add_argument_group("model and data")
  g.add_argument("--layers", type=int, default=2)
  g.add_argument("--d-model", type=int, default=64)
  g.add_argument("--heads", type=int, default=4)
  g.add_argument("--head-dim", type=int, default=16)
  g.add_argument("--mlp", type=int, default=256)
  g.add_argument("--batch", type=int, default=32, help="global batch (sequences)")
  g.add_argument("--seq-len", type=int, default=65, help="bytes per sequence (inputs + 1)")
  g.add_argument("--steps", type=int, default=200)
  g.add_argument("--seed", type=int, default=0, help="init and data order")
  g = p.add_argument_group("outputs and checkpoints")
  g.add_argument("--out", default=None,
                 help="metrics.jsonl, loss.png and (by default) checkpoints go here;"
                 " default: a new runs/lm-<time> (with --resume: the newest runs/lm-*)")
  g.add_argument("--checkpoint-dir", default=None, help="default: OUT/checkpoints")
  g.add_argument("--checkpoint-every", type=int, default=50, help="0: only at the end")
  g.add_argument("--keep-checkpoints", type=int, default=3, help="keep the newest N")
  g.add_argument("--resume", action="store_true",
                 help="continue from the latest complete checkpoint")
  g.add_argument("--log-every", type=int, default=10)
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
  return p


def default_out(resume: bool) -> str:
  """A new timestamped run folder, or with ``resume`` the newest one."""
  if resume:
    earlier = sorted(pathlib.Path("runs").glob("lm-*"))
    if earlier:
      return str(earlier[-1])
  return time.strftime("runs/lm-%Y%m%d-%H%M%S")


def parse_args(argv=None) -> argparse.Namespace:
  args = _parser().parse_args(argv)
  if args.out is None:
    if args.coordinator or args.auto_distributed or (args.num_processes or 1) > 1:
      raise SystemExit("a multi-process job needs --out (the same folder for every process)")
    args.out = default_out(args.resume)
  if args.checkpoint_dir is None:
    args.checkpoint_dir = os.path.join(args.out, "checkpoints")
  return args


def set_cpu_devices(count: int) -> None:
  """Asks XLA for ``count`` simulated CPU devices; call before importing jax."""
  if count > 0:
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
