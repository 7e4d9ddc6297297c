"""DoG and DoWG: step sizes from the distance travelled over the gradients."""

from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math
from shardopt._src import tree_reductions
from shardopt._src.transforms.constraints import require_params
from shardopt._src.transforms.scaling import scale_by_learning_rate
from shardopt._src.transforms.weight_decay import add_decayed_weights
from shardopt._src.tree_dtypes_random import tree_dtype
from shardopt._src.wrappers.combine import chain

__all__ = ["DoGState", "DoWGState", "dog", "dowg"]

InitStep = tuple[Literal["distance", "learning_rate", "heuristic"],
                 jax.typing.ArrayLike]


class DoGState(NamedTuple):
  """Whether the next step is the first, the initial params, the largest
  distance from them so far and the sum of squared gradient norms."""

  is_init_step: jax.Array
  init_params: base.Params
  max_dist: jax.Array
  sum_sq_norm_grads: jax.Array


def _initial_distance(init_step: InitStep, params) -> jax.typing.ArrayLike:
  kind, value = init_step
  if kind == "distance":
    return value
  if kind == "heuristic":
    return value * (1 + tree_reductions.tree_norm(params))
  if kind == "learning_rate":
    return 0.0
  raise ValueError(f"dog: init_step={init_step!r}; its first element must be"
                   " 'distance', 'learning_rate' or 'heuristic'")


def scale_by_dog(init_step: InitStep, eps: jax.typing.ArrayLike = 1e-8
                 ) -> base.GradientTransformation:
  """Scales the gradient by ``max_dist / sqrt(sum of |g|^2 + eps)`` (global
  norms over all params)."""

  def init_fn(params):
    dtype = tree_dtype(params, "lowest")
    return DoGState(
        is_init_step=jnp.asarray(True), init_params=params,
        max_dist=jnp.asarray(_initial_distance(init_step, params), dtype=dtype),
        sum_sq_norm_grads=jnp.asarray(0.0, dtype=dtype))

  def update_fn(updates, state, params=None):
    require_params(params, "dog")
    dist = tree_reductions.tree_norm(tree_math.tree_sub(state.init_params,
                                                        params))
    max_dist = jnp.maximum(state.max_dist, dist)
    sum_sq = state.sum_sq_norm_grads + tree_reductions.tree_norm(
        updates, squared=True)
    step = max_dist / jnp.sqrt(sum_sq + eps)
    if init_step[0] == "learning_rate":
      step = jnp.where(state.is_init_step, init_step[1], step)
    return tree_math.tree_scale(step, updates), DoGState(
        is_init_step=jnp.asarray(False), init_params=state.init_params,
        max_dist=max_dist, sum_sq_norm_grads=sum_sq)

  return base.GradientTransformation(init_fn, update_fn)


def _decay_or_identity(weight_decay, mask) -> base.GradientTransformation:
  if weight_decay is None:
    return base.identity()
  return add_decayed_weights(weight_decay, mask)


def dog(
    learning_rate: base.ScalarOrSchedule = 1.0,
    init_step: InitStep = ("heuristic", 1e-6),
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike | None = None,
    mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """DoG (Distance over Gradients): SGD with step size
  ``max_t |x_t - x_0| / sqrt(sum_t |g_t|^2)``.

  Args:
    learning_rate: multiplies the DoG step size (1.0: none).
    init_step: how the first step is set: ``("distance", r)`` (initial
      distance ``r``), ``("heuristic", c)`` (``r = c * (1 + |x_0|)``) or
      ``("learning_rate", lr)`` (a first step of ``lr``).
    eps: added under the root.
    weight_decay: rate of ``weight_decay * params`` added to the gradient
      (None: no decay stage).
    mask: which params decay (a tree of bools or a function of the params).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state includes a
    ``DoGState`` (the initial params shaped and sharded like the params,
    replicated scalars); its update needs the params.

  References:
    Ivgi et al., "DoG is SGD's Best Friend: A Parameter-Free Dynamic Step
    Size Schedule", ICML 2023 (https://arxiv.org/abs/2302.12022).
  """
  return chain(_decay_or_identity(weight_decay, mask),
               scale_by_dog(init_step, eps),
               scale_by_learning_rate(learning_rate))


class DoWGState(NamedTuple):
  """The initial params, the distance-weighted sum of squared gradient norms
  and the squared distance estimate."""

  init_params: base.Params
  weighted_sq_norm_grads: jax.Array
  estim_sq_dist: jax.Array


def scale_by_dowg(init_estim_sq_dist: jax.typing.ArrayLike | None = None,
                  eps: jax.typing.ArrayLike = 1e-4
                  ) -> base.GradientTransformation:
  """Scales the gradient by ``r^2 / (sqrt(sum_t r_t^2 |g_t|^2) + eps)``."""

  def init_fn(params):
    dtype = tree_dtype(params, "lowest")
    start = eps if init_estim_sq_dist is None else init_estim_sq_dist
    return DoWGState(init_params=params,
                     weighted_sq_norm_grads=jnp.asarray(0.0, dtype=dtype),
                     estim_sq_dist=jnp.asarray(start, dtype=dtype))

  def update_fn(updates, state, params=None):
    require_params(params, "dowg")
    sq_dist = tree_reductions.tree_norm(
        tree_math.tree_sub(state.init_params, params), squared=True)
    estim_sq_dist = jnp.maximum(state.estim_sq_dist, sq_dist)
    weighted = (estim_sq_dist * tree_reductions.tree_norm(updates, squared=True)
                + state.weighted_sq_norm_grads)
    step = estim_sq_dist / (jnp.sqrt(weighted) + eps)
    return tree_math.tree_scale(step, updates), state._replace(
        estim_sq_dist=estim_sq_dist, weighted_sq_norm_grads=weighted)

  return base.GradientTransformation(init_fn, update_fn)


def dowg(
    learning_rate: base.ScalarOrSchedule = 1.0,
    init_estim_sq_dist: jax.typing.ArrayLike | None = None,
    eps: jax.typing.ArrayLike = 1e-4,
    weight_decay: jax.typing.ArrayLike | None = None,
    mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """DoWG (Distance over Weighted Gradients): SGD with step size
  ``r_t^2 / sqrt(sum_s r_s^2 |g_s|^2)``, ``r_t`` the largest distance from
  the initial params so far.

  Args:
    learning_rate: multiplies the DoWG step size (1.0: none).
    init_estim_sq_dist: the initial squared distance estimate (None: ``eps``).
    eps: added to the denominator (and the default initial estimate).
    weight_decay: rate of ``weight_decay * params`` added to the gradient
      (None: no decay stage).
    mask: which params decay (a tree of bools or a function of the params).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state includes a
    ``DoWGState``; its update needs the params.

  References:
    Khaled et al., "DoWG Unleashed: An Efficient Universal Parameter-Free
    Gradient Descent Method", NeurIPS 2023 (https://arxiv.org/abs/2305.16284).
  """
  return chain(_decay_or_identity(weight_decay, mask),
               scale_by_dowg(init_estim_sq_dist, eps),
               scale_by_learning_rate(learning_rate))
