"""DoG: a learning-rate-free step size, distance travelled over gradient norm.

Layer-wise DoG (LDoG): for each param array, the step size is the largest
distance the param has moved from its initial value so far, divided by the
root of the sum of the squared gradient norms seen so far. The state keeps
the initial params (sharded like the params) and two scalars per array.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math

__all__ = [
    "ScaleByDistanceOverGradientsState",
    "scale_by_distance_over_gradients",
]


class ScaleByDistanceOverGradientsState(NamedTuple):
  """Per param array: the largest distance from the start, the running sum
  of squared gradient norms (shape (1,), as optax's); and the initial
  params."""

  max_dist: base.OptState
  grad_sum_of_squares: base.OptState
  init_params: base.OptState


def _distance(x, y=0.0) -> jax.Array:
  return jnp.sqrt(jnp.sum(jnp.square(x - y)))


def _zero_sum(x) -> jax.Array:
  """A zero of shape (1,) (optax's), in at least float32, to sum the squared
  norms of ``x``'s gradients in."""
  return jnp.zeros((1,), jnp.promote_types(x.dtype, jnp.float32))


def scale_by_distance_over_gradients(
    reps_rel: jax.typing.ArrayLike = 1e-6,
    eps: jax.typing.ArrayLike = 1e-8,
    param_dtype=jnp.float32,
    global_scale: jax.typing.ArrayLike = 1.0,
) -> base.GradientTransformation:
  """Layer-wise DoG: a parameter-free step size from distance over gradients.

  Per param array the output is ``g * global_scale * d / sqrt(G + eps)``,
  with ``d`` the largest distance of the param from its initial value (at
  least ``reps_rel * (1 + |x_0|)``) and ``G`` the sum of squared gradient
  norms so far. ``update`` needs the params.

  Args:
    reps_rel: sets the first step's distance, ``reps_rel * (1 + |x_0|)``;
      the authors suggest 1e-4 with batch norm, 1e-6 (default) otherwise.
    eps: added under the square root (default 1e-8).
    param_dtype: dtype of the stored initial params (default float32).
    global_scale: multiplies every step (default 1.0; -1.0 turns it into a
      descent step).

  Returns:
    A ``GradientTransformation`` whose state is a
    ``ScaleByDistanceOverGradientsState`` (per-param scalars and the initial
    params).

  References:
    Ivgi et al., "DoG is SGD's Best Friend: A Parameter-Free Dynamic Step
    Size Schedule", ICML 2023 (https://arxiv.org/abs/2302.12022).
  """

  def init_fn(params):
    return ScaleByDistanceOverGradientsState(
        max_dist=jax.tree.map(lambda x: reps_rel * (1 + _distance(x)), params),
        grad_sum_of_squares=jax.tree.map(_zero_sum, params),
        init_params=tree_math.tree_cast(params, param_dtype),
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "scale_by_distance_over_gradients: update needs params (the step"
          " size is the distance of the params from their initial values)")
    max_dist = jax.tree.map(lambda d, x, x0: jnp.maximum(d, _distance(x, x0)),
                            state.max_dist, params, state.init_params)
    sums = jax.tree.map(lambda s, g: s + jnp.sum(jnp.square(g)),
                        state.grad_sum_of_squares, updates)
    # Each update keeps its gradient's shape (optax's (1,) sum turns a scalar
    # param's update into a (1,) vector).
    updates = jax.tree.map(
        lambda g, d, s: jnp.reshape(global_scale * (d / jnp.sqrt(s + eps)) * g,
                                    jnp.shape(g)),
        updates, max_dist, sums)
    return updates, ScaleByDistanceOverGradientsState(max_dist, sums,
                                                      state.init_params)

  return base.GradientTransformation(init_fn, update_fn)
