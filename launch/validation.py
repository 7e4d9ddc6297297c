"""Checks of the job that need jax: the mesh, the batch split, the layout, and
finite values (losses before they are logged, state before it is saved).

Each failure is a ``UsageError`` naming the flag (exit 2), or a
``NonFiniteError`` naming the step (exit 3), raised before anything is written.
"""

import contextlib
import math

import jax
import jax.numpy as jnp

from launch.cli import NonFiniteError
from launch.cli import UsageError
from launch.cli import keyword_values
from launch.optim import build_optimizer
import partitioning

__all__ = ["NonFiniteGuard", "as_optimizer_error", "as_usage_error", "checked_mesh",
           "checked_optimizer"]

_AXES = ("data", "model")


@contextlib.contextmanager
def as_usage_error(flags: str):
  """Turns a ValueError (bad mesh, partition rules, optimizer keyword) into a
  UsageError that names ``flags``."""
  try:
    yield
  except UsageError:
    raise
  except ValueError as e:
    message = " ".join(str(e).split())
    raise UsageError(message if message.startswith("--") else f"{flags}: {message}") from e


@contextlib.contextmanager
def as_optimizer_error(args):
  """Turns any error of building and tracing the optimizer (its state, its update) into a
  UsageError naming the values the user gave it (``cli.keyword_values``), whatever its type (an
  IndexError of muon's ns_steps=0); with none given the error is the job's own, raised as
  it is."""
  try:
    yield
  except UsageError:
    raise
  except Exception as e:  # noqa: BLE001  (the values given fail; how is the optimizer's)
    given = [spelled for spelled, _, _ in keyword_values(args)]
    if not given:
      raise
    first = (str(e).strip().splitlines() or [""])[0]
    raise UsageError(f"--optimizer {args.optimizer} {' '.join(given)}: {args.optimizer} fails"
                     f" with these values ({type(e).__name__}: {first}); change them") from e


def checked_mesh(args) -> jax.sharding.Mesh:
  """The mesh of --mesh over every device, with --batch split evenly over data."""
  with as_usage_error(f"--mesh {args.mesh}"):
    sizes = partitioning.parse_mesh_shape(args.mesh, jax.device_count())
  if sorted(sizes) != sorted(_AXES):
    raise UsageError(f"--mesh {args.mesh}: needs exactly the axes data and model"
                     f" (e.g. data={jax.device_count()},model=1)")
  if args.batch % sizes["data"]:
    raise UsageError(f"--batch {args.batch}: must be a multiple of the data axis"
                     f" (data={sizes['data']} in --mesh {args.mesh}), e.g."
                     f" --batch {max(1, args.batch // sizes['data']) * sizes['data']}")
  return partitioning.make_mesh(sizes, axis_types=args.axis_types)


def checked_optimizer(args):
  """The optimizer of --optimizer and its flags (skipping non-finite updates
  with --skip-nonfinite)."""
  with as_usage_error(f"--optimizer {args.optimizer}"):
    tx = build_optimizer(args)
  if args.skip_nonfinite:
    import shardopt  # pylint: disable=import-outside-toplevel
    tx = shardopt.apply_if_finite(tx, max_consecutive_errors=2**30)
  return tx


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
