"""Prodigy: D-Adaptation's learning-rate estimate, grown faster."""

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

__all__ = ["ProdigyState", "prodigy"]


@moments.declare_moments(exp_avg=moments.SIGNED, exp_avg_sq=moments.NONNEGATIVE)
class ProdigyState(NamedTuple):
  """Adam's moments of ``d * g``, the weighted sum ``grad_sum``, the initial
  params ``params0``, the estimate ``estim_lr`` (``d``), its weighted
  numerator and the step count."""

  exp_avg: base.Updates
  exp_avg_sq: base.Updates
  grad_sum: base.Updates
  params0: base.Updates
  estim_lr: jax.typing.ArrayLike
  numerator_weighted: jax.typing.ArrayLike
  count: jax.typing.ArrayLike


def prodigy(
    learning_rate: base.ScalarOrSchedule = 1.0,
    betas: tuple[jax.typing.ArrayLike, jax.typing.ArrayLike] = (0.9, 0.999),
    beta3: jax.typing.ArrayLike | None = None,
    eps: jax.typing.ArrayLike = 1e-8,
    estim_lr0: jax.typing.ArrayLike = 1e-6,
    estim_lr_coef: jax.typing.ArrayLike = 1.0,
    weight_decay: jax.typing.ArrayLike = 0.0,
    safeguard_warmup: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Adam on ``d * g`` with ``d`` a growing estimate of the distance to the
  solution: ``d = max(d, coef * sum_k w_k <g_k, x0 - x_k> / |sum_k w_k d_k
  g_k|_1)``.

  Args:
    learning_rate: multiplies ``d`` (a scalar or a schedule; 1.0 as in the
      paper).
    betas: Adam's ``(b1, b2)``.
    beta3: decay of the estimate's sums (None: ``sqrt(b2)``).
    eps: added to the denominator's root, scaled by this step's updated
      ``d``.
    estim_lr0: the initial ``d``.
    estim_lr_coef: multiplies each new estimate.
    weight_decay: decoupled weight decay, scaled by the step size.
    safeguard_warmup: leave the learning rate (and bias correction) out of
      the gradient sum, which avoids an over-estimate during a warmup.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``ProdigyState``
    (per-param trees shaped and sharded like their params, replicated
    scalars); its update needs the params.

  References:
    Mishchenko & Defazio, "Prodigy: An Expeditiously Adaptive Parameter-Free
    Learner", ICML 2024 (https://arxiv.org/abs/2306.06101).
  """
  beta1, beta2 = betas
  beta3 = beta2**0.5 if beta3 is None else beta3

  def init_fn(params):
    dtype = tree_dtype(params, "lowest")
    return ProdigyState(
        exp_avg=tree_math.tree_zeros_like(params),
        exp_avg_sq=tree_math.tree_zeros_like(params),
        grad_sum=tree_math.tree_zeros_like(params), params0=params,
        estim_lr=jnp.asarray(estim_lr0, dtype=dtype),
        numerator_weighted=jnp.zeros((), dtype=dtype),
        count=jnp.zeros((), jnp.int32))

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    require_params(params, "prodigy")
    count = numerics.safe_increment(state.count)
    d = state.estim_lr
    correction = (1 - beta2**count) ** 0.5 / (1 - beta1**count)
    step_size = jnp.asarray(d * base.value_at(learning_rate, state.count)
                            * correction, dtype=d.dtype)
    scaled = tree_math.tree_scale(d, updates)
    inner = tree_math.tree_inner_product(
        updates, tree_math.tree_sub(state.params0, params))
    exp_avg = jax.tree.map(lambda m, dg: beta1 * m + (1 - beta1) * dg,
                           state.exp_avg, scaled)
    exp_avg_sq = jax.tree.map(lambda v, dg: beta2 * v + (1 - beta2) * dg * dg,
                              state.exp_avg_sq, scaled)
    sum_weight = d if safeguard_warmup else step_size
    grad_sum = jax.tree.map(lambda s, dg: beta3 * s + sum_weight * dg / estim_lr0,
                            state.grad_sum, scaled)
    numerator = beta3 * state.numerator_weighted
    numerator += d / estim_lr0 * step_size * inner
    denominator = tree_reductions.tree_sum(jax.tree.map(jnp.abs, grad_sum))
    estim_lr = jnp.maximum(d, estim_lr_coef * numerator / denominator)
    new_updates = jax.tree.map(
        lambda m, v, p: -weight_decay * step_size * p
        - step_size * m / (jnp.sqrt(v) + estim_lr * eps), exp_avg, exp_avg_sq,
        params)
    return new_updates, ProdigyState(exp_avg, exp_avg_sq, grad_sum,
                                     state.params0, estim_lr, numerator, count)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
