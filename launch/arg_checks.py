"""Checks of the argument values that need no devices (``check_args``): numbers in
range, optimizer keywords (``keyword_values``) in theirs, the precision flags together, the
flags that join a multi-process job, the run's folders (``launch.path_checks``). Each
refusal is a ``UsageError`` naming the first flag whose value cannot work.
"""

import argparse
import math

from launch.errors import UsageError
from launch.errors import flag
from launch.path_checks import check_paths

__all__ = ["HYPERPARAMETER_FLAGS", "check_args", "keyword_values", "several_processes"]

HYPERPARAMETER_FLAGS = ("b1", "b2", "eps", "weight_decay", "momentum")  # optimizer keywords

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

_KEYWORD_RANGES = {  # optimizer keyword: (lowest, highest) value, by its flag or by --opt
    "b1": (0, 1), "b2": (0, 1), "momentum": (0, 1), "eps": (0, math.inf),
    "eps_root": (0, math.inf), "weight_decay": (0, math.inf),
}


def keyword_values(args: argparse.Namespace) -> list[tuple[str, str, float]]:
  """(as given, keyword, value) of each optimizer keyword the user gave: ``--b1 0.9``, then
  ``--opt ns_steps=5``."""
  flags = [(f"{flag(name)} {getattr(args, name):g}", name, getattr(args, name))
           for name in HYPERPARAMETER_FLAGS if getattr(args, name) is not None]
  return flags + [(f"--opt {key}={value:g}", key, value) for key, value in args.opt]


def _check_numbers(args: argparse.Namespace) -> None:
  for name, low in _AT_LEAST.items():
    value = getattr(args, name)
    if value is not None and value < low:
      raise UsageError(f"{flag(name)} {value}: must be at least {low}")
  for name, (high, why) in _AT_MOST.items():
    value = getattr(args, name)
    if value is not None and math.isfinite(value) and value > high:  # inf: below
      raise UsageError(f"{flag(name)} {value}: must be at most {high} ({why})")
  for name in ("lr", "peak_tflops"):
    value = getattr(args, name)
    if value is not None and not (math.isfinite(value) and value > 0):
      raise UsageError(f"{flag(name)} {value}: must be a finite number > 0")
  if args.lr is not None and args.lr < _SMALLEST_NORMAL_FLOAT32:
    raise UsageError(f"--lr {args.lr}: must be at least {_SMALLEST_NORMAL_FLOAT32} (the"
                     " smallest normal float32: the schedule computes in float32, where a"
                     " smaller rate trains with 0 or a denormal)")
  for name in ("clip_norm", "final_lr_ratio"):
    value = getattr(args, name)
    if not (math.isfinite(value) and value >= 0):
      raise UsageError(f"{flag(name)} {value}: must be a finite number >= 0")
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
