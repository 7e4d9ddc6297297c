"""Decoupled weight decay: adding ``weight_decay * params`` to the updates."""

from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src.transforms.constraints import require_params
from shardopt._src.wrappers.masking import masked

__all__ = [
    "AddDecayedWeightsState",
    "WeightDecaySchedule",
    "add_decayed_weights",
]

AddDecayedWeightsState = base.EmptyState


class WeightDecaySchedule(NamedTuple):
  """The step count, the argument of a weight-decay schedule."""

  count: jax.Array  # int32 scalar


def add_decayed_weights(
    weight_decay: base.ScalarOrSchedule = 0.0,
    mask: Any | Callable[[base.Params], Any] | None = None,
) -> base.GradientTransformation:
  """Adds ``weight_decay * param`` to each update (decoupled weight decay).

  Needs the params. With a schedule, the rate is ``weight_decay(count)``
  with ``count`` the updates applied so far.

  Args:
    weight_decay: a scalar or a schedule of the step count (default 0.0).
    mask: a tree (or prefix tree) of bools, or a function of the params
      returning one, marking the leaves that decay; ``None`` (default)
      decays all.

  Returns:
    A ``GradientTransformation``; its state is ``WeightDecaySchedule`` (the
    count) for a schedule, empty otherwise, wrapped in ``masked`` when a
    mask is given.

  References:
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
    (https://arxiv.org/abs/1711.05101).
  """
  scheduled = callable(weight_decay)

  def init_fn(params):
    del params
    if scheduled:
      return WeightDecaySchedule(count=jnp.zeros([], jnp.int32))
    return base.EmptyState()

  def update_fn(updates, state, params=None):
    require_params(params, "add_decayed_weights")
    if scheduled:
      rate = weight_decay(state.count)
      state = WeightDecaySchedule(numerics.safe_increment(state.count))
    elif isinstance(weight_decay, (int, float)) and weight_decay == 0.0:
      return updates, state
    else:
      rate = weight_decay
    updates = jax.tree.map(
        lambda g, p: None if g is None else g + rate * p,
        updates,
        params,
        is_leaf=lambda x: x is None,
    )
    return updates, state

  tx = base.GradientTransformation(init_fn, update_fn)
  if mask is None:
    return tx

  return masked(tx, mask)
