"""Block layout of a quantized leaf and block-wise quantize / dequantize.

A block is a tile of the *global* array: ``tile[d]`` consecutive indices of
each dimension ``d``, ``prod(tile) == block_size`` elements. Tiles are taken
from the last dimension first (``gcd`` of what is left of the block and the
length the tile must divide), then from the dimensions before it.

``choose_tile(shape, block_size, fit)`` picks the tile so that ``tile[d]``
divides ``fit[d]``, the shortest run of dimension ``d`` that one device can
hold (its shard length; see ``fit_lengths``). A tile that divides every
shard length never straddles a shard boundary, so quantizing and
dequantizing need no communication. Because the tile is a property of the
global array, a quantized state restores onto any mesh bit-exactly (on a
mesh whose shards cut tiles XLA moves the data it needs; nothing changes).

Each block stores one ``float32`` scale, the largest finite ``|x|`` of the
block (block-wise absmax, Dettmers et al. 2021), and one code per element
(for a ``root`` code book, of ``sqrt(x)``: scale and codes are of the root).
Non-finite values never reach a scale: ``+-inf`` saturate to ``+-scale``
and ``nan`` takes the code nearest to zero, so one bad value leaves the rest
of its block as it was.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src.quantization import codes

__all__ = [
    "QuantizedArray",
    "choose_tile",
    "dequantize",
    "fit_lengths",
    "quantize",
]


class QuantizedArray(NamedTuple):
  """A float leaf stored as codes plus one scale per block."""

  codes: jax.Array  # uint8 code indices (4 bits: two per byte along one dim)
  scales: jax.Array  # float32 absmax per block: the leaf's shape / tile


def fit_lengths(shape, spec_lengths=None, extra_split: int = 1,
                free=None) -> tuple[int, ...]:
  """Per dimension, the length every tile must divide.

  Args:
    shape: the leaf's (global) shape.
    spec_lengths: its shard shape on the mesh, or None for unsharded.
    extra_split: a further split (ZeRO's axis size) that any dimension in
      ``free`` may receive.
    free: dimensions not already sharded (ZeRO may choose any of them).
  """
  lengths = list(spec_lengths if spec_lengths is not None else shape)
  for d in free or ():
    if lengths[d] % extra_split == 0:
      lengths[d] //= extra_split
  return tuple(lengths)


def choose_tile(shape, block_size: int, fit) -> tuple[int, ...] | None:
  """A tile of ``block_size`` elements, ``tile[d]`` dividing ``fit[d]``,
  filled from the last dimension first; None when none exists."""
  left = block_size
  tile = []
  for length in reversed(tuple(fit)):
    take = math.gcd(length, left)
    tile.append(take)
    left //= take
  if left != 1 or len(shape) == 0:
    return None
  return tuple(reversed(tile))


def pack_axis(tile) -> int | None:
  """The last dimension whose tile length is even: 4-bit codes pair the two
  halves of each tile along it, so a byte never spans two blocks."""
  even = [d for d, t in enumerate(tile) if t % 2 == 0]
  return even[-1] if even else None


def _packed_tile(tile, bits: int) -> tuple[int, ...]:
  """The tile of the stored codes: at 4 bits half as long on ``pack_axis``."""
  if bits == 8:
    return tuple(tile)
  axis = pack_axis(tile)
  return tuple(t // 2 if d == axis else t for d, t in enumerate(tile))


def _split(x, tile):
  """``(D0, D1, ...)`` -> ``(D0/t0, t0, D1/t1, t1, ...)``, one dimension at a
  time (a sharded dimension keeps its mesh axes on the outer part)."""
  for d, t in enumerate(tile):
    axis = 2 * d
    x = x.reshape(*x.shape[:axis], x.shape[axis] // t, t, *x.shape[axis + 1:])
  return x


def _merge(x, tile):
  """Inverse of ``_split``."""
  for d in reversed(range(len(tile))):
    axis = 2 * d
    x = x.reshape(*x.shape[:axis], x.shape[axis] * x.shape[axis + 1],
                  *x.shape[axis + 2:])
  return x


def _inner_axes(tile) -> tuple[int, ...]:
  return tuple(2 * d + 1 for d in range(len(tile)))


def quantize(x: jax.Array, tile, book: codes.CodeBook, bits: int) -> QuantizedArray:
  """``x`` as codes of ``book`` and a per-block absmax scale."""
  x = x.astype(jnp.float32)
  if book.root:
    x = jnp.sqrt(jnp.maximum(x, 0.0))
  blocks = _split(x, tile)
  finite = jnp.isfinite(blocks)
  scales = jnp.max(jnp.where(finite, jnp.abs(blocks), 0.0), axis=_inner_axes(tile))
  divisor = jnp.expand_dims(jnp.where(scales > 0, scales, 1.0), _inner_axes(tile))
  normalized = jnp.where(finite, blocks / divisor, jnp.sign(blocks))
  normalized = jnp.clip(jnp.nan_to_num(normalized, nan=0.0), -1.0, 1.0)
  index = codes.encode(normalized, book)
  if bits == 4:  # pairs within a block: entries k and k + t/2 of its tile
    index = codes.pack(index, 2 * pack_axis(tile) + 1)
  return QuantizedArray(_merge(index, _packed_tile(tile, bits)), scales)


def dequantize(q: QuantizedArray, tile, book: codes.CodeBook, bits: int,
               dtype) -> jax.Array:
  """The values that ``quantize`` stored, in ``dtype``."""
  index = _split(q.codes, _packed_tile(tile, bits))
  if bits == 4:
    index = codes.unpack(index, 2 * pack_axis(tile) + 1)
  values = codes.decode(index, book)
  values = values * jnp.expand_dims(q.scales, _inner_axes(tile))
  if book.root:
    values = values * values
  return _merge(values, tile).astype(dtype)
