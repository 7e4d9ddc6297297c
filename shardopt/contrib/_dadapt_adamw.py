"""D-Adaptation AdamW: Adam whose learning rate is estimated on the fly."""

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

__all__ = ["DAdaptAdamWState", "dadapt_adamw"]


@moments.declare_moments(exp_avg=moments.SIGNED, exp_avg_sq=moments.NONNEGATIVE)
class DAdaptAdamWState(NamedTuple):
  """Adam's moments (``exp_avg`` already scaled by the step size), the
  weighted gradient sum ``grad_sum``, the distance estimate ``estim_lr`` and
  its weighted numerator, and the step count."""

  exp_avg: base.Updates
  exp_avg_sq: base.Updates
  grad_sum: base.Updates
  estim_lr: jax.typing.ArrayLike
  numerator_weighted: jax.typing.ArrayLike
  count: jax.typing.ArrayLike


def dadapt_adamw(
    learning_rate: base.ScalarOrSchedule = 1.0,
    betas: tuple[jax.typing.ArrayLike, jax.typing.ArrayLike] = (0.9, 0.999),
    eps: jax.typing.ArrayLike = 1e-8,
    estim_lr0: jax.typing.ArrayLike = 1e-6,
    weight_decay: jax.typing.ArrayLike = 0.0,
) -> base.GradientTransformationExtraArgs:
  """AdamW with D-Adaptation: the step size is ``d * learning_rate`` where
  ``d`` is a running lower bound on the distance to the solution.

  ``d`` starts at ``estim_lr0`` and only grows; the estimate is a ratio of
  two scalars reduced over all params (inner products and an L1 norm), so on
  a mesh each is an all-reduce of a scalar.

  Args:
    learning_rate: multiplies ``d`` (a scalar or a schedule; 1.0 as in the
      paper).
    betas: Adam's ``(b1, b2)``.
    eps: added to the denominator's root.
    estim_lr0: the initial ``d``.
    weight_decay: decoupled weight decay, scaled by the step size.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``DAdaptAdamWState`` (per-param moments shaped and sharded like their
    params, replicated scalars); its update needs the params.

  References:
    Defazio & Mishchenko, "Learning-Rate-Free Learning by D-Adaptation",
    ICML 2023 (https://arxiv.org/abs/2301.07733).
  """
  beta1, beta2 = betas
  root_beta2 = beta2**0.5

  def init_fn(params):
    dtype = tree_dtype(params, "lowest")
    return DAdaptAdamWState(
        exp_avg=tree_math.tree_zeros_like(params),
        exp_avg_sq=tree_math.tree_zeros_like(params),
        grad_sum=tree_math.tree_zeros_like(params),
        estim_lr=jnp.asarray(estim_lr0, dtype=dtype),
        numerator_weighted=jnp.zeros([], dtype=dtype),
        count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    require_params(params, "dadapt_adamw")
    count = numerics.safe_increment(state.count)
    correction = (1 - beta2**count) ** 0.5 / (1 - beta1**count)
    step_size = (state.estim_lr * base.value_at(learning_rate, state.count)
                 * correction).astype(state.numerator_weighted.dtype)
    weighted_sum = jax.tree.map(lambda s, v: s / (jnp.sqrt(v) + eps),
                                state.grad_sum, state.exp_avg_sq)
    inner = tree_math.tree_inner_product(updates, weighted_sum)
    exp_avg = jax.tree.map(
        lambda m, g: beta1 * m + (1 - beta1) * step_size * g, state.exp_avg,
        updates)
    exp_avg_sq = jax.tree.map(lambda v, g: beta2 * v + (1 - beta2) * g * g,
                              state.exp_avg_sq, updates)
    grad_sum = jax.tree.map(
        lambda s, g: root_beta2 * s + (1 - root_beta2) * step_size * g,
        state.grad_sum, updates)
    grad_sum_l1 = tree_reductions.tree_sum(jax.tree.map(jnp.abs, grad_sum))
    numerator = (root_beta2 * state.numerator_weighted
                 + (1 - root_beta2) * step_size * inner)
    estimate = numerator / ((1 - root_beta2) * grad_sum_l1)
    estim_lr = jnp.maximum(state.estim_lr, estimate)
    new_updates = jax.tree.map(
        lambda m, v, p: -weight_decay * step_size * p - m / (jnp.sqrt(v) + eps),
        exp_avg, exp_avg_sq, params)
    return new_updates, DAdaptAdamWState(exp_avg, exp_avg_sq, grad_sum,
                                         estim_lr, numerator, count)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
