"""Adan's direction: Nesterov-style momentum estimated from gradient differences.

Every moment and the previous gradient are built with ``zeros_like`` of the
params, so the state carries the params' shardings.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.adam import adam_direction

__all__ = [
    "ScaleByAdanState",
    "scale_by_adan",
]


def _counter() -> jax.Array:
  return jnp.zeros([], jnp.int32)


@moments.declare_moments(m=moments.SIGNED, v=moments.SIGNED, n=moments.NONNEGATIVE)
class ScaleByAdanState(NamedTuple):
  """Moments of gradients ``m``, of gradient differences ``v``, of the
  squared corrected gradient ``n``, the previous gradient ``g`` and step ``t``."""

  m: base.Updates
  v: base.Updates
  n: base.Updates
  g: base.Updates
  t: jax.Array  # int32 scalar


def scale_by_adan(
    b1: jax.typing.ArrayLike = 0.98,
    b2: jax.typing.ArrayLike = 0.92,
    b3: jax.typing.ArrayLike = 0.99,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
) -> base.GradientTransformation:
  """Adan's direction: Nesterov-style momentum estimated from gradient differences.

  With ``d = g_t - g_{t-1}`` (zero at the first step): ``m`` EMA of ``g``
  (``b1``), ``v`` EMA of ``d`` (``b2``), ``n`` EMA of ``(g + (1 - b2) *
  d)**2`` (``b3``), all debiased; the output is ``(m_hat + (1 - b2) *
  v_hat) / (sqrt(n_hat + eps_root) + eps)``.

  Args:
    b1: decay of the gradients' moment (default 0.98).
    b2: decay of the gradient differences' moment (default 0.92).
    b3: decay of the second moment (default 0.99).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdanState``.

  References:
    Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster
    Optimizing Deep Models", 2022 (https://arxiv.org/abs/2208.06677),
    Algorithm 1.
  """

  def init_fn(params):
    zeros = lambda: tree_math.tree_zeros_like(params)  # noqa: E731
    return ScaleByAdanState(m=zeros(), v=zeros(), n=zeros(), g=zeros(),
                            t=_counter())

  def update_fn(updates, state, params=None):
    del params
    first = state.t == 0
    diff = jax.tree.map(
        lambda g, prev: jnp.where(first, jnp.zeros_like(g), g - prev),
        updates, state.g,
    )
    m = tree_math.update_moment(updates, state.m, b1, 1)
    v = tree_math.update_moment(diff, state.v, b2, 1)
    corrected = jax.tree.map(lambda g, d: g + (1 - b2) * d, updates, diff)
    n = tree_math.update_moment_per_elem_norm(corrected, state.n, b3, 2)
    t = numerics.safe_increment(state.t)
    m_hat = tree_math.bias_correction(m, b1, t)
    v_hat = tree_math.bias_correction(v, b2, t)
    n_hat = tree_math.bias_correction(n, b3, t)
    direction = jax.tree.map(lambda a, b: a + (1 - b2) * b, m_hat, v_hat)
    direction = adam_direction(direction, n_hat, eps, eps_root)
    return direction, ScaleByAdanState(m=m, v=v, n=n, g=updates, t=t)

  return base.GradientTransformation(init_fn, update_fn)
