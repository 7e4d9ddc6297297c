"""Reduce the learning rate when a monitored value stops improving.

Same names, signature, defaults, state and numbers as ``optax.contrib``'s
``reduce_on_plateau`` (0.2.8). The state is six scalars (replicated on a
mesh); the updates are scaled leaf by leaf, keeping their shardings.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src.tree_dtypes_random import tree_dtype

__all__ = ["ReduceLROnPlateauState", "reduce_on_plateau"]


class ReduceLROnPlateauState(NamedTuple):
  """The current scale and the plateau bookkeeping."""

  scale: jax.Array
  best_value: jax.Array
  plateau_count: jax.Array  # int32 scalar
  cooldown_count: jax.Array  # int32 scalar
  count: jax.Array  # int32 scalar: values accumulated so far
  avg_value: jax.Array


def _check_arguments(factor, rtol, atol) -> None:
  if not 0.0 < factor < 1.0:
    raise ValueError(f"factor={factor}: the scale is multiplied by factor on"
                     " a plateau, so it must lie in (0, 1)")
  if rtol < 0.0 or atol < 0.0:
    raise ValueError(f"rtol={rtol}, atol={atol}: both must be non-negative")
  if rtol == 0.0 and atol == 0.0:
    raise ValueError("rtol and atol are both 0: at least one must be "
                     "positive to tell an improvement")
  if rtol > 1.0:
    raise ValueError(f"rtol={rtol}: must be at most 1.0")


def reduce_on_plateau(
    factor: float = 0.1,
    patience: jax.typing.ArrayLike = 10,
    rtol: float = 1e-4,
    atol: float = 0.0,
    cooldown: jax.typing.ArrayLike = 0,
    accumulation_size: jax.typing.ArrayLike = 1,
    min_scale: jax.typing.ArrayLike = 0.0,
) -> base.GradientTransformationExtraArgs:
  """Scales the updates down by ``factor`` after ``patience`` non-improving
  values of ``value`` (the keyword argument of ``update``).

  Every ``accumulation_size`` calls the mean of the values passed is compared
  with the best so far: an improvement is a mean below
  ``(1 - rtol) * best - atol``.

  Args:
    factor: multiplier of the scale on a plateau, in (0, 1).
    patience: accumulated means without improvement that make a plateau.
    rtol: relative tolerance of an improvement.
    atol: absolute tolerance of an improvement.
    cooldown: accumulated means after a reduction during which plateaus are
      not counted.
    accumulation_size: number of values averaged before each comparison.
    min_scale: the scale never goes below this.

  Returns:
    A ``GradientTransformationExtraArgs`` whose update needs ``value=``.

  References:
    PyTorch's ``torch.optim.lr_scheduler.ReduceLROnPlateau``
    (https://pytorch.org/docs/stable/generated/torch.optim.lr_scheduler.ReduceLROnPlateau.html).
  """
  _check_arguments(factor, rtol, atol)

  def init_fn(params):
    highest = tree_dtype(params, "highest")
    return ReduceLROnPlateauState(
        scale=jnp.asarray(1.0, tree_dtype(params, "lowest")),
        best_value=jnp.asarray(float("inf"), highest),
        plateau_count=jnp.asarray(0, jnp.int32),
        cooldown_count=jnp.asarray(0, jnp.int32),
        count=jnp.asarray(0, jnp.int32),
        avg_value=jnp.asarray(0.0, highest))

  def compare(state):
    improved = state.avg_value < (1 - rtol) * state.best_value - atol
    best = jnp.where(improved, state.avg_value.astype(state.best_value.dtype),
                     state.best_value)
    plateau = jnp.where(improved, 0,
                        numerics.safe_increment(state.plateau_count))

    def cooling():
      return (jnp.asarray(0, jnp.int32), state.scale,
              state.cooldown_count - 1)

    def watching():
      reached = plateau == patience
      scale = jnp.maximum(jnp.where(reached, state.scale * factor,
                                    state.scale), min_scale)
      return (jnp.where(reached, 0, plateau), scale,
              jnp.where(reached, cooldown, 0).astype(jnp.int32))

    plateau, scale, cooldown_count = jax.lax.cond(
        state.cooldown_count > 0, cooling, watching)
    return ReduceLROnPlateauState(
        scale=scale, best_value=best.astype(state.best_value.dtype),
        plateau_count=plateau, cooldown_count=cooldown_count,
        count=jnp.asarray(0, jnp.int32),
        avg_value=jnp.asarray(0.0, state.avg_value.dtype))

  def update_fn(updates, state, params=None, *, value, **extra_args):
    del params, extra_args
    count = numerics.safe_increment(state.count)
    mean = (state.count * state.avg_value
            + jnp.astype(value, state.avg_value.dtype)) / count
    state = state._replace(avg_value=mean.astype(state.avg_value.dtype),
                           count=count)
    state = jax.lax.cond(count == accumulation_size, compare, lambda s: s,
                         state)
    return jax.tree.map(lambda g: state.scale * g, updates), state

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
