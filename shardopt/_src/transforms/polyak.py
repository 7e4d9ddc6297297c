"""Simple reshapings of the update direction: optimistic gradients, Polyak's
step size, normalisation by the update norm and gradient centralisation.
"""

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src import tree_reductions

__all__ = [
    "scale_by_polyak",
]

_POLYAK_VARIANTS = ("sps", "sps+")


def scale_by_polyak(
    f_min: jax.typing.ArrayLike = 0.0,
    max_learning_rate: jax.typing.ArrayLike = 1.0,
    eps: jax.typing.ArrayLike = 0.0,
    variant: str = "sps",
) -> base.GradientTransformationExtraArgs:
  """Scales by Polyak's step size ``min((f - f_min) / (||g||^2 + eps), max_learning_rate)``.

  ``update`` needs the keyword ``value`` (the objective at the params);
  ``variant="sps+"`` clips a negative gap ``f - f_min`` to zero. A vanishing
  denominator gives a zero step.

  Args:
    f_min: a lower bound of the objective (default 0.0).
    max_learning_rate: upper bound of the step size (default 1.0).
    eps: added to the squared gradient norm (default 0.0).
    variant: ``"sps"`` (default) or ``"sps+"``; another value raises
      ValueError.

  Returns:
    A stateless ``GradientTransformationExtraArgs`` whose ``update`` takes
    ``value=``.

  References:
    Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive
    Learning Rate for Fast Convergence", AISTATS 2021
    (https://arxiv.org/abs/2002.10542).
  """
  if variant not in _POLYAK_VARIANTS:
    raise ValueError(
        f"scale_by_polyak: unknown variant {variant!r}; use one of"
        f" {_POLYAK_VARIANTS}"
    )

  def update_fn(updates, state, params=None, *, value, **extra_args):
    del params, extra_args
    sq_norm = tree_reductions.tree_sum(jax.tree.map(numerics.abs_sq, updates))
    gap = jnp.array(value - f_min).astype(sq_norm.dtype)
    if variant == "sps+":
      gap = jnp.maximum(gap, 0.0)
    denominator = sq_norm + eps
    step = jnp.where(
        denominator <= jnp.finfo(float).eps,
        jnp.array(0.0),
        jnp.minimum(gap / denominator, max_learning_rate),
    )
    return tree_math.tree_scale(step, updates), state

  return base.GradientTransformationExtraArgs(base.init_empty_state, update_fn)
