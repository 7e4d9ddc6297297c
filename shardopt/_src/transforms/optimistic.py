"""Simple reshapings of the update direction: optimistic gradients, Polyak's
step size, normalisation by the update norm and gradient centralisation.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math

__all__ = [
    "ScaleByOptimisticGradientState",
    "scale_by_optimistic_gradient",
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

  Args:
    alpha: weight of the current gradient (default 1.0).
    beta: weight of the gradient's change ``g - g_prev`` (default 1.0).

  Returns:
    A ``GradientTransformation`` whose state is a
    ``ScaleByOptimisticGradientState``.

  References:
    Mokhtari et al., "A Unified Analysis of Extra-gradient and Optimistic
    Gradient Methods for Saddle Point Problems", AISTATS 2020
    (https://arxiv.org/abs/1901.08511).
  """

  def init_fn(params):
    return ScaleByOptimisticGradientState(
        is_initial_step=jnp.array(True),
        previous_gradient=tree_math.tree_zeros_like(params),
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
