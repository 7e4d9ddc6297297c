"""SM3: adaptive scaling whose second moment is kept per axis, not per element.

Each param of rank k >= 2 keeps k covers, one vector per axis: cover i is
an upper bound of the accumulated squared gradients over every slice of the
param at a fixed index of axis i. An element's accumulator is the minimum of
its covers. Each cover is a reduction of the param over the other axes, so it
keeps its own axis's mesh axis. Vectors keep one cover, their full
accumulator; a scalar keeps one scalar cover (optax fails on scalars).

Reference: Anil, Gupta, Koren & Singer, "Memory-Efficient Adaptive
Optimization", NeurIPS 2019 (https://arxiv.org/abs/1901.11150).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import state_structure
from shardopt._src import tree_math

__all__ = [
    "ScaleBySM3State",
    "scale_by_sm3",
]


@moments.declare_moments(mu=moments.NONNEGATIVE, nu=moments.SIGNED)
class ScaleBySM3State(NamedTuple):
  """Per-axis covers of the accumulator (mu) and the momentum (nu)."""

  mu: base.Updates  # per param: a list with one cover vector per axis
  nu: base.Updates  # per param: momentum of the scaled updates


def _other_axes(axis: int, ndim: int) -> tuple[int, ...]:
  return tuple(i for i in range(ndim) if i != axis)


def _init_covers(param: jax.Array) -> list[jax.Array]:
  """One zero vector per axis, each a reduction of the param over the rest."""
  if param.ndim < 2:
    return [jnp.zeros_like(param)]
  zeros = jnp.zeros_like(param)
  return [zeros.sum(axis=_other_axes(i, param.ndim)) for i in range(param.ndim)]


def _covered_accumulator(covers: list[jax.Array], ndim: int) -> jax.Array:
  """Elementwise minimum of the covers, broadcast back to the param's shape."""
  if ndim < 2:
    return covers[0]
  expanded = [
      jnp.expand_dims(cover, _other_axes(i, ndim))
      for i, cover in enumerate(covers)
  ]
  return functools.reduce(jnp.minimum, expanded)


def _next_covers(accumulator: jax.Array) -> list[jax.Array]:
  """Per axis, the maximum of the accumulator over the other axes."""
  ndim = accumulator.ndim
  if ndim < 2:
    return [accumulator]
  return [jnp.max(accumulator, axis=_other_axes(i, ndim)) for i in range(ndim)]


def _reject_complex(params) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if jnp.iscomplexobj(leaf):
      raise ValueError(
          f"scale_by_sm3 does not support complex params; the param at "
          f"{jax.tree_util.keystr(path)} is {leaf.dtype}: split it into real "
          "and imaginary parts or use another optimizer for it."
      )


def scale_by_sm3(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 1.0,
    eps: jax.typing.ArrayLike = 1e-8,
) -> base.GradientTransformation:
  """Scales updates by SM3's cover-based inverse square root (SM3-II).

  For a param of rank ``k`` one accumulator vector per axis is kept (the
  covers). A coordinate's accumulator is ``b2 * min(its covers) + g**2``
  (``(1 - b2) * g**2`` when ``b2 < 1``); each cover then takes the maximum
  of the accumulators over its slice. The scaled update ``g / sqrt(acc +
  eps)`` (zero where ``acc`` is zero) goes through a momentum ``nu = b1 * nu
  + (1 - b1) * scaled``, which is the output.

  Args:
    b1: decay of the momentum of the scaled updates (default 0.9).
    b2: decay of the accumulated squared gradients; 1.0 (the default) sums
      them as in the paper, otherwise an EMA with weight ``1 - b2``.
    eps: added to the accumulator inside the inverse square root (default
      1e-8).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleBySM3State``
    (covers ``mu`` and momentum ``nu``).

  References:
    Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019
    (https://arxiv.org/abs/1901.11150), Algorithm SM3-II.
  """
  grad_sq_weight = 1.0 if b2 == 1.0 else 1.0 - b2

  def init_fn(params):
    _reject_complex(params)
    return ScaleBySM3State(
        mu=jax.tree.map(_init_covers, params),
        nu=tree_math.tree_zeros_like(params),
    )

  def accumulate(grad, covers):
    previous = _covered_accumulator(covers, grad.ndim)
    return grad_sq_weight * grad**2 + b2 * previous

  def rescale(grad, accumulator):
    inv_sqrt = jnp.where(
        accumulator > 0, jax.lax.rsqrt(accumulator + eps), 0.0)
    return grad * inv_sqrt

  @state_structure.conforming(init_fn)
  def update_fn(updates, state, params=None):
    del params
    accumulators = jax.tree.map(accumulate, updates, state.mu)
    scaled = jax.tree.map(rescale, updates, accumulators)
    nu = tree_math.update_moment(scaled, state.nu, b1, 1)
    mu = jax.tree.map(_next_covers, accumulators)
    return nu, ScaleBySM3State(mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)
