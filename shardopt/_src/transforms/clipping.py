"""Clipping updates elementwise, per block (leaf) and by their global norm."""

from typing import Any

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math

__all__ = [
    "AdaptiveGradClipState",
    "ClipByGlobalNormState",
    "ClipState",
    "adaptive_grad_clip",
    "clip",
    "clip_by_block_rms",
    "clip_by_global_norm",
    "unitwise_clip",
    "unitwise_norm",
]

ClipState = base.EmptyState


ClipByGlobalNormState = base.EmptyState


def _stateless_per_leaf(f) -> base.GradientTransformation:
  """A stateless transform applying ``f`` to each update (params unused)."""
  return base.stateless(lambda updates, _: jax.tree.map(f, updates))


def clip(max_delta: jax.typing.ArrayLike) -> base.GradientTransformation:
  """Clips every update element into ``[-max_delta, max_delta]``.

  Args:
    max_delta: the largest magnitude an element keeps.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Elementwise gradient clipping as in Mikolov, "Statistical Language
    Models Based on Neural Networks", PhD thesis, 2012; optax's ``clip``.
  """
  return _stateless_per_leaf(lambda u: jnp.clip(u, -max_delta, max_delta))


def clip_by_block_rms(
    threshold: jax.typing.ArrayLike,
) -> base.GradientTransformation:
  """Rescales each leaf whose root mean square exceeds ``threshold`` down to it.

  Each update ``u`` becomes ``u / max(1, rms(u) / threshold)``.

  Args:
    threshold: the largest root mean square a leaf keeps.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
    Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235), Sec. 6
    (update clipping).
  """

  def clip_leaf(u):
    rms = jnp.sqrt(jnp.mean(numerics.abs_sq(u)))
    return u / jnp.maximum(1.0, rms / threshold)

  return _stateless_per_leaf(clip_leaf)


def clip_by_global_norm(
    max_norm: jax.typing.ArrayLike,
) -> base.GradientTransformation:
  """Rescales all updates together when their global L2 norm exceeds ``max_norm``.

  With ``n = sqrt(sum of all squared elements)``, the updates are kept when
  ``n < max_norm`` and become ``u / n * max_norm`` otherwise. On sharded
  updates the norm is one all-reduce of per-leaf sums.

  Args:
    max_norm: the largest global norm the updates keep.

  Returns:
    A stateless ``GradientTransformation`` (its state is
    ``ClipByGlobalNormState``, empty).

  References:
    Pascanu et al., "On the difficulty of training Recurrent Neural
    Networks", ICML 2013 (https://arxiv.org/abs/1211.5063).
  """

  def clip_all(updates, params):
    del params
    norm = tree_math.global_norm(updates)
    keep = norm < max_norm
    def clip_leaf(u):
      return jax.lax.select(keep, u, (u / norm.astype(u.dtype)) * max_norm)

    return jax.tree.map(clip_leaf, updates)

  return base.stateless(clip_all)


AdaptiveGradClipState = base.EmptyState


# Default reduction axes by rank: the whole of a scalar/vector, the input axis
# of a dense (or multi-head dense) kernel, the spatial and input axes of 2-D
# and 3-D convolution kernels.
_DEFAULT_AXES = {2: (0,), 3: (0,), 4: (0, 1, 2), 5: (0, 1, 2, 3)}


def unitwise_norm(x: jax.typing.ArrayLike,
                  axis: int | tuple[int, ...] | None = None) -> jax.Array:
  """The L2 norm of each unit of ``x``, broadcast back to ``x``'s shape.

  A unit is a slice of ``x`` over ``axis``.

  Args:
    x: an array (an update or a param).
    axis: the axes reduced to form a unit's norm; ``None`` (default) picks
      by rank: the whole array for scalars and vectors, axis 0 for 2-D and
      3-D kernels, all but the last axis for 4-D and 5-D convolution kernels.

  Returns:
    An array of ``x``'s shape holding, at each element, the norm of its unit.

  Raises:
    ValueError: ``axis`` is ``None`` and ``x``'s rank has no default unit.

  References:
    Brock et al., "High-Performance Large-Scale Image Recognition Without
    Normalization", ICML 2021 (https://arxiv.org/abs/2102.06171).
  """
  x = jnp.asarray(x)
  if axis is None:
    if jnp.squeeze(x).ndim <= 1:
      axis = None
    elif x.ndim in _DEFAULT_AXES:
      axis = _DEFAULT_AXES[x.ndim]
    else:
      raise ValueError(
          f"unitwise_norm: no default unit for an array of shape {x.shape};"
          " pass axis=... to name the axes to take the norm over"
      )
  sq_norm = jnp.sum(numerics.abs_sq(x), axis=axis, keepdims=True)
  # In x's layout (on Explicit axes the reduced dimensions lost theirs).
  return jnp.broadcast_to(jnp.sqrt(sq_norm), x.shape,
                          out_sharding=jax.typeof(x).sharding)


def unitwise_clip(g_norm: jax.typing.ArrayLike, max_norm: jax.typing.ArrayLike,
                  grad: jax.typing.ArrayLike,
                  div_eps: jax.typing.ArrayLike = 1e-6) -> jax.Array:
  """``grad`` where its unit norm is below ``max_norm``, else rescaled to it.

  Args:
    g_norm: the unit norms of ``grad`` (``unitwise_norm(grad)``).
    max_norm: the largest unit norm kept, of ``g_norm``'s shape.
    grad: the update to clip.
    div_eps: floor of the divisor; it only guards 0/0 and cannot bind
      where clipping happens (default 1e-6).

  Returns:
    ``grad``, each unit whose norm is at least ``max_norm`` scaled to
    ``max_norm``.

  Raises:
    ValueError: the three arrays do not have one shape.
  """
  shapes = {jnp.shape(g_norm), jnp.shape(max_norm), jnp.shape(grad)}
  if len(shapes) != 1:
    raise ValueError(f"unitwise_clip: g_norm, max_norm and grad must have one "
                     f"shape, got {jnp.shape(g_norm)}, {jnp.shape(max_norm)} "
                     f"and {jnp.shape(grad)}")
  clipped = grad * (max_norm / jnp.maximum(g_norm, div_eps))
  return jnp.where(g_norm < max_norm, grad, clipped)


def adaptive_grad_clip(
    clipping: jax.typing.ArrayLike,
    eps: jax.typing.ArrayLike = 1e-3,
    axis: int | tuple[int, ...] | None = None,
) -> base.GradientTransformation:
  """Adaptive gradient clipping: each unit's update relative to its param's norm.

  Each unit (a slice over ``axis``) of an update ``g`` with param ``p`` is
  kept when ``||g_unit|| < clipping * max(||p_unit||, eps)`` and rescaled to
  that norm otherwise. Needs the params.

  Args:
    clipping: the largest ratio of update norm to param norm (per unit).
    eps: floor of the param norm, so zero-initialised params can move
      (default 1e-3).
    axis: the axes reduced to form a unit's norm; ``None`` (default) picks
      by rank: the whole array for scalars and vectors, axis 0 for 2-D and
      3-D kernels, all but the last axis for 4-D and 5-D convolution
      kernels (other ranks need an explicit ``axis``).

  Returns:
    A stateless ``GradientTransformation`` whose ``update`` raises
    ValueError without params.

  References:
    Brock et al., "High-Performance Large-Scale Image Recognition Without
    Normalization", ICML 2021 (https://arxiv.org/abs/2102.06171).
  """

  def clip_unit(g, p):
    max_norm = clipping * jnp.maximum(unitwise_norm(p, axis), eps)
    return unitwise_clip(unitwise_norm(g, axis), max_norm, g)

  def update_fn(updates: Any, state, params=None):
    if params is None:
      raise ValueError(
          "adaptive_grad_clip needs the params: call update(updates, state,"
          " params)"
      )
    return jax.tree.map(clip_unit, updates, params), state

  return base.GradientTransformation(base.init_empty_state, update_fn)
