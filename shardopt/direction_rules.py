"""Simple reshapings of the update direction: optimistic gradients, Polyak's
step size, normalisation by the update norm and gradient centralisation."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt import base
from shardopt import numerics
from shardopt import tree

__all__ = [
    "ScaleByOptimisticGradientState",
    "centralize",
    "normalize_by_update_norm",
    "scale_by_optimistic_gradient",
    "scale_by_polyak",
]


class ScaleByOptimisticGradientState(NamedTuple):
  """Whether no step was taken yet, and the previous gradient."""

  is_initial_step: jax.Array  # bool scalar
  previous_gradient: base.Updates


def scale_by_optimistic_gradient(
    alpha: jax.typing.ArrayLike = 1.0, beta: jax.typing.ArrayLike = 1.0
) -> base.GradientTransformation:
  """Generalised optimistic gradient: ``(alpha + beta) * g - beta * g_prev``.

  At the first step the previous gradient is taken to be the current one.

  Reference: Mokhtari et al., A Unified Analysis of Extra-gradient and
  Optimistic Gradient Methods for Saddle Point Problems, 2019
  (https://arxiv.org/abs/1901.08511).
  """

  def init_fn(params):
    return ScaleByOptimisticGradientState(
        is_initial_step=jnp.array(True),
        previous_gradient=tree.tree_zeros_like(params),
    )

  def update_fn(updates, state, params=None):
    del params

    def optimistic(g, prev):
      prev = jnp.where(state.is_initial_step, g, prev)
      return (alpha + beta) * g - beta * prev

    directions = jax.tree.map(optimistic, updates, state.previous_gradient)
    return directions, ScaleByOptimisticGradientState(
        is_initial_step=jnp.array(False), previous_gradient=updates
    )

  return base.GradientTransformation(init_fn, update_fn)


_POLYAK_VARIANTS = ("sps", "sps+")


def scale_by_polyak(
    f_min: jax.typing.ArrayLike = 0.0,
    max_learning_rate: jax.typing.ArrayLike = 1.0,
    eps: jax.typing.ArrayLike = 0.0,
    variant: str = "sps",
) -> base.GradientTransformationExtraArgs:
  """Scales by Polyak's step size ``min((f - f_min) / (|g|^2 + eps), max_lr)``.

  ``update`` needs the keyword ``value`` (the objective at the params);
  ``variant="sps+"`` clips a negative gap ``f - f_min`` to zero. A vanishing
  denominator gives a zero step.

  Reference: Loizou et al., Stochastic Polyak Step-size for SGD: An Adaptive
  Learning Rate for Fast Convergence, 2021 (https://arxiv.org/abs/2002.10542).
  """
  if variant not in _POLYAK_VARIANTS:
    raise ValueError(
        f"scale_by_polyak: unknown variant {variant!r}; use one of"
        f" {_POLYAK_VARIANTS}"
    )

  def update_fn(updates, state, params=None, *, value, **extra_args):
    del params, extra_args
    sq_norm = tree.tree_sum(jax.tree.map(numerics.abs_sq, updates))
    gap = jnp.array(value - f_min).astype(sq_norm.dtype)
    if variant == "sps+":
      gap = jnp.maximum(gap, 0.0)
    denominator = sq_norm + eps
    step = jnp.where(
        denominator <= jnp.finfo(float).eps,
        jnp.array(0.0),
        jnp.minimum(gap / denominator, max_learning_rate),
    )
    return tree.tree_scale(step, updates), state

  return base.GradientTransformationExtraArgs(base.init_empty_state, update_fn)


def normalize_by_update_norm(
    scale_factor: jax.typing.ArrayLike = 1.0, eps: jax.typing.ArrayLike = 1e-6
) -> base.GradientTransformation:
  """Divides the updates by their global norm (plus ``eps``), times
  ``scale_factor``: a step of fixed length along the update direction.

  Reference: Nesterov, Introductory Lectures on Convex Optimization, 2004,
  Sec. 3.2.3 (normalised gradient method).
  """

  def update_fn(updates, state, params=None):
    del params
    norm = (tree.global_norm(updates) + eps) / scale_factor
    return jax.tree.map(lambda g: g / norm, updates), state

  return base.GradientTransformation(base.init_empty_state, update_fn)


def _subtract_mean(g):
  if g.ndim <= 1:
    return g
  return g - g.mean(axis=tuple(range(1, g.ndim)), keepdims=True)


def centralize() -> base.GradientTransformation:
  """Subtracts from each update of rank >= 2 its mean over all but the
  leading axis (scalars and vectors pass through).

  Reference: Yong et al., Gradient Centralization: A New Optimization
  Technique for Deep Neural Networks, 2020 (https://arxiv.org/abs/2004.01461).
  """
  return base.stateless_with_tree_map(lambda g, _: _subtract_mean(g))
