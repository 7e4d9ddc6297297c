"""Simple reshapings of the update direction: optimistic gradients, Polyak's
step size, normalisation by the update norm and gradient centralisation.
"""

import jax

from shardopt._src import base
from shardopt._src import tree_math

__all__ = [
    "centralize",
    "normalize_by_update_norm",
]


def normalize_by_update_norm(
    scale_factor: jax.typing.ArrayLike = 1.0, eps: jax.typing.ArrayLike = 1e-6
) -> base.GradientTransformation:
  """Divides the updates by their global norm: a step of fixed length.

  The output is ``scale_factor * u / (||u|| + eps)`` with ``||u||`` the
  global L2 norm of all updates.

  Args:
    scale_factor: the length of the output (default 1.0).
    eps: added to the norm (default 1e-6).

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Nesterov, "Introductory Lectures on Convex Optimization", 2004,
    Sec. 3.2.3 (normalised gradient method).
  """

  def update_fn(updates, state, params=None):
    del params
    norm = (tree_math.global_norm(updates) + eps) / scale_factor
    return jax.tree.map(lambda g: g / norm, updates), state

  return base.GradientTransformation(base.init_empty_state, update_fn)


def _subtract_mean(g):
  if g.ndim <= 1:
    return g
  return g - g.mean(axis=tuple(range(1, g.ndim)), keepdims=True)


def centralize() -> base.GradientTransformation:
  """Gradient centralization: subtracts each update's mean over its non-leading axes.

  Updates of rank >= 2 become ``g - mean(g, axis=(1, ..., ndim - 1))``;
  scalars and vectors pass through.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Yong et al., "Gradient Centralization: A New Optimization Technique for
    Deep Neural Networks", ECCV 2020 (https://arxiv.org/abs/2004.01461).
  """
  return base.stateless_with_tree_map(lambda g, _: _subtract_mean(g))
