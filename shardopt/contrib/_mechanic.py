"""Mechanic: a learning-rate tuner wrapped around any optimizer."""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src import tree_reductions
from shardopt._src.transforms.constraints import require_params
from shardopt._src.tree_dtypes_random import tree_dtype

__all__ = ["MechanicState", "mechanize"]


class MechanicState(NamedTuple):
  """The base optimizer's state, the step count, the per-beta tuner
  statistics ``r``, ``m``, ``v``, the scales ``s`` (``num_betas`` each,
  replicated) and the reference params ``x0``."""

  base_optimizer_state: base.OptState
  count: jax.typing.ArrayLike
  r: jax.typing.ArrayLike
  m: jax.typing.ArrayLike
  v: jax.typing.ArrayLike
  s: jax.typing.ArrayLike
  x0: base.Updates


def mechanize(
    base_optimizer: base.GradientTransformation,
    weight_decay: jax.typing.ArrayLike = 0.01,
    eps: jax.typing.ArrayLike = 1e-8,
    s_init: jax.typing.ArrayLike = 1e-6,
    num_betas: int = 6,
) -> base.GradientTransformationExtraArgs:
  """Scales ``base_optimizer``'s displacement from ``x0`` by a learned
  ``sum(s)``, tuned online by ``num_betas`` coin-betting learners.

  The new params are ``x0 - sum(s) * (delta_prev - u)`` where ``u`` is the
  base optimizer's update and ``delta_prev = (x0 - x) / sum(s)``; the update
  returned is their difference from the current params.

  Args:
    base_optimizer: the optimizer whose step size is tuned (its learning
      rate should be that of a well-tuned run, Mechanic rescales it).
    weight_decay: the tuner's weight decay on the reward's gradient.
    eps: a small constant for numerical stability.
    s_init: the initial scale (of the ``num_betas`` learners together).
    num_betas: the number of betas ``1 - 0.1**k``, ``k = 1..num_betas``.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``MechanicState``
    (``x0`` shaped and sharded like the params; the tuner's vectors of
    ``num_betas`` scalars replicated); its update needs the params.

  References:
    Cutkosky et al., "Mechanic: A Learning Rate Tuner", NeurIPS 2023
    (https://arxiv.org/abs/2306.00144).
  """
  base_optimizer = base.with_extra_args_support(base_optimizer)

  def init_fn(params):
    dtype = tree_dtype(params, "lowest")
    return MechanicState(
        base_optimizer_state=base_optimizer.init(params),
        count=jnp.zeros([], jnp.int32),
        r=jnp.zeros([num_betas], dtype=dtype),
        m=jnp.zeros([num_betas], dtype=dtype),
        v=jnp.zeros([num_betas], dtype=dtype),
        s=jnp.ones([num_betas], dtype=dtype) * s_init,
        x0=params)

  def update_fn(updates, state, params=None, **extra_args: Any):
    require_params(params, "mechanize")
    base_updates, base_state = base_optimizer.update(
        updates, state.base_optimizer_state, params, **extra_args)
    x0 = tree_math.tree_where(state.count == 0, params, state.x0)
    s_sum = jnp.sum(state.s)
    decay = (weight_decay * s_sum * tree_reductions.tree_norm(updates)
             / (tree_reductions.tree_norm(params) + eps))
    updates = jax.tree.map(lambda g, p: g + decay * p, updates, params)
    delta_prev = jax.tree.map(lambda x, start: (start - x) / (s_sum + eps),
                              params, x0)
    delta = tree_math.tree_sub(delta_prev, base_updates)
    h = tree_math.tree_inner_product(updates, delta_prev)
    clipped_h = jax.lax.clamp(-state.m, jnp.ones_like(state.m) * h, state.m)
    betas = jnp.array([1.0 - 0.1**k for k in range(1, num_betas + 1)],
                      dtype=state.s.dtype)
    m = jnp.maximum(betas * state.m, jnp.abs(h) + eps)
    v = betas**2 * state.v + h**2
    r = betas * state.r + clipped_h * state.s
    wealth = s_init / jnp.size(betas) * m + jnp.maximum(0.0, r)
    s = wealth / (jnp.sqrt(v) + eps)
    new_params = jax.tree.map(lambda start, d: start - jnp.sum(s) * d, x0,
                              delta)
    return tree_math.tree_sub(new_params, params), MechanicState(
        base_optimizer_state=base_state,
        count=numerics.safe_increment(state.count), r=r, m=m, v=v, s=s, x0=x0)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
