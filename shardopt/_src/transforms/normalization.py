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
  """Divides the updates by their global norm (plus ``eps``), times
  ``scale_factor``: a step of fixed length along the update direction.

  Reference: Nesterov, Introductory Lectures on Convex Optimization, 2004,
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
  """Subtracts from each update of rank >= 2 its mean over all but the
  leading axis (scalars and vectors pass through).

  Reference: Yong et al., Gradient Centralization: A New Optimization
  Technique for Deep Neural Networks, 2020 (https://arxiv.org/abs/2004.01461).
  """
  return base.stateless_with_tree_map(lambda g, _: _subtract_mean(g))
