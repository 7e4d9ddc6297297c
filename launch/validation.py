"""Checks of the job that need jax: first those of the flags alone
(``checked_flags``: the corpus, the optimizer built; what --print-config runs),
then the mesh, the batch split, the layout, the optimizer with the values given,
and finite values (losses before they are logged, state before it is saved).

Each failure is a ``UsageError`` naming the flag (exit 2), or a
``NonFiniteError`` naming the step (exit 3), raised before anything is written.
"""

import argparse
import contextlib
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from launch import data
from launch.arg_checks import HYPERPARAMETER_FLAGS
from launch.arg_checks import keyword_values
from launch.errors import NonFiniteError
from launch.errors import UsageError
from launch.optim import build_optimizer
from launch.optim import with_param_dtype
from launch.optim import with_state_bits
import partitioning

__all__ = ["NonFiniteGuard", "as_usage_error", "blame_values", "built_optimizer", "checked_flags",
           "checked_layout", "checked_mesh", "checked_optimizer", "with_optimizer_defaults"]

_AXES = ("data", "model")


@contextlib.contextmanager
def as_usage_error(flags: str):
  """Turns a ValueError (a bad mesh, partition rules, a --seq-len or --batch the corpus does
  not fit) into a UsageError that names ``flags``."""
  try:
    yield
  except UsageError:
    raise
  except ValueError as e:
    message = " ".join(str(e).split())
    raise UsageError(message if message.startswith("--") else f"{flags}: {message}") from e


def with_optimizer_defaults(args: argparse.Namespace) -> argparse.Namespace:
  """``args`` without the optimizer keyword values given (``arg_checks.keyword_values``): the
  optimizer takes its own defaults."""
  return argparse.Namespace(**{**vars(args), **dict.fromkeys(HYPERPARAMETER_FLAGS), "opt": []})


def _succeeds(attempt, args: argparse.Namespace) -> bool:
  """Whether ``attempt(args)`` works; its warnings are not shown (a probe, not the run)."""
  try:
    with warnings.catch_warnings(record=True):
      attempt(args)
  except Exception:  # noqa: BLE001  (any failure: it fails with these arguments too)
    return False
  return True


def _shown_if_it_works(attempt, args: argparse.Namespace):
  """``attempt(args)``, its warnings shown only when it works, with the job's other notes on
  stdout (``warning: Category: message``): stderr holds a usage error's one line alone, also
  one found later (a resume's flags)."""
  with warnings.catch_warnings(record=True) as caught:
    result = attempt(args)
  for w in caught:
    print(f"warning: {w.category.__name__}: {w.message}", flush=True)
  return result


def blame_values(args: argparse.Namespace, attempt):
  """``attempt(args)`` (building the optimizer, planning its state, tracing its step). When it
  fails with optimizer keyword values given and ``attempt`` succeeds with the optimizer's
  defaults instead (``with_optimizer_defaults``), a UsageError naming the values; any other
  failure is raised as it is (the values are not to blame). Warnings are shown only when the
  first attempt works."""
  try:
    return _shown_if_it_works(attempt, args)
  except UsageError:
    raise
  except Exception as e:  # noqa: BLE001  (decided by the second attempt, not by the error)
    given = [spelled for spelled, _, _ in keyword_values(args)]
    if not given or not _succeeds(attempt, with_optimizer_defaults(args)):
      raise
    first = (str(e).strip().splitlines() or [""])[0]
    raise UsageError(f"--optimizer {args.optimizer} {' '.join(given)}: {args.optimizer} fails"
                     f" with these values ({type(e).__name__}: {first}), not with its"
                     " defaults; change them") from e


def checked_layout(args, num_devices: int | None = None) -> tuple[dict, dict]:
  """--mesh and --axis-types checked against each other: (axis -> size, axis ->
  ``jax.sharding.AxisType``) for the axes data and model. Given ``num_devices``, the sizes
  must fill them (a -1 resolved); without, only the flags' own form is checked
  (--print-config)."""
  with as_usage_error(f"--mesh {args.mesh}"):
    sizes = partitioning.parse_mesh_shape(args.mesh, num_devices)
  if sorted(sizes) != sorted(_AXES):
    raise UsageError(f"--mesh {args.mesh}: needs exactly the axes data and model"
                     f" (e.g. data={jax.device_count()},model=1)")
  with as_usage_error(f"--axis-types {args.axis_types}"):
    return sizes, dict(zip(sizes, partitioning.parse_axis_types(args.axis_types, sizes)))


def checked_mesh(args) -> jax.sharding.Mesh:
  """The mesh of --mesh and --axis-types over every device, with --batch split evenly over
  data."""
  sizes, axis_types = checked_layout(args, jax.device_count())
  if args.batch % sizes["data"]:
    raise UsageError(f"--batch {args.batch}: must be a multiple of the data axis"
                     f" (data={sizes['data']} in --mesh {args.mesh}), e.g."
                     f" --batch {max(1, args.batch // sizes['data']) * sizes['data']}")
  return partitioning.make_mesh(sizes, axis_types=axis_types)


def checked_optimizer(args):
  """The optimizer of --optimizer and its flags (``optim.build_optimizer``: a UsageError
  naming what cannot work), skipping non-finite updates with --skip-nonfinite."""
  tx = build_optimizer(args)
  if args.skip_nonfinite:
    import shardopt  # pylint: disable=import-outside-toplevel
    tx = shardopt.apply_if_finite(tx, max_consecutive_errors=2**30)
  return tx


def built_optimizer(args):
  """The optimizer of the arguments (``checked_optimizer``) with --state-bits and
  --param-dtype."""
  return with_param_dtype(args, with_state_bits(args, checked_optimizer(args)))


def checked_flags(args) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """The job's checks that need no device, first in a run and all that --print-config runs:
  --mesh and --axis-types in their own form, --seq-len and (with --eval-every) --batch
  against the corpus, then the optimizer built
  (``blame_values``; its warnings are left to the run's traced step). Returns (the corpus's
  training slice, its held-out slice, the held-out batches or None)."""
  checked_layout(args)
  train_bytes, held_out = data.split(data.load_corpus())
  with as_usage_error(f"--seq-len {args.seq_len}"):
    data.check_seq_len(args.seq_len, train_bytes, held_out)
  batches = None
  if args.eval_every:
    with as_usage_error(f"--batch {args.batch} --seq-len {args.seq_len}"):
      batches = data.eval_batches(held_out, args.eval_batches, args.batch, args.seq_len)
  with warnings.catch_warnings(record=True):
    blame_values(args, built_optimizer)
  return train_bytes, held_out, batches


def _skip_state(opt_state):
  """The state of --skip-nonfinite's ``apply_if_finite``, wherever the wrappers
  around it (--param-dtype bfloat16's ``low_precision_params``) put it."""
  import shardopt  # pylint: disable=import-outside-toplevel
  found = lambda x: isinstance(x, shardopt.ApplyIfFiniteState)
  return next(x for x in jax.tree.leaves(opt_state, is_leaf=found) if found(x))


def _in_device_memory(tree):
  """``tree`` with leaves kept in another memory (host-offloaded optimizer
  state) copied to device memory, where a program can read them."""
  return jax.tree.map(
      lambda x: x if x.sharding.memory_kind in (None, "device")
      else jax.device_put(x, x.sharding.with_memory_kind("device")), tree)


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


class NonFiniteGuard:
  """Stops the job at a non-finite loss, or with ``skip`` counts skipped steps."""

  def __init__(self, skip: bool, hint: str):
    self.skip, self.hint, self.skipped = skip, hint, 0

  def resume_from(self, opt_state) -> None:
    """Continues the count of skipped steps of a restored state."""
    if self.skip:
      self.skipped = int(_skip_state(opt_state).total_notfinite)

  def per_step(self, opt_state) -> tuple:
    """What to fetch with the step's loss: whether the update was skipped."""
    return (jnp.logical_not(_skip_state(opt_state).last_finite),) if self.skip else ()

  def fields(self, step: int, loss: float, extra: tuple) -> dict:
    """Metrics fields of ``step``; raises NonFiniteError when not skipping."""
    if self.skip:
      self.skipped += bool(extra[0])
      return {"skipped": bool(extra[0]), "skipped_steps": self.skipped}
    if not math.isfinite(loss):
      raise NonFiniteError(
          f"non-finite loss ({loss}) at step {step}: stopped; no checkpoint is written"
          f" from it (the saved ones hold finite values). {self.hint}")
    return {}

  def check_state(self, step: int, state) -> None:
    """Raises NonFiniteError when ``state`` holds NaN or Inf (not saved)."""
    if not bool(_all_finite(_in_device_memory(state))):
      raise NonFiniteError(
          f"non-finite params or optimizer state after step {step}: stopped without"
          f" saving it (the saved checkpoints hold finite values). {self.hint}")
