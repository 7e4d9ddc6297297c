"""Scaling updates by a constant, a learning rate or a schedule of the step."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics

__all__ = [
    "ScaleByScheduleState",
    "ScaleState",
    "scale",
    "scale_by_learning_rate",
    "scale_by_schedule",
]

ScaleState = base.EmptyState


class ScaleByScheduleState(NamedTuple):
  """The number of updates applied so far (the schedule's argument)."""

  count: jax.Array  # int32 scalar


def scale(step_size: jax.typing.ArrayLike) -> base.GradientTransformation:
  """Multiplies every update by the constant ``step_size``.

  Args:
    step_size: the factor.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    optax's ``scale``.
  """

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(lambda g: step_size * g, updates), state

  return base.GradientTransformation(base.init_empty_state, update_fn)


def scale_by_schedule(
    step_size_fn: base.Schedule,
) -> base.GradientTransformation:
  """Multiplies the updates by ``step_size_fn(count)``, ``count`` the steps so far.

  The step size is cast to each update's dtype before multiplying.

  Args:
    step_size_fn: a schedule: a function of the step count (an int32
      scalar, 0 at the first update) returning the factor.

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByScheduleState``
    (the count).

  References:
    optax's ``scale_by_schedule``.
  """

  def init_fn(params):
    del params
    return ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    del params
    step_size = step_size_fn(state.count)
    updates = jax.tree.map(
        lambda g: jnp.asarray(step_size, dtype=g.dtype) * g, updates
    )
    return updates, ScaleByScheduleState(numerics.safe_increment(state.count))

  return base.GradientTransformation(init_fn, update_fn)


def scale_by_learning_rate(
    learning_rate: base.ScalarOrSchedule | None = None,
    *,
    flip_sign: bool = True,
) -> base.GradientTransformation:
  """Multiplies the updates by ``-learning_rate`` (``+learning_rate`` if not ``flip_sign``).

  Args:
    learning_rate: a scalar or a schedule of the step count; ``None``
      (default) leaves the updates untouched (identity).
    flip_sign: whether to negate, so that the updates descend (default
      True; keyword only).

  Returns:
    A ``GradientTransformation``: ``scale`` for a scalar,
    ``scale_by_schedule`` for a schedule, ``identity`` for ``None``.

  References:
    optax's ``scale_by_learning_rate``.
  """
  if learning_rate is None:
    return base.identity()
  sign = -1 if flip_sign else 1
  if callable(learning_rate):
    return scale_by_schedule(lambda count: sign * learning_rate(count))
  return scale(sign * learning_rate)
