"""Adadelta's rescaling: the RMS of past updates over the RMS of past gradients.

Both running averages are built with ``zeros_like`` of the params, so the
state carries the params' shardings.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import tree_math

__all__ = [
    "ScaleByAdaDeltaState",
    "scale_by_adadelta",
]


# At 4 bits scale_by_adadelta's update moved 25% off float state's in 5
# steps; 12% with e_x at 8 (benchmarks/results/quantized_floors.md):
# e_x, the average of squared steps, scales every step.
@moments.declare_moments(e_g=moments.NONNEGATIVE, e_x=moments.NONNEGATIVE,
                         min_bits={"e_x": 8})
class ScaleByAdaDeltaState(NamedTuple):
  """Running averages of squared gradients ``e_g`` and squared updates ``e_x``
  (8 bits at least under ``quantized_state``)."""

  e_g: base.Updates
  e_x: base.Updates


def scale_by_adadelta(
    rho: jax.typing.ArrayLike = 0.9, eps: jax.typing.ArrayLike = 1e-6
) -> base.GradientTransformation:
  """Adadelta's rescaling: ``g * sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps)``.

  ``E[g^2]`` (updated with this step's gradient) and ``E[dx^2]`` (of the
  outputs, updated after) are moving averages with decay ``rho``.

  Args:
    rho: decay of both moving averages (default 0.9).
    eps: added inside both roots (default 1e-6).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdaDeltaState``.

  References:
    Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012
    (https://arxiv.org/abs/1212.5701).
  """

  def init_fn(params):
    return ScaleByAdaDeltaState(
        e_g=tree_math.tree_zeros_like(params), e_x=tree_math.tree_zeros_like(params)
    )

  def update_fn(updates, state, params=None):
    del params
    e_g = tree_math.update_moment(updates, state.e_g, rho, 2)
    updates = jax.tree.map(
        lambda g, sq_g, sq_x: jnp.sqrt(sq_x + eps) / jnp.sqrt(sq_g + eps) * g,
        updates,
        e_g,
        state.e_x,
    )
    e_x = tree_math.update_moment(updates, state.e_x, rho, 2)
    return updates, ScaleByAdaDeltaState(e_g=e_g, e_x=e_x)

  return base.GradientTransformation(init_fn, update_fn)
