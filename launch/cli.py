"""Command line of the main job. Importing this module does not import jax, so
the job can set XLA_FLAGS (simulated CPU devices) from the arguments first.

``parse_args`` reads the command line alone; ``launch.flags.resolve`` (what
the job runs) adds ``--config FILE`` and, with ``--resume``, the run's saved
flags. Both check every argument that can be checked without devices
(``check_args``: ``launch.arg_checks``, ``launch.path_checks``) and fill the
defaults that depend on other flags (``finish``: --lr and --schedule per
optimizer, --schedule-steps, --correction-bits: ``launch.derived_flags``); the
mesh and what depends on it are checked by the job before it creates anything.
A bad argument is a ``UsageError`` (``launch.errors``, with the exit codes):
``train.main`` prints it as one ``error: ...`` line and exits 2; the errors and
the exit codes are importable from here too.
"""

import argparse
import os

from launch import defaults
from launch import derived_flags
from launch.arg_checks import HYPERPARAMETER_FLAGS
from launch.arg_checks import check_args
from launch.errors import EXIT_CODES
from launch.errors import EXIT_DONE
from launch.errors import EXIT_ERROR
from launch.errors import EXIT_NONFINITE
from launch.errors import EXIT_STORAGE
from launch.errors import EXIT_USAGE
from launch.errors import NonFiniteError
from launch.errors import StorageError
from launch.errors import UsageError
from launch.errors import flag

__all__ = ["EXIT_CODES", "EXIT_DONE", "EXIT_ERROR", "EXIT_NONFINITE", "EXIT_STORAGE",
           "EXIT_USAGE", "NonFiniteError", "StorageError", "UsageError", "check_args",
           "explicit_flags", "finish", "parse_args", "set_cpu_devices", "step_range"]


class _Parser(argparse.ArgumentParser):
  """argparse whose errors are a UsageError (one line), not usage text and exit."""

  def error(self, message):
    raise UsageError(f"{message} (see python -m launch.train --help)")


def _key_value(text: str) -> tuple[str, float]:
  key, eq, value = text.partition("=")
  if not eq or not key.isidentifier():
    raise argparse.ArgumentTypeError(f"{text!r} is not NAME=NUMBER (e.g. decay_rate=0.8)")
  try:
    return key, float(value)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number (NAME=NUMBER, e.g."
                                     " decay_rate=0.8)") from None


def step_range(text: str) -> tuple[int, int]:
  """``A:B`` (steps counted from 1, A <= B) as (A, B)."""
  first, colon, last = text.partition(":")
  try:
    first, last = int(first), int(last)
  except ValueError:
    first = last = None
  if not colon or first is None or not 1 <= first <= last:
    raise argparse.ArgumentTypeError(f"{text!r} is not FIRST:LAST with 1 <= FIRST <= LAST"
                                     " (e.g. 5:7)")
  return first, last


def _step_range(text: str) -> str:
  first, last = step_range(text)
  return f"{first}:{last}"


def _add_layout(p) -> None:
  g = p.add_argument_group("layout")
  g.add_argument("--mesh", default="data=4,model=2",
                 help="mesh shape over all devices of all processes, axes named data and"
                 " model; one axis may be -1")
  g.add_argument("--axis-types", default="auto",
                 help="the mesh axes' type: auto (XLA's partitioner lays out what the"
                 " shardings leave open), explicit (every array's layout is part of"
                 " its type, jax.sharding.AxisType.Explicit), or one per axis, e.g."
                 " data=explicit,model=auto; a resume may change it")
  g.add_argument("--rules", default="tp",
                 help="partition-rule preset of partitioning.decoder_rules: replicated,"
                 " fsdp (d_model over the data axis), tp (heads, mlp and vocab over the"
                 " model axis) or fsdp_tp")
  g.add_argument("--zero", action=argparse.BooleanOptionalAction, default=True,
                 help="also shard optimizer state over the data axis (ZeRO)")


def _add_optimizer(p) -> None:
  g = p.add_argument_group("optimizer")
  g.add_argument("--optimizer", default="adamw", help="a shardopt alias (see launch/optim.py)")
  g.add_argument("--lr", type=float, default=None,
                 help="peak learning rate; default per optimizer, the best of"
                 f" {defaults.SOURCE}: {defaults.describe()}")
  for name in HYPERPARAMETER_FLAGS:
    g.add_argument(flag(name), type=float, default=None,
                   help="passed to the optimizer if given (its default otherwise)")
  g.add_argument("--opt", type=_key_value, action="append", default=[], metavar="NAME=NUMBER",
                 help="any other keyword argument of the optimizer; repeatable")
  g.add_argument("--schedule", default=None,
                 choices=("constant", "cosine", "warmup_cosine", "linear"),
                 help="default warmup_cosine; constant for an optimizer with a line search"
                 " (lbfgs)")
  g.add_argument("--schedule-steps", type=int, default=None,
                 help="horizon of the cosine/linear schedule; default --steps. Keep it when"
                 " a resume extends --steps, so the learning rate does not jump")
  g.add_argument("--warmup-steps", type=int, default=20,
                 help="linear warmup of warmup_cosine; a value given must be below the horizon,"
                 " the default is shortened to it - 1")
  g.add_argument("--final-lr-ratio", type=float, default=0.1,
                 help="end learning rate as a fraction of --lr (cosine, linear)")
  g.add_argument("--clip-norm", type=float, default=1.0,
                 help="clip updates by global norm first; 0 turns it off")
  g.add_argument("--state-bits", type=int, choices=(8, 4), default=None,
                 help="store the optimizer's moments block-wise quantized in 8 or 4"
                 " bits (shardopt.quantized_state; its default portable blocks fit,"
                 " where they can, every mesh of the device count)")
  g.add_argument("--param-dtype", choices=("float32", "bfloat16"), default="float32",
                 help="the params' dtype, the one the model computes in; bfloat16 trains"
                 " against a float32 master weight kept as a correction in the optimizer"
                 " state (shardopt.low_precision_params)")
  g.add_argument("--correction-bits", type=int, choices=(8, 16, 0), default=None,
                 help="with --param-dtype bfloat16, bits of the master-weight correction per"
                 " param: 8 (the master to about 16 significant bits), 16 (the float32 master"
                 " exactly, but for a master halfway between two bfloat16 values, which loses"
                 " its last bit) or 0 (none: plain bfloat16 params); default 8")
  g.add_argument("--state-memory-kind", choices=("device", "pinned_host"), default="device",
                 help="where the optimizer state lives between steps; pinned_host: host"
                 " memory, moved to the device and back inside each step")


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
  g.add_argument("--log-every", type=int, default=10,
                 help="fetch the losses and norms, write metrics, every N steps")
  g.add_argument("--eval-every", type=int, default=50,
                 help="loss on the held-out slice of the corpus every N steps and at the"
                 " last step; 0: never")
  g.add_argument("--eval-batches", type=int, default=8,
                 help="held-out batches per evaluation (at most what the slice holds)")
  g.add_argument("--sample-every", type=int, default=0,
                 help="print a greedy sample of the model every N steps; 0: only at the end")
  g.add_argument("--profile-steps", type=_step_range, default=None, metavar="FIRST:LAST",
                 help="write a jax.profiler trace of these steps into OUT/plugins/profile (a"
                 " resume that starts inside the window: from its first step)")
  g.add_argument("--peak-tflops", type=float, default=None,
                 help="peak TFLOP/s per device for the MFU; default the vendor's bfloat16"
                 " figure of known accelerators, on CPU a measured estimate")
  g.add_argument("--debug", action="store_true", help="show tracebacks of errors")


def _add_processes(p) -> None:
  g = p.add_argument_group("processes and devices")
  g.add_argument("--cpu-devices", type=int, default=8,
                 help="simulated CPU devices per process; 0 leaves the platform alone"
                 " (TPU/GPU hosts)")
  g.add_argument("--coordinator", default=None,
                 help="HOST:PORT of process 0: join a multi-process job explicitly")
  g.add_argument("--num-processes", type=int, default=None, help="with --coordinator")
  g.add_argument("--process-id", type=int, default=None, help="with --coordinator")
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
      " cores with 8 simulated devices. Exit codes: "
      + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()) + ".",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  for add in (_add_layout, _add_optimizer, _add_model_and_data, _add_outputs, _add_processes,
              _add_config):
    add(p)
  return p


def _add_config(p) -> None:
  g = p.add_argument_group("configuration")
  g.add_argument("--config", default=None, metavar="FILE",
                 help="read flags from a TOML or JSON file (keys are the flag names, e.g."
                 " lr = 0.01); flags on the command line win")
  g.add_argument("--print-config", action="store_true",
                 help="print the resolved flags as TOML (a --config file) and exit; those"
                 " derived from other flags and not given (--lr, --schedule,"
                 " --schedule-steps, --warmup-steps, --correction-bits) as comments. Flags"
                 " a run refuses by themselves (the optimizer built from them, --seq-len and"
                 " --batch against the corpus) are refused with the run's error; the mesh"
                 " and the run folder are checked where the job runs")


def _check_profile_window(args: argparse.Namespace) -> None:
  """A --profile-steps given must start at --steps or before (a resume's start step is known
  once restored: ``launch.profile`` warns there)."""
  first, last = step_range(args.profile_steps)
  if first > args.steps:
    raise UsageError(f"--profile-steps {first}:{last}: starts after the run's last step"
                     f" {args.steps} (--steps); choose a window that starts at {args.steps}"
                     " or before")


def explicit_flags(argv: list[str]) -> dict:
  """The flags ``argv`` gives (by their names in the namespace), without defaults."""
  p = parser()
  for action in p._actions:  # pylint: disable=protected-access
    action.default = argparse.SUPPRESS
  return vars(p.parse_args(argv))


def finish(values: dict, given=None, given_before=()) -> argparse.Namespace:
  """The checked arguments: the parser's defaults updated by ``values``; --lr
  and --schedule default to the optimizer's (``defaults``), --schedule-steps
  to --steps, --correction-bits to 8 with --param-dtype bfloat16. ``given``:
  the names the user gave (default all of ``values``; a resume's saved flags
  are not given: a saved default --warmup-steps is shortened as a default,
  a saved --profile-steps is not checked against --steps). ``given_before``:
  the flags the run a resume continues was given (saved with its
  checkpoints): a --warmup-steps given then is the run's own, not a default.
  ``args.given`` lists both, for the checkpoints (``run_config.config_of``).

  ``args.derived`` maps each flag whose value depends on other flags and was
  not given (those, and --warmup-steps when not given) to (its resolved value,
  why): ``run_config.to_toml`` writes them as comments, not pinning them."""
  given = set(values if given is None else given)
  args = parser().parse_args([])
  args.out_is_newest_run = False  # --out is the run --resume found (``launch.flags``)
  vars(args).update(values)
  check_args(args)
  args.derived = derived_flags.derive(args)
  derived_flags.check_warmup(args, "warmup_steps" in given)
  args.given = sorted((given | set(given_before)) & set(vars(parser().parse_args([]))))
  if "warmup_steps" not in args.given:
    args.derived["warmup_steps"] = derived_flags.warmup_note(args, saved="warmup_steps" in values)
  if "profile_steps" in given:
    _check_profile_window(args)
  return args


def parse_args(argv=None) -> argparse.Namespace:
  """The checked arguments of the command line alone (no --config file, no
  saved flags: see ``launch.flags.resolve``)."""
  return finish(explicit_flags(argv))


def set_cpu_devices(count: int) -> None:
  """Asks XLA for ``count`` simulated CPU devices; call before importing jax."""
  if count > 0:
    flag = f"--xla_force_host_platform_device_count={count}"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
