"""Tree arithmetic shared by the transforms.

Every helper that creates a tree does so with ``*_like`` operations on an
existing tree, so the result keeps the shapes and shardings of its template.
"""

import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from shardopt._src import numerics
from shardopt._src import typed_layouts

__all__ = [
    "apply_updates",
    "bias_correction",
    "global_norm",
    "tree_add",
    "tree_add_scale",
    "tree_batch_shape",
    "tree_cast",
    "tree_cast_like",
    "tree_clip",
    "tree_conj",
    "tree_div",
    "tree_full_like",
    "tree_inner_product",
    "tree_mul",
    "tree_ones_like",
    "tree_real",
    "tree_scale",
    "tree_sub",
    "tree_vdot",
    "tree_where",
    "tree_zeros_like",
    "update_infinity_moment",
    "update_moment",
    "update_moment_per_elem_norm",
]


def _is_none(x) -> bool:
  return x is None


def tree_zeros_like(tree: Any, dtype=None) -> Any:
  """Zeros with the structure, shapes and shardings of ``tree``."""
  return jax.tree.map(lambda x: jnp.zeros_like(x, dtype=dtype), tree)


def tree_ones_like(tree: Any, dtype=None) -> Any:
  """Ones with the structure, shapes and shardings of ``tree``."""
  return jax.tree.map(lambda x: jnp.ones_like(x, dtype=dtype), tree)


def tree_full_like(tree: Any, fill_value, dtype=None) -> Any:
  """``fill_value`` with the structure, shapes and shardings of ``tree``."""
  return jax.tree.map(lambda x: jnp.full_like(x, fill_value, dtype=dtype), tree)


def tree_batch_shape(tree: Any, shape: tuple[int, ...] = ()) -> Any:
  """Each leaf broadcast to ``(*shape, *leaf.shape)`` (leading batch axes)."""
  return jax.tree.map(
      lambda x: jnp.broadcast_to(x, (*shape, *jnp.shape(x))), tree)


def tree_cast(tree: Any, dtype) -> Any:
  """Casts every leaf to ``dtype`` (no-op when ``dtype`` is None)."""
  if dtype is None:
    return tree
  return jax.tree.map(lambda x: x.astype(dtype), tree)


def tree_cast_like(tree: Any, other_tree: Any) -> Any:
  """Casts each leaf of ``tree`` to the dtype of the matching leaf of
  ``other_tree`` (leaves there without a dtype leave theirs unchanged)."""
  return jax.tree.map(
      lambda x, y: jnp.asarray(x).astype(y.dtype) if hasattr(y, "dtype") else x,
      tree, other_tree)


def tree_add(tree_x: Any, tree_y: Any, *other_trees: Any) -> Any:
  """Leafwise sum of two or more trees of one structure (from 0, as Python's
  ``sum``: boolean leaves count, as optax's do)."""
  return jax.tree.map(lambda *leaves: sum(leaves), tree_x, tree_y, *other_trees)


def tree_sub(tree_x: Any, tree_y: Any) -> Any:
  """Leafwise ``tree_x - tree_y``."""
  return jax.tree.map(lambda a, b: a - b, tree_x, tree_y)


def tree_mul(tree_x: Any, tree_y: Any) -> Any:
  """Leafwise ``tree_x * tree_y``."""
  return jax.tree.map(lambda a, b: a * b, tree_x, tree_y)


def tree_div(tree_x: Any, tree_y: Any) -> Any:
  """Leafwise ``tree_x / tree_y``."""
  return jax.tree.map(lambda a, b: a / b, tree_x, tree_y)


def tree_scale(scalar, tree: Any) -> Any:
  """``scalar * leaf`` for every leaf."""
  return jax.tree.map(lambda x: scalar * x, tree)


def tree_add_scale(tree_x: Any, scalar, tree_y: Any) -> Any:
  """``tree_x + scalar * tree_y`` leafwise (None leaves of ``tree_x``
  kept)."""
  scalar = jnp.asarray(scalar)
  return jax.tree.map(lambda a, b: None if a is None else a + scalar * b,
                      tree_x, tree_y, is_leaf=_is_none)


def tree_conj(tree: Any) -> Any:
  """The complex conjugate of every leaf."""
  return jax.tree.map(jnp.conj, tree)


def tree_real(tree: Any) -> Any:
  """The real part of every leaf."""
  return jax.tree.map(jnp.real, tree)


def tree_clip(tree: Any, min_value=None, max_value=None) -> Any:
  """Every leaf clipped to ``[min_value, max_value]`` (None: unbounded)."""
  return jax.tree.map(lambda x: jnp.clip(x, min_value, max_value), tree)


@jax.jit
def _leaf_vdot(a, b) -> jax.Array:
  """<a, b> = sum(conj(a) * b) of one leaf: all axes contracted at the
  highest precision.

  ``jnp.vdot`` ravels its inputs, which Explicit mesh axes reject for
  leaves split over them; contracting every axis in place works there,
  given a stated (replicated) output sharding, and on Auto or unsharded
  arrays alike. Compiled as one program, as ``jnp.vdot`` is: called eagerly,
  a separate ``conj`` and contraction round differently (1 ulp from
  ``jnp.vdot`` for a complex64 vector).
  """
  explicit = typed_layouts.explicit_sharding(a)
  out_sharding = (None if explicit is None
                  else NamedSharding(explicit.mesh, PartitionSpec()))
  return jnp.tensordot(jnp.conj(a), b, a.ndim, out_sharding=out_sharding,
                       precision=jax.lax.Precision.HIGHEST)


def tree_inner_product(tree_x: Any, tree_y: Any) -> jax.Array:
  """Sum over leaves of <x, y> = sum(conj(x) * y): complex for complex
  leaves, in the leaves' dtype (optax's ``tree.vdot``), on any mesh."""
  dots = jax.tree.map(_leaf_vdot, tree_x, tree_y)
  return functools.reduce(operator.add, jax.tree.leaves(dots), 0)


def tree_vdot(tree_x: Any, tree_y: Any) -> jax.Array:
  """Sum over leaves of Re <x, y> (a replicated float32-or-wider scalar), on
  any mesh: the real inner product that line searches and L-BFGS need."""
  dots = jax.tree.map(lambda a, b: _leaf_vdot(a, b).real, tree_x, tree_y)
  return sum(jax.tree.leaves(dots), jnp.zeros([], jnp.float32))


def tree_where(condition, tree_x: Any, tree_y: Any) -> Any:
  """Leafwise ``jnp.where(condition, tree_x, tree_y)``."""
  return jax.tree.map(lambda a, b: jnp.where(condition, a, b), tree_x, tree_y)


def global_norm(updates: Any) -> jax.Array:
  """The L2 norm of all leaves of ``updates`` taken together.

  On sharded leaves this is one all-reduce of per-leaf sums.

  Args:
    updates: a tree of arrays (real or complex).

  Returns:
    ``sqrt(sum over leaves of sum(|x|**2))``, a scalar.
  """
  return jnp.sqrt(
      sum(jnp.sum(numerics.abs_sq(x)) for x in jax.tree.leaves(updates))
  )


def apply_updates(params: Any, updates: Any) -> Any:
  """``params + updates``, each result in its param's dtype.

  Args:
    params: a tree of arrays; ``None`` leaves stay ``None``.
    updates: a tree with the params' structure.

  Returns:
    The updated params, each leaf cast back to its param's dtype.
  """
  return jax.tree.map(
      lambda p, u: None
      if p is None
      else jnp.asarray(p + u).astype(jnp.asarray(p).dtype),
      params,
      updates,
      is_leaf=_is_none,
  )


def update_moment(updates: Any, moments: Any, decay, order) -> Any:
  """EMA of the ``order``-th power: ``(1 - decay) * g**order + decay * m``.

  Args:
    updates: a tree of gradients ``g``; ``None`` leaves stay ``None``.
    moments: the current moments ``m``, with the updates' structure.
    decay: the EMA's decay.
    order: the power of ``g`` (1 for a mean, 2 for a second moment).

  Returns:
    The new moments.
  """
  return jax.tree.map(
      lambda g, m: None if g is None else (1 - decay) * (g**order) + decay * m,
      updates,
      moments,
      is_leaf=_is_none,
  )


def update_infinity_moment(updates: Any, moments: Any, decay, eps) -> Any:
  """EMA of the infinity norm: ``max(|g| + eps, decay * m)``.

  Args:
    updates: a tree of gradients ``g``; ``None`` leaves stay ``None``.
    moments: the current moments ``m``, with the updates' structure.
    decay: the decay of ``m``.
    eps: added to ``|g|``.

  Returns:
    The new moments.
  """
  return jax.tree.map(
      lambda g, m: None if g is None else jnp.maximum(jnp.abs(g) + eps, decay * m),
      updates,
      moments,
      is_leaf=_is_none,
  )


def _elementwise_norm_power(g: jax.Array, order) -> jax.Array:
  if jnp.isrealobj(g):
    return g**order
  half_order = order / 2
  if float(half_order).is_integer():
    half_order = int(half_order)
  return numerics.abs_sq(g) ** half_order


def update_moment_per_elem_norm(updates: Any, moments: Any, decay, order) -> Any:
  """EMA of ``|g|**order``, elementwise (complex-aware).

  Args:
    updates: a tree of gradients ``g``; ``None`` leaves stay ``None``.
    moments: the current moments ``m``, with the updates' structure.
    decay: the EMA's decay.
    order: the power of ``|g|``.

  Returns:
    The new moments, ``(1 - decay) * |g|**order + decay * m``.
  """
  return jax.tree.map(
      lambda g, m: None
      if g is None
      else (1 - decay) * _elementwise_norm_power(g, order) + decay * m,
      updates,
      moments,
      is_leaf=_is_none,
  )


# Always compiled: ``1 - decay**count`` cancels badly for decay near 1, and
# XLA's compiled pow differs by an ulp from the op-by-op one, so eager and
# jitted runs (and optax's) agree only if both compile it.
@functools.partial(jax.jit, inline=True)
def bias_correction(moment: Any, decay, count) -> Any:
  """``moment / (1 - decay**count)``, dividing in each moment's own dtype.

  Args:
    moment: a tree of moments.
    decay: the decay the moments were averaged with.
    count: the number of averaged steps (at least 1).

  Returns:
    The debiased moments.

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980), Sec. 3.
  """
  correction = 1 - decay**count
  return jax.tree.map(lambda m: m / correction.astype(m.dtype), moment)
