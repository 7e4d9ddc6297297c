"""MADGRAD: momentumised, adaptive, dual-averaged gradients."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.constraints import require_params
from shardopt._src.transforms.weight_decay import add_decayed_weights
from shardopt._src.wrappers.combine import chain

__all__ = ["MadgradState", "madgrad", "scale_by_madgrad"]


@moments.declare_moments(grad_sum_sq=moments.NONNEGATIVE, s=moments.SIGNED)
class MadgradState(NamedTuple):
  """The step count, the weighted sums of squared gradients and of
  gradients (``s``), and the initial params ``x0``."""

  count: jax.Array
  grad_sum_sq: base.Updates
  s: base.Updates
  x0: base.Params


def scale_by_madgrad(
    learning_rate: base.ScalarOrSchedule,
    momentum: float = 0.9,
    eps: float = 1e-6,
) -> base.GradientTransformation:
  """The MADGRAD step: the dual average ``z = x0 - s / (cbrt(v) + eps)``,
  then ``x <- (1 - momentum) * z + momentum * x``; the update is the change
  of ``x`` (it already includes the learning rate and its sign).

  ``s`` and ``v`` accumulate ``lambda_k * g`` and ``lambda_k * g^2`` with
  ``lambda_k = (lr + eps) * sqrt(k + 1)``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    momentum: the weight of the current params in the new ones.
    eps: added to the learning rate and to the cube root.

  Returns:
    A ``GradientTransformation`` whose state is a ``MadgradState``, every
    tree shaped and sharded like the params; its update needs the params.

  References:
    Defazio & Jelassi, "Adaptivity without Compromise: A Momentumized,
    Adaptive, Dual Averaged Gradient Method for Stochastic Optimization",
    JMLR 2022 (https://arxiv.org/abs/2101.11075).
  """

  def init_fn(params):
    return MadgradState(count=jnp.zeros([], jnp.int32),
                        grad_sum_sq=tree_math.tree_zeros_like(params),
                        s=tree_math.tree_zeros_like(params),
                        x0=jax.tree.map(lambda x: x, params))

  def update_fn(updates, state, params=None):
    require_params(params, "madgrad")
    lr = base.value_at(learning_rate, state.count) + eps
    weight = lr * jnp.sqrt(state.count + 1)
    grad_sum_sq = jax.tree.map(
        lambda v, g: v + (weight * g**2).astype(g.dtype), state.grad_sum_sq,
        updates)
    s = jax.tree.map(lambda acc, g: acc + (weight * g).astype(g.dtype), state.s,
                     updates)
    z = jax.tree.map(lambda x0, acc, v: x0 - acc / (jnp.cbrt(v) + eps),
                     state.x0, s, grad_sum_sq)
    new_updates = jax.tree.map(
        lambda z_, x: ((1 - momentum) * z_ + momentum * x) - x, z, params)
    return new_updates, MadgradState(count=numerics.safe_increment(state.count),
                                     grad_sum_sq=grad_sum_sq, s=s, x0=state.x0)

  return base.GradientTransformation(init_fn, update_fn)


def madgrad(
    learning_rate: base.ScalarOrSchedule,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    eps: float = 1e-6,
) -> base.GradientTransformationExtraArgs:
  """The MADGRAD optimizer: weight decay added to the gradient, then
  ``scale_by_madgrad``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    momentum: the weight of the current params in the new ones.
    weight_decay: rate of ``weight_decay * params`` added to the gradient.
    eps: added to the learning rate and to the cube root.

  Returns:
    A ``GradientTransformationExtraArgs``.

  References:
    Defazio & Jelassi, "Adaptivity without Compromise: A Momentumized,
    Adaptive, Dual Averaged Gradient Method for Stochastic Optimization",
    JMLR 2022 (https://arxiv.org/abs/2101.11075).
  """
  return chain(add_decayed_weights(weight_decay),
               scale_by_madgrad(learning_rate=learning_rate, momentum=momentum,
                                eps=eps))
