"""Clipping updates elementwise, per block (leaf) and by their global norm."""

import jax
import jax.numpy as jnp

from shardopt import base
from shardopt import numerics
from shardopt import tree

__all__ = [
    "ClipByGlobalNormState",
    "ClipState",
    "clip",
    "clip_by_block_rms",
    "clip_by_global_norm",
]

ClipState = base.EmptyState
ClipByGlobalNormState = base.EmptyState


def _stateless_per_leaf(f) -> base.GradientTransformation:
  """A stateless transform applying ``f`` to each update (params unused)."""
  return base.stateless(lambda updates, _: jax.tree.map(f, updates))


def clip(max_delta: jax.typing.ArrayLike) -> base.GradientTransformation:
  """Clips every update element into ``[-max_delta, max_delta]``."""
  return _stateless_per_leaf(lambda u: jnp.clip(u, -max_delta, max_delta))


def clip_by_block_rms(
    threshold: jax.typing.ArrayLike,
) -> base.GradientTransformation:
  """Rescales each leaf whose root-mean-square exceeds ``threshold`` to it.

  Reference: Adafactor's update clipping, Shazeer & Stern, "Adafactor:
  Adaptive Learning Rates with Sublinear Memory Cost", ICML 2018
  (https://arxiv.org/abs/1804.04235), Sec. 6.
  """

  def clip_leaf(u):
    rms = jnp.sqrt(jnp.mean(numerics.abs_sq(u)))
    return u / jnp.maximum(1.0, rms / threshold)

  return _stateless_per_leaf(clip_leaf)


def clip_by_global_norm(
    max_norm: jax.typing.ArrayLike,
) -> base.GradientTransformation:
  """Rescales all updates together when their global L2 norm exceeds max_norm.

  On sharded updates the norm is one all-reduce of per-leaf sums.

  Reference: Pascanu et al., "On the difficulty of training Recurrent Neural
  Networks", ICML 2013 (https://arxiv.org/abs/1211.5063).
  """

  def clip_all(updates, params):
    del params
    norm = tree.global_norm(updates)
    keep = norm < max_norm
    def clip_leaf(u):
      return jax.lax.select(keep, u, (u / norm.astype(u.dtype)) * max_norm)

    return jax.tree.map(clip_leaf, updates)

  return base.stateless(clip_all)
