"""Blocked views of params for Shampoo and SOAP, fixed by ``block_size`` alone.

A dimension of length ``d`` is cut into ``n = ceil(d / block_size)`` blocks of
``b = ceil(d / n)`` elements (at most ``block_size``; the last block padded
with ``n b - d < n`` zeros where ``n`` does not divide ``d``). The layout
depends on the param's shape and ``block_size`` only, never on the mesh or
the device count, so the state has the same shapes and the optimizer the
same numbers on any number of devices, and a checkpoint restores onto any
mesh. The blocked view has shape ``(n_1, ..., n_k, b_1, ..., b_k)``: block
indices first, then the position inside the block. A per-dimension statistic
of the blocks has shape ``(n_1, ..., n_k, b_i, b_i)``.

Where ``b`` divides the length of a dimension's shards, each shard holds whole
blocks: the leading block dimension carries the param's mesh axes, the
statistics of a block live on the device that holds that block of the param,
and ``shardopt.sharding`` derives their shardings (and ZeRO splits whole
blocks) like any other state leaf. Where it does not, blocks straddle shards:
that block dimension is gathered for the step and its statistics are not
split over those axes (correct, with collectives; ``block_layout`` states
the layout so a ``block_size`` that tiles the shards can be chosen).

Zero padding changes nothing inside a block: the statistics' padded rows and
columns are zero, so their inverse roots and eigenbases are block-diagonal,
real part and padding apart; the optimizers mask the padded positions
(``real_mask``) where rounding could mix them.
"""

import functools
import math
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt.contrib._blockwise import blockwise

__all__ = [
    "BlockLayout",
    "apply_along",
    "block_layout",
    "block_sizes",
    "explicit_spec",
    "eye_like",
    "from_blocks",
    "gram",
    "in_statistics_dtype",
    "is_blocked",
    "padding",
    "real_mask",
    "refresh_due",
    "to_blocks",
    "unzip",
]


class BlockLayout(NamedTuple):
  """How one param is cut into blocks."""

  shape: tuple[int, ...]  # the param's shape
  block: tuple[int, ...]  # b_i: block length per dimension
  grid: tuple[int, ...]  # n_i: blocks per dimension

  def __str__(self) -> str:
    if not self.block:
      return f"{self.shape}: not blocked (rank < 2)"
    text = (f"{self.shape}: {' x '.join(map(str, self.grid))} blocks of "
            f"{' x '.join(map(str, self.block))}")
    padded = _padded(self.grid, self.block)
    if padded != self.shape:
      text += f" (zero-padded to {' x '.join(map(str, padded))})"
    return text


def is_blocked(shape) -> bool:
  """Params of rank 2 and more are preconditioned per block; others are not."""
  return len(shape) >= 2


def _grid(shape, block) -> tuple[int, ...]:
  return tuple(-(-d // b) for d, b in zip(shape, block))


def _padded(grid, block) -> tuple[int, ...]:
  return tuple(n * b for n, b in zip(grid, block))


def block_sizes(shape, block_size: int) -> tuple[int, ...]:
  """Per dimension ``d``: ``ceil(d / n)`` with ``n = ceil(d / block_size)``."""
  if block_size < 1:
    raise ValueError(f"block_size={block_size}: expected a positive integer.")
  return tuple(-(-d // -(-d // block_size)) for d in shape)


def block_layout(params, block_size: int) -> Any:
  """The ``BlockLayout`` of every param (``str()`` of one reads as a sentence).

  Args:
    params: a tree of arrays or ``jax.ShapeDtypeStruct``.
    block_size: the ``block_size`` given to ``shampoo``/``soap``.

  Returns:
    A tree of ``BlockLayout`` with the structure of ``params``.
  """
  def layout(p):
    shape = tuple(p.shape)
    if not is_blocked(shape):
      return BlockLayout(shape, (), ())
    block = block_sizes(shape, block_size)
    return BlockLayout(shape, block, _grid(shape, block))
  return jax.tree.map(layout, params)


def padding(shape, block, dim: int) -> np.ndarray | None:
  """Where dimension ``dim``'s blocks ``(n, b)`` hold padding (True); None
  when it has none."""
  d, b = shape[dim], block[dim]
  n = -(-d // b)
  if n * b == d:
    return None
  return (np.arange(n)[:, None] * b + np.arange(b)[None, :]) >= d


def real_mask(shape, block) -> np.ndarray | None:
  """Where the blocked view ``(n.., b..)`` of an array of ``shape`` holds the
  array (True) rather than padding, broadcastable; None when nothing is
  padded."""
  k = len(shape)
  mask = None
  for i in range(k):
    pad = padding(shape, block, i)
    if pad is not None:
      dims = [1] * 2 * k
      dims[i], dims[k + i] = pad.shape
      real = ~pad.reshape(dims)
      mask = real if mask is None else mask & real
  return mask


def explicit_spec(x) -> tuple | None:
  """``x``'s spec (one entry per dim) when it carries Explicit mesh axes."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  if sharding is None or sharding.mesh.empty or not any(sharding.spec):
    return None
  spec = tuple(sharding.spec)
  return spec + (None,) * (x.ndim - len(spec))


def _reshape(x, shape, spec_entries):
  """``x.reshape(shape)``, telling JAX the result's spec on Explicit axes."""
  if spec_entries is None:
    return jnp.reshape(x, shape)
  mesh = jax.typeof(x).sharding.mesh
  return jax.lax.reshape(x, shape,
                         out_sharding=NamedSharding(mesh, P(*spec_entries)))


def _reshard(x, spec_entries):
  """``x`` with spec ``spec_entries`` on Explicit axes (no-op when equal)."""
  if spec_entries is None or tuple(spec_entries) == explicit_spec(x):
    return x
  mesh = jax.typeof(x).sharding.mesh
  return jax.sharding.reshard(x, NamedSharding(mesh, P(*spec_entries)))


def _tiled_spec(x, block) -> list | None:
  """On Explicit axes, ``x``'s spec with the entries of dimensions whose
  shards blocks of ``block`` do not tile dropped (those are gathered)."""
  spec = explicit_spec(x)
  if spec is None:
    return None
  sizes = jax.typeof(x).sharding.mesh.shape
  kept = []
  for entry, d, b in zip(spec, x.shape, block):
    names = entry if isinstance(entry, tuple) else (entry,)
    split = math.prod(sizes[n] for n in names if n is not None)
    kept.append(entry if d % b == 0 and (d // b) % split == 0 else None)
  return kept


def to_blocks(x: jax.Array, block: tuple[int, ...]) -> jax.Array:
  """``(d_1..d_k) -> (n_1..n_k, b_1..b_k)``, zero-padded where ``b_i`` does
  not divide ``d_i``; block dims keep the mesh axes of shards they tile."""
  k = x.ndim
  spec = _tiled_spec(x, block)
  x = _reshard(x, spec)
  grid = _grid(x.shape, block)
  padded = _padded(grid, block)
  if padded != x.shape:
    x = jnp.pad(x, [(0, p - d) for p, d in zip(padded, x.shape)])
  split = [s for n, b in zip(grid, block) for s in (n, b)]
  split_spec = None if spec is None else [e for s in spec for e in (s, None)]
  y = _reshape(x, split, split_spec)
  return jnp.transpose(y, [2 * i for i in range(k)] + [2 * i + 1 for i in range(k)])


def from_blocks(y: jax.Array, like: jax.Array) -> jax.Array:
  """Inverse of ``to_blocks``: back to ``like``'s shape and spec."""
  k = like.ndim
  block = y.shape[k:]
  order = [j for i in range(k) for j in (i, k + i)]
  spec = _tiled_spec(like, block)
  x = _reshape(jnp.transpose(y, order), _padded(y.shape[:k], block), spec)
  if x.shape != like.shape:
    x = x[tuple(slice(0, d) for d in like.shape)]
  return _reshard(x, explicit_spec(like))


def in_statistics_dtype(x: jax.Array) -> jax.Array:
  """``x`` in the dtype the blocks' statistics and their roots or bases are
  kept in: at least float32, as distributed Shampoo keeps them (Anil et al.
  2020). A bfloat16 statistic's rounding (2**-9 of its largest entries)
  swamps the small eigenvalues an inverse root magnifies."""
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def gram(blocks: jax.Array, dim: int) -> jax.Array:
  """Per block, ``G_(i) G_(i)^T`` along inner dim ``dim``: ``(n.., b_i, b_i)``."""
  return blockwise(functools.partial(_gram, dim=dim), blocks.ndim // 2, blocks)


def _gram(block, dim):
  others = [j for j in range(block.ndim) if j != dim]
  return jnp.tensordot(block, block, axes=(others, others))


def apply_along(mats: jax.Array, blocks: jax.Array, dim: int,
                transpose: bool = False) -> jax.Array:
  """Per block, multiplies inner dim ``dim`` by ``mats`` (``M x`` or ``M^T x``);
  the result is laid out as ``blocks``."""
  return blockwise(functools.partial(_apply_along, dim=dim, transpose=transpose),
                   blocks.ndim // 2, blocks, mats)


def _apply_along(block, mat, dim, transpose):
  product = jnp.tensordot(mat, block, axes=(0 if transpose else 1, dim))
  return jnp.moveaxis(product, 0, dim)


def eye_like(mats: jax.Array) -> jax.Array:
  """Identity matrices in every block, laid out like ``mats``."""
  return jnp.zeros_like(mats) + jnp.eye(mats.shape[-1], dtype=mats.dtype)


def refresh_due(count, start: int, every: int) -> jax.Array:
  """Whether step ``count`` (1-based) recomputes the preconditioners: at
  ``start`` and every ``every`` steps after it."""
  return (count >= start) & ((count - start) % every == 0)


def unzip(template, results, size: int) -> tuple:
  """A tree of ``size``-tuples (at ``template``'s leaves) as ``size`` trees."""
  return tuple(jax.tree.map(lambda _, r, i=i: r[i], template, results)
               for i in range(size))
