"""The flags whose default derives from other flags (``derive``): --lr and --schedule per
optimizer (``launch.defaults``), --schedule-steps from --steps, --correction-bits with
--param-dtype bfloat16; and the warmup of the warmup_cosine schedule, at most its
horizon - 1 (``warmup_in_use``).
"""

import argparse

from launch import defaults
from launch.errors import UsageError

__all__ = ["check_warmup", "derive", "warmup_in_use", "warmup_note"]


def check_warmup(args: argparse.Namespace, given: bool) -> None:
  """A --warmup-steps given must end before the warmup_cosine horizon; the default (or a
  resume's saved value) is shortened to the horizon - 1 (``warmup_in_use``), as --help says."""
  if given and args.schedule == "warmup_cosine" and args.warmup_steps >= args.schedule_steps:
    raise UsageError(f"--warmup-steps {args.warmup_steps}: must be below the schedule's horizon"
                     f" {args.schedule_steps} (--schedule-steps, which defaults to --steps)")


def derive(args: argparse.Namespace) -> dict:
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


def warmup_note(args: argparse.Namespace, saved: bool) -> tuple[int, str]:
  """(value, why) of a --warmup-steps not given: the default, or a resume's saved value."""
  source = ("the run's saved" if saved else "the default") + f" {args.warmup_steps}"
  if args.schedule != "warmup_cosine":
    return args.warmup_steps, f"{source}; --schedule {args.schedule} has no warmup"
  return warmup_in_use(args), f"{source}, at most the schedule's horizon - 1"
