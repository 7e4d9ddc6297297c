"""Command line of the main job. Importing this module does not import jax, so
the job can set XLA_FLAGS (simulated CPU devices) from the arguments first.

``parse_args`` reads the command line alone; ``launch.flags.resolve`` (what
the job runs) adds ``--config FILE`` and, with ``--resume``, the run's saved
flags. Both check every argument that can be checked without devices
(``check_args``) and fill the defaults that depend on other flags
(``finish``: --lr and --schedule per optimizer, --schedule-steps,
--correction-bits); the mesh and what depends
on it are checked by the job before it creates anything. A bad argument is a
``UsageError``: ``train.main`` prints it as one ``error: ...`` line and exits 2.
"""

import argparse
import importlib.util
import math
import os
import pathlib

from launch import defaults

HYPERPARAMETER_FLAGS = ("b1", "b2", "eps", "weight_decay", "momentum")  # optimizer keywords

__all__ = ["EXIT_CODES", "EXIT_DONE", "EXIT_ERROR", "EXIT_NONFINITE", "EXIT_STORAGE",
           "EXIT_USAGE", "HYPERPARAMETER_FLAGS", "NonFiniteError", "StorageError",
           "UsageError", "blocking_part", "check_args", "explicit_flags", "finish",
           "keyword_values", "parse_args", "set_cpu_devices", "several_processes", "step_range",
           "url_packages"]

EXIT_DONE, EXIT_ERROR, EXIT_USAGE, EXIT_NONFINITE, EXIT_STORAGE = 0, 1, 2, 3, 4
EXIT_CODES = {  # the job's exit codes and what each means (--help lists them)
    str(EXIT_DONE): "done, or stopped by SIGTERM/SIGINT (with a checkpoint saved, or before step"
                    " 1 with nothing left behind)",
    str(EXIT_USAGE): "a bad argument, or a run folder that does not fit them or is in use by"
                     " another run (one error: line, nothing created or changed)",
    str(EXIT_NONFINITE): "a non-finite loss or state (no checkpoint of it written)",
    str(EXIT_STORAGE): "a file of the run could not be written: disk full, permission lost,"
                       " filesystem gone (one line naming the path and the newest complete"
                       " checkpoint)",
    "128 + N": "stopped at once by a second signal N (launch/stop.py)",
    str(EXIT_ERROR): "any other error (one line; --debug shows the traceback)",
}


class UsageError(Exception):
  """A bad argument or a state of the run folder the arguments do not fit (exit 2)."""


class NonFiniteError(Exception):
  """The loss or the training state became non-finite (exit 3)."""


class StorageError(Exception):
  """Writing the run's files failed: disk full, permission lost, filesystem gone (exit 4)."""


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
  g.add_argument("--axis-types", choices=("auto", "explicit"), default="auto",
                 help="the mesh axes' type: auto (XLA's partitioner lays out what the"
                 " shardings leave open) or explicit (every array's layout is part of"
                 " its type, jax.sharding.AxisType.Explicit); a resume may change it")
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
    g.add_argument("--" + name.replace("_", "-"), type=float, default=None,
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
                 " bits (shardopt.quantized_state, blocks fitted to the shards)")
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


# Checks ------------------------------------------------------------------

_AT_LEAST = {  # flag: smallest value
    "steps": 1, "batch": 1, "seq_len": 2, "layers": 1, "d_model": 1, "heads": 1,
    "head_dim": 1, "mlp": 1, "warmup_steps": 0, "checkpoint_every": 0,
    "keep_checkpoints": 1, "log_every": 1, "cpu_devices": 0, "schedule_steps": 1,
    "init_timeout": 1, "heartbeat_timeout": 1, "num_processes": 1, "process_id": 0,
    "eval_every": 0, "eval_batches": 1, "sample_every": 0, "seed": 0,
}
_AT_MOST = {  # flag: (value, why)
    "seed": (2**32 - 1, "jax's PRNG keys take 32-bit seeds"),
    "lr": (3.4028234663852886e38, "the largest float32: the schedule computes in float32"),
}

_SMALLEST_NORMAL_FLOAT32 = 1.1754943508222875e-38


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


_KEYWORD_RANGES = {  # optimizer keyword: (lowest, highest) value, by its flag or by --opt
    "b1": (0, 1), "b2": (0, 1), "momentum": (0, 1), "eps": (0, math.inf),
    "eps_root": (0, math.inf), "weight_decay": (0, math.inf),
}


def keyword_values(args: argparse.Namespace) -> list[tuple[str, str, float]]:
  """(as given, keyword, value) of each optimizer keyword the user gave: ``--b1 0.9``, then
  ``--opt ns_steps=5``."""
  flags = [(f"{_flag(name)} {getattr(args, name):g}", name, getattr(args, name))
           for name in HYPERPARAMETER_FLAGS if getattr(args, name) is not None]
  return flags + [(f"--opt {key}={value:g}", key, value) for key, value in args.opt]


def _check_warmup(args: argparse.Namespace, given: bool) -> None:
  """A --warmup-steps given must end before the warmup_cosine horizon; the default (or a
  resume's saved value) is shortened to the horizon - 1 (``warmup_in_use``), as --help says."""
  if given and args.schedule == "warmup_cosine" and args.warmup_steps >= args.schedule_steps:
    raise UsageError(f"--warmup-steps {args.warmup_steps}: must be below the schedule's horizon"
                     f" {args.schedule_steps} (--schedule-steps, which defaults to --steps)")


def _check_profile_window(args: argparse.Namespace) -> None:
  """A --profile-steps given must start at --steps or before (a resume's start step is known
  once restored: ``launch.profile`` warns there)."""
  first, last = step_range(args.profile_steps)
  if first > args.steps:
    raise UsageError(f"--profile-steps {first}:{last}: starts after the run's last step"
                     f" {args.steps} (--steps); choose a window that starts at {args.steps}"
                     " or before")


def _check_numbers(args: argparse.Namespace) -> None:
  for name, low in _AT_LEAST.items():
    value = getattr(args, name)
    if value is not None and value < low:
      raise UsageError(f"{_flag(name)} {value}: must be at least {low}")
  for name, (high, why) in _AT_MOST.items():
    value = getattr(args, name)
    if value is not None and math.isfinite(value) and value > high:  # inf: below
      raise UsageError(f"{_flag(name)} {value}: must be at most {high} ({why})")
  for name in ("lr", "peak_tflops"):
    value = getattr(args, name)
    if value is not None and not (math.isfinite(value) and value > 0):
      raise UsageError(f"{_flag(name)} {value}: must be a finite number > 0")
  if args.lr is not None and args.lr < _SMALLEST_NORMAL_FLOAT32:
    raise UsageError(f"--lr {args.lr}: must be at least {_SMALLEST_NORMAL_FLOAT32} (the"
                     " smallest normal float32: the schedule computes in float32, where a"
                     " smaller rate trains with 0 or a denormal)")
  for name in ("clip_norm", "final_lr_ratio"):
    value = getattr(args, name)
    if not (math.isfinite(value) and value >= 0):
      raise UsageError(f"{_flag(name)} {value}: must be a finite number >= 0")
  for given, name, value in keyword_values(args):
    low, high = _KEYWORD_RANGES.get(name, (-math.inf, math.inf))
    if not (math.isfinite(value) and low <= value <= high):
      bound = ("" if low == -math.inf else f" >= {low:g}" if high == math.inf
               else f" from {low:g} to {high:g}")
      raise UsageError(f"{given}: must be a finite number{bound}")
  if args.d_model % 2:
    raise UsageError(f"--d-model {args.d_model}: must be even (the position encoding pairs a sine"
                     f" and a cosine per frequency), e.g. --d-model {args.d_model + 1}")


def several_processes(args: argparse.Namespace) -> bool:
  """Whether the arguments join a multi-process job."""
  return bool(args.coordinator or args.auto_distributed or (args.num_processes or 1) > 1)


def _check_coordinator(coordinator: str) -> None:
  """--coordinator is HOST:PORT, the port a number from 1 to 65535."""
  host, colon, port = coordinator.rpartition(":")
  if not (colon and host.strip()):
    raise UsageError(f"--coordinator {coordinator}: not HOST:PORT (process 0's address and a"
                     " free port, e.g. 10.0.0.1:1234)")
  if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
    raise UsageError(f"--coordinator {coordinator}: the port must be a number from 1 to 65535")


def _check_processes(args: argparse.Namespace) -> None:
  if args.coordinator is not None:
    _check_coordinator(args.coordinator)
  if several_processes(args) and args.out is None:
    raise UsageError("a multi-process job needs --out (the same folder for every process)")
  if args.coordinator and (args.num_processes is None or args.process_id is None):
    raise UsageError("--coordinator needs --num-processes and --process-id")
  joining = [f"--num-processes {args.num_processes}"] if (args.num_processes or 1) > 1 else []
  joining += [f"--process-id {args.process_id}"] if args.process_id is not None else []
  if joining and not (args.coordinator or args.auto_distributed):  # else nothing joins them
    raise UsageError(f"{' '.join(joining)} {'need' if len(joining) > 1 else 'needs'}"
                     " --coordinator HOST:PORT (process 0's address, to join the other"
                     " processes) or --auto-distributed")
  if args.process_id is not None and args.num_processes is not None and (
      args.process_id >= args.num_processes):
    raise UsageError(f"--process-id {args.process_id}: must be below --num-processes"
                     f" {args.num_processes}")


def blocking_part(path: str) -> tuple[str, str] | None:
  """(the part of ``path``, what it is) that keeps a folder from being there: ``path`` or a
  folder above it that is a file, or a symbolic link to nothing; None when there is none."""
  for part in (pathlib.Path(path), *pathlib.Path(path).parents):
    if os.path.isdir(part):
      return None
    if os.path.islink(part) and not os.path.exists(part):
      return str(part), f"a symbolic link to {os.readlink(part)}, which does not exist"
    if os.path.exists(part):
      return str(part), "a file, not a folder"
  return None


def url_packages(scheme: str) -> tuple[str, ...]:
  """The packages through which etils.epath (which writes the checkpoints) reads
  ``scheme``:// paths, any one of them enough: the one fsspec's registry names for the
  scheme (gcsfs for gs://, s3fs for s3://), the one to install, then tensorflow (whose gfile
  epath prefers where it is installed)."""
  from fsspec.registry import known_implementations  # pylint: disable=import-outside-toplevel
  implementation = known_implementations.get(scheme, {}).get("class")
  return ((implementation.split(".")[0],) if implementation else ()) + ("tensorflow",)


def _readable_scheme(scheme: str) -> bool:
  """Whether etils.epath (which writes the checkpoints) makes a path of ``scheme``:// (it
  raised KeyError for schemes it does not know, GS:// included: schemes are matched as
  written)."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  try:
    epath.Path(f"{scheme}://bucket")
  except KeyError:
    return False
  return True


def _check_url(flag: str, path: str) -> None:
  """A URL whose scheme etils.epath does not read is refused (naming the lower-case scheme
  when that one is read); one read through packages none of which is installed
  (``url_packages``) is refused, naming the package and the command that installs it."""
  scheme, _, rest = path.partition("://")
  if not _readable_scheme(scheme):
    hint = (f"; write the scheme in lower case: {scheme.lower()}://{rest}"
            if scheme != scheme.lower() and _readable_scheme(scheme.lower()) else "")
    raise UsageError(f"{flag} {path}: etils.epath (which writes the checkpoints) reads no"
                     f" {scheme}:// paths{hint}")
  packages = url_packages(scheme)
  if not any(importlib.util.find_spec(name) for name in packages):
    raise UsageError(f"{flag} {path}: {scheme}:// paths need the package"
                     f" {packages[0]}, which is not installed: pip install {packages[0]}")


def check_paths(values: dict) -> None:
  """Refuses an --out or --checkpoint-dir in ``values`` that the job cannot use: empty, a
  URL as --out, a URL etils.epath cannot read (``_check_url``), a local path blocked by a
  file. Run before anything reads those folders (``launch.flags`` runs it on the given flags
  before a --resume reads the run's saved flags)."""
  for name in ("out", "checkpoint_dir"):
    path = values.get(name)
    if path is not None and not path.strip():
      raise UsageError(f"{_flag(name)} {path!r}: an empty path; name a folder")
    if name == "out" and path is not None and "://" in path:
      raise UsageError(f"--out {path}: must be a local folder (the metrics, the plot, the logs"
                       " and the run's lock are written there as local files); keep the"
                       f" checkpoints in a bucket with --checkpoint-dir {path.rstrip('/')}"
                       "/checkpoints")
    if path is not None and "://" in path:
      _check_url(_flag(name), path)
    blocked = blocking_part(path) if path is not None and "://" not in path else None
    if blocked is not None:
      part, what = blocked
      where = "" if part == str(pathlib.Path(path)) else f"{part} "
      raise UsageError(f"{_flag(name)} {path}: {where}is {what}; name another folder")
  _check_checkpoints_folder(values)


def _orbax_rewrites(path: str) -> bool:
  """Whether orbax would write the local folder ``path`` somewhere else: it normalizes every
  path it hands tensorstore by turning each 'gs:/' into 'gs://' (so that a gs:// URL
  survives ``os.path.normpath``), and tensorstore refuses a local path holding '//'
  (orbax 0.12: "Invalid file path" at the first save, after the training before it)."""
  return "gs:/" in os.path.abspath(path)


def _check_checkpoints_folder(values: dict) -> None:
  """Refuses a local checkpoint folder (--checkpoint-dir, else --out, which holds them by
  default) that orbax would write elsewhere (``_orbax_rewrites``)."""
  name = "checkpoint_dir" if values.get("checkpoint_dir") is not None else "out"
  path = values.get(name)
  if path is not None and "://" not in path and _orbax_rewrites(path):
    raise UsageError(f"{_flag(name)} {path}: orbax reads 'gs:/' in a local path as a gs:// URL"
                     " and cannot write the checkpoints there; for a bucket write gs://...,"
                     " for a local folder a path without 'gs:/'")


def _check_precision(args: argparse.Namespace) -> None:
  if args.correction_bits is not None and args.param_dtype != "bfloat16":
    raise UsageError(f"--correction-bits {args.correction_bits}: corrects bfloat16 params;"
                     " add --param-dtype bfloat16 or drop it")
  own_bits = [value for key, value in args.opt if key == "state_bits"]
  if args.state_bits is not None and own_bits:
    raise UsageError(f"--state-bits {args.state_bits} with --opt state_bits={own_bits[0]:g}: both"
                     " quantize the optimizer's state (the job's quantized_state around the"
                     " optimizer's own), which is refused; give one of them")


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError naming the first flag whose value cannot work."""
  _check_numbers(args)
  _check_precision(args)
  _check_processes(args)
  check_paths(vars(args))


def explicit_flags(argv: list[str]) -> dict:
  """The flags ``argv`` gives (by their names in the namespace), without defaults."""
  p = parser()
  for action in p._actions:  # pylint: disable=protected-access
    action.default = argparse.SUPPRESS
  return vars(p.parse_args(argv))


def _derive(args: argparse.Namespace) -> dict:
  """Fills the flags that default to a value derived from other flags and were left unset;
  returns {name: (value, why)} of those it filled."""
  derived = {}
  if args.lr is None:
    args.lr = defaults.learning_rate(args.optimizer)
    derived["lr"] = (args.lr, f"{args.optimizer}'s default")
  if args.schedule is None:
    args.schedule = defaults.schedule(args.optimizer)
    derived["schedule"] = (args.schedule, f"{args.optimizer}'s default")
  if args.schedule_steps is None:
    args.schedule_steps = args.steps
    derived["schedule_steps"] = (args.steps, "--steps")
  if args.param_dtype == "bfloat16" and args.correction_bits is None:
    args.correction_bits = 8
    derived["correction_bits"] = (8, "the default with --param-dtype bfloat16")
  return derived


def warmup_in_use(args: argparse.Namespace) -> int:
  """The warmup steps of the warmup_cosine schedule: --warmup-steps, at most the horizon - 1."""
  return min(args.warmup_steps, args.schedule_steps - 1)


def _warmup_note(args: argparse.Namespace, saved: bool) -> tuple[int, str]:
  """(value, why) of a --warmup-steps not given: the default, or a resume's saved value."""
  source = ("the run's saved" if saved else "the default") + f" {args.warmup_steps}"
  if args.schedule != "warmup_cosine":
    return args.warmup_steps, f"{source}; --schedule {args.schedule} has no warmup"
  return warmup_in_use(args), f"{source}, at most the schedule's horizon - 1"


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
  args.derived = _derive(args)
  _check_warmup(args, "warmup_steps" in given)
  args.given = sorted((given | set(given_before)) & set(vars(parser().parse_args([]))))
  if "warmup_steps" not in args.given:
    args.derived["warmup_steps"] = _warmup_note(args, saved="warmup_steps" in values)
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
