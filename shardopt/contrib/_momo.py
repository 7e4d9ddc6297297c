"""MoMo and MoMo-Adam: Polyak-type step sizes from a model of the loss."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src import tree_reductions
from shardopt._src.transforms.constraints import require_params
from shardopt._src.tree_dtypes_random import tree_dtype

__all__ = ["MomoAdamState", "MomoState", "momo", "momo_adam"]

# Below this squared norm of the momentum the step is zero (float64's eps,
# as in the reference implementation).
_TINY = float(jnp.finfo(float).eps)


@moments.declare_moments(exp_avg=moments.SIGNED)
class MomoState(NamedTuple):
  """The momentum ``exp_avg``, the averaged loss ``barf``, the averaged
  ``<g, x>`` (``gamma``), the loss lower bound ``lb`` and the step count."""

  exp_avg: base.Updates
  barf: jax.typing.ArrayLike
  gamma: jax.typing.ArrayLike
  lb: jax.typing.ArrayLike
  count: jax.typing.ArrayLike


@moments.declare_moments(exp_avg=moments.SIGNED, exp_avg_sq=moments.NONNEGATIVE)
class MomoAdamState(NamedTuple):
  """MomoState's fields plus Adam's second moment ``exp_avg_sq``."""

  exp_avg: base.Updates
  exp_avg_sq: base.Updates
  barf: jax.typing.ArrayLike
  gamma: jax.typing.ArrayLike
  lb: jax.typing.ArrayLike
  count: jax.typing.ArrayLike


def _require_value(value) -> None:
  if value is None:
    raise ValueError("momo: pass the loss of the current params as"
                     " update(..., value=loss); get it with"
                     " jax.value_and_grad")


def _scalars(params, lower_bound):
  dtype = tree_dtype(params, "lowest")
  zero = jnp.zeros([], dtype=dtype)
  return zero, zero, jnp.array(lower_bound, dtype=dtype)


def momo(
    learning_rate: base.ScalarOrSchedule = 1.0,
    beta: jax.typing.ArrayLike = 0.9,
    lower_bound: jax.typing.ArrayLike = 0.0,
    weight_decay: jax.typing.ArrayLike = 0.0,
    adapt_lower_bound: bool = False,
) -> base.GradientTransformationExtraArgs:
  """SGD with momentum whose step is the smaller of ``learning_rate`` and a
  Polyak step on the momentum model of the loss.

  ``update`` needs the params and the current loss as ``value=``.

  Args:
    learning_rate: the largest step (a scalar or a schedule).
    beta: decay of the momentum and of the loss and ``<g, x>`` averages.
    lower_bound: a lower bound of the loss (0 for most losses).
    weight_decay: decoupled weight decay.
    adapt_lower_bound: estimate the lower bound online, starting from
      ``lower_bound``.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``MomoState``
    (momentum shaped and sharded like the params, replicated scalars).

  References:
    Schaipp et al., "MoMo: Momentum Models for Adaptive Learning Rates",
    ICML 2024 (https://arxiv.org/abs/2305.07583).
  """

  def init_fn(params):
    barf, gamma, lb = _scalars(params, lower_bound)
    return MomoState(tree_math.tree_zeros_like(params), barf, gamma, lb,
                     jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params, *, value, **extra_args):
    del extra_args
    require_params(params, "momo")
    _require_value(value)
    b = jnp.where(state.count == 0, 0.0, beta)
    barf = b * state.barf + (1 - b) * jnp.asarray(value, dtype=state.barf.dtype)
    exp_avg = jax.tree.map(lambda m, g: b * m + (1 - b) * g, state.exp_avg,
                           updates)
    gamma = b * state.gamma + (1 - b) * tree_math.tree_inner_product(updates,
                                                                     params)
    sq_norm = tree_reductions.tree_norm(exp_avg, squared=True)
    inner = tree_math.tree_inner_product(exp_avg, params)
    lr = base.value_at(learning_rate, state.count)
    decay = 1 + lr * weight_decay
    lb = state.lb
    if adapt_lower_bound:
      cap = decay * (barf - gamma) + inner
      lb = jnp.where(cap < decay * state.lb,
                     jnp.maximum(cap / (2 * decay), lower_bound), state.lb)
    polyak = jnp.maximum(decay * (barf - lb - gamma) + inner, 0.0) / sq_norm
    polyak = jnp.where(sq_norm <= _TINY, 0.0, polyak)
    tau = jnp.minimum(lr, polyak)
    new_updates = jax.tree.map(
        lambda m, p: -(lr * weight_decay) / decay * p - tau * m, exp_avg, params)
    new_lb = state.lb
    if adapt_lower_bound:
      new_lb = jnp.maximum(barf + inner - gamma - 0.5 * tau * sq_norm,
                           lower_bound)
    return new_updates, MomoState(exp_avg=exp_avg, barf=barf, gamma=gamma,
                                  lb=new_lb,
                                  count=numerics.safe_increment(state.count))

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def momo_adam(
    learning_rate: base.ScalarOrSchedule = 1e-2,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    lower_bound: jax.typing.ArrayLike = 0.0,
    weight_decay: jax.typing.ArrayLike = 0.0,
    adapt_lower_bound: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Adam whose step is the smaller of ``learning_rate`` and a Polyak step on
  the momentum model of the loss, in Adam's preconditioned norm.

  ``update`` needs the params and the current loss as ``value=``.

  Args:
    learning_rate: the largest step (a scalar or a schedule).
    b1: decay of the momentum and of the loss and ``<g, x>`` averages.
    b2: decay of the second moment.
    eps: added to the preconditioner.
    lower_bound: a lower bound of the loss (0 for most losses).
    weight_decay: decoupled weight decay.
    adapt_lower_bound: estimate the lower bound online, starting from
      ``lower_bound``.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``MomoAdamState``
    (moments shaped and sharded like the params, replicated scalars).

  References:
    Schaipp et al., "MoMo: Momentum Models for Adaptive Learning Rates",
    ICML 2024 (https://arxiv.org/abs/2305.07583).
  """

  def init_fn(params):
    barf, gamma, lb = _scalars(params, lower_bound)
    return MomoAdamState(tree_math.tree_zeros_like(params),
                         tree_math.tree_zeros_like(params), barf, gamma, lb,
                         jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params, *, value, **extra_args):
    del extra_args
    require_params(params, "momo_adam")
    _require_value(value)
    count = numerics.safe_increment(state.count)
    barf = b1 * state.barf + (1 - b1) * jnp.asarray(value, dtype=state.barf.dtype)
    exp_avg = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.exp_avg,
                           updates)
    exp_avg_sq = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g,
                              state.exp_avg_sq, updates)
    bc2 = jnp.asarray(1 - b2**count, dtype=barf.dtype)
    precond = jax.tree.map(lambda v: eps + jnp.sqrt(v / bc2), exp_avg_sq)
    sq_norm = tree_math.tree_inner_product(exp_avg,
                                           tree_math.tree_div(exp_avg, precond))
    gamma = b1 * state.gamma + (1 - b1) * tree_math.tree_inner_product(updates,
                                                                       params)
    inner = tree_math.tree_inner_product(exp_avg, params)
    lr = base.value_at(learning_rate, state.count)
    bc1 = jnp.asarray(1 - b1**count, dtype=barf.dtype)
    decay = 1 + lr * weight_decay
    lb = state.lb
    if adapt_lower_bound:
      cap = decay * (barf - gamma) + inner
      lb = jnp.where(cap < decay * bc1 * state.lb,
                     jnp.maximum(cap / (2 * bc1 * decay), lower_bound), state.lb)
    polyak = jnp.maximum(decay * (barf - bc1 * lb - gamma) + inner, 0.0) / sq_norm
    polyak = jnp.where(sq_norm <= _TINY, 0.0, polyak)
    tau = jnp.minimum(lr / bc1, polyak)
    new_updates = jax.tree.map(
        lambda m, c, p: -(lr * weight_decay) / decay * p - tau * m / c, exp_avg,
        precond, params)
    new_lb = state.lb
    if adapt_lower_bound:
      new_lb = jnp.maximum((barf + inner - gamma - 0.5 * tau * sq_norm) / bc1,
                           lower_bound)
    return new_updates, MomoAdamState(exp_avg=exp_avg, exp_avg_sq=exp_avg_sq,
                                      barf=barf, gamma=gamma, lb=new_lb,
                                      count=count)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
