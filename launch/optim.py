"""Optimizers and learning-rate schedules by name, from the command line.

``build_optimizer(args)`` looks the name up among shardopt's aliases (any of
them: adam, adamw, adafactor, sgd, lion, ...; then shardopt.contrib's: muon,
shampoo, soap, ...), passes the hyperparameters the user gave (and only those,
so the alias's own defaults apply otherwise), each as the type its annotation
names (a count, a switch, a float; a keyword taking no number is refused), and
the learning rate as the alias's annotation declares it (a schedule, or a
number: then --schedule must be constant), and wraps it with global-norm
clipping when asked. An alias the job's step cannot train (``NOT_IN_THE_JOB``)
is refused, saying why. Arguments that cannot work are a ``UsageError``
naming them; what the alias itself raises is raised as it is.
"""

import argparse
import collections.abc
import inspect
import typing

import shardopt
from launch import arg_checks
from launch import derived_flags
from launch.errors import UsageError

__all__ = ["NOT_IN_THE_JOB", "build_optimizer", "build_schedule", "update_arguments",
           "with_param_dtype", "with_state_bits"]

# What an alias's update reads besides the gradients (``train_step``'s
# ``extra_args``), where it is not the loss, its gradients and the loss as a
# function of the params (``value_fn``: L-BFGS's and the line searches'):
# Sophia's Hessian estimate reads the objective as ``obj_fn``. (The two are
# not offered together: a line search passes a keyword it does not know on
# to ``value_fn``, which refuses it.)
_UPDATE_ARGUMENTS = {"sophia": ("obj_fn",)}
_DEFAULT_UPDATE_ARGUMENTS = ("value", "grad", "value_fn")


def update_arguments(optimizer: str) -> tuple[str, ...]:
  """The extra arguments the update of ``--optimizer optimizer`` reads."""
  return _UPDATE_ARGUMENTS.get(optimizer, _DEFAULT_UPDATE_ARGUMENTS)


def build_schedule(args: argparse.Namespace) -> shardopt.Schedule:
  """The learning rate per step, from --schedule, --lr, --schedule-steps (the
  horizon, default --steps) and --warmup-steps."""
  peak, steps, end = args.lr, args.schedule_steps, args.lr * args.final_lr_ratio
  if args.schedule == "constant":
    return shardopt.constant_schedule(peak)
  if args.schedule == "cosine":
    return shardopt.cosine_decay_schedule(peak, steps, alpha=args.final_lr_ratio)
  if args.schedule == "linear":
    return shardopt.linear_schedule(peak, end, steps)
  if args.schedule == "warmup_cosine":
    return shardopt.warmup_cosine_decay_schedule(
        0.0, peak, derived_flags.warmup_in_use(args), steps, end_value=end)
  raise UsageError(f"--schedule {args.schedule!r}: expected constant, cosine,"
                   " warmup_cosine or linear.")


def _alias(name: str):
  """The alias in shardopt.contrib (muon, soap), or else at shardopt's top level
  (looked up second: optax's deprecated top-level names warn on access)."""
  factory = getattr(shardopt.contrib, name, None) or getattr(shardopt, name, None)
  if not inspect.isfunction(factory) or "learning_rate" not in _params(factory):
    raise UsageError(f"--optimizer {name!r} is not a shardopt optimizer alias (a"
                     " function taking learning_rate, e.g. adamw, adafactor, sgd,"
                     " or one of shardopt.contrib, e.g. muon, shampoo, soap).")
  return factory


def _params(fn) -> dict:
  return dict(inspect.signature(fn).parameters)


def _number_kind(param) -> type | None:
  """What a number given for the parameter becomes: ``int`` where its annotation names int
  and no other type but None (``int``, ``int | None``), ``bool`` where it names bool alone,
  ``float`` where it names int or float among others (``b1: float | int | Array``), None
  where it takes no number (a dtype, a mask, a transformation, a string). Unannotated: the
  type of its default (bool, int, float; None for any other default, e.g. a string), float
  when it has no default or None."""
  annotation = param.annotation
  if annotation is inspect.Parameter.empty:
    if param.default is None or param.default is inspect.Parameter.empty:
      return float
    kind = type(param.default)
    return kind if kind in (bool, int, float) else None
  kinds = [kind for kind in typing.get_args(annotation) or (annotation,)
           if kind is not type(None)]
  if kinds in ([int], [bool]):
    return kinds[0]
  return float if int in kinds or float in kinds else None


JOB_SETS = {"learning_rate": "--lr and --schedule"}  # keywords the job passes itself


def _as_keyword_type(given: str, name: str, value, param, optimizer: str):
  """``--opt block_size=16`` (as ``given``) parses as 16.0: an int where the keyword takes one
  (a count: a fraction or a negative number there is an error), a bool where it takes one (0
  or 1); a UsageError where it takes no number (``mu_dtype``)."""
  kind = _number_kind(param) if param is not None else float  # unknown: reported by the caller
  said = f"{given}: {optimizer}'s {name}"
  if kind is None:
    raise UsageError(f"{said} is not a number ({_shown(param.annotation)}); --opt gives"
                     " numbers only, leave it out")
  if kind is int and not float(value).is_integer():
    raise UsageError(f"{said} takes an integer")
  if kind is int and value < 0:
    raise UsageError(f"{said} takes an integer >= 0")
  if kind is bool and value not in (0, 1):
    raise UsageError(f"{said} takes 0 (false) or 1 (true)")
  return kind(value)


def _shown(annotation) -> str:
  return annotation.__name__ if isinstance(annotation, type) else (
      str(annotation).replace("typing.", ""))


def optimizer_kwargs(args: argparse.Namespace, factory) -> dict:
  """The keyword arguments the user set (``arg_checks.keyword_values``), checked against the
  alias's signature and typed by it."""
  given = {}  # keyword: (as given, value)
  for spelled, key, value in arg_checks.keyword_values(args):
    if key in JOB_SETS:
      raise UsageError(f"--opt {key}: the job sets it (use {JOB_SETS[key]})")
    if key in given:
      raise UsageError(f"{spelled}: {key} is given twice (also by {given[key][0]})")
    given[key] = spelled, value
  accepted = _params(factory)
  kwargs = {k: _as_keyword_type(spelled, k, v, accepted.get(k), args.optimizer)
            for k, (spelled, v) in given.items()}
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    raise UsageError(
        f"--optimizer {args.optimizer}: does not take {', '.join(unknown)}; it takes "
        + ", ".join(k for k in accepted if k != "learning_rate") + ".")
  missing = [k for k, p in accepted.items() if k not in kwargs and k != "learning_rate"
             and p.default is inspect.Parameter.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  not_numbers = [k for k in missing if _number_kind(accepted[k]) is None]
  if not_numbers:
    raise UsageError(f"--optimizer {args.optimizer}: needs {', '.join(not_numbers)}, which is not"
                     " a number: the command line cannot give it; choose another optimizer")
  if missing:
    raise UsageError(f"--optimizer {args.optimizer}: needs {', '.join(missing)}; pass each as"
                     " --opt NAME=VALUE (numbers only)")
  return kwargs


def takes_schedule(factory) -> bool:
  """Whether the alias's ``learning_rate`` may be a schedule, as its
  annotation declares (rprop's is the step size it starts from, a number)."""
  annotation = _params(factory)["learning_rate"].annotation
  return annotation is inspect.Parameter.empty or any(
      typing.get_origin(kind) is collections.abc.Callable
      for kind in typing.get_args(annotation))


def _learning_rate(args: argparse.Namespace, factory):
  """--schedule and --lr as the alias takes them: a schedule, or the number
  --lr where its learning rate is a number and --schedule is constant."""
  if takes_schedule(factory):
    return build_schedule(args)
  if args.schedule != "constant":
    raise UsageError(f"--optimizer {args.optimizer}: its learning_rate is a number, not a"
                     f" schedule; pass --schedule constant (not {args.schedule})")
  return args.lr


# Aliases the job's training step cannot train, and why (refused before their keywords).
NOT_IN_THE_JOB = {
    "dpsgd": "it clips and noises the gradient of each example, and the job's step computes"
             " the batch's mean gradient (no per-example axis)",
}


def build_optimizer(args: argparse.Namespace) -> shardopt.GradientTransformation:
  """The optimizer from --optimizer, its hyperparameters, --schedule and --clip-norm; a
  UsageError naming what cannot work."""
  factory = _alias(args.optimizer)
  if args.optimizer in NOT_IN_THE_JOB:
    raise UsageError(f"--optimizer {args.optimizer}: cannot train in this job:"
                     f" {NOT_IN_THE_JOB[args.optimizer]}; choose another optimizer")
  tx = factory(learning_rate=_learning_rate(args, factory), **optimizer_kwargs(args, factory))
  if args.clip_norm > 0:
    tx = shardopt.chain(shardopt.clip_by_global_norm(args.clip_norm), tx)
  return tx


def with_state_bits(args: argparse.Namespace, tx):
  """``tx`` with its moments quantized to --state-bits, or ``tx`` when it is
  not given (the sharded optimizer fits the blocks to the state's layout)."""
  if getattr(args, "state_bits", None) is None:
    return tx
  return shardopt.quantized_state(tx, bits=args.state_bits)


def with_param_dtype(args: argparse.Namespace, tx):
  """``tx`` training bfloat16 params against float32 masters kept as
  --correction-bits corrections (``shardopt.low_precision_params``), with
  --param-dtype bfloat16; ``tx`` otherwise."""
  if getattr(args, "param_dtype", "float32") != "bfloat16":
    return tx
  return shardopt.low_precision_params(tx, correction_bits=args.correction_bits)
