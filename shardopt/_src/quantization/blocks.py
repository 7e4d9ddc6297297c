"""Block layout of a quantized leaf and block-wise quantize / dequantize.

A block is a tile of the *global* array: ``tile[d]`` consecutive indices of
each dimension ``d``, ``prod(tile) == block_size`` elements. Tiles are taken
from the last dimension first (``gcd`` of what is left of the block and the
length the tile must divide), then from the dimensions before it.

``choose_tile(shape, block_size, fit)`` picks the tile so that ``tile[d]``
divides ``fit[d]``, the shortest run of dimension ``d`` that one device can
hold (``quantized_state`` passes the shortest on any mesh of its device
count: ``typed_layouts.finest_shard_shape``). A tile that divides every
shard length never straddles a shard boundary, so quantizing and
dequantizing need no communication, and the same tile fits every mesh that
cuts the array no finer.

Each block stores one ``float32`` scale, the largest finite ``|x|`` of the
block (block-wise absmax, Dettmers et al. 2021), and one code per element
of ``x / scale`` (for a ``root`` code book, of ``sqrt(x / scale)``).
Non-finite values never reach a scale: ``+-inf`` saturate to ``+-scale``
and ``nan`` takes the code nearest to zero, so one bad value leaves the rest
of its block as it was.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from shardopt._src import typed_layouts
from shardopt._src.quantization import codes
from shardopt._src.quantization import packing

__all__ = [
    "BlockCodes",
    "choose_tile",
    "dequantize",
    "quantize",
]


class BlockCodes(NamedTuple):
  """A float array as codes plus one scale per block (``quantize``'s
  result; ``quantized_state`` stores it with its layout as a
  ``QuantizedArray``)."""

  codes: jax.Array  # uint8 code indices (4 bits: two per byte along one dim)
  scales: jax.Array  # float32 absmax per block: the leaf's shape / tile


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


class _Layout(NamedTuple):
  """A leaf seen as blocks: each dimension ``d`` split into its outer part
  ``shape[d] / tile[d]`` and its inner part ``tile[d]``, parts of length 1
  left out (size-1 axes made XLA:CPU copy between layouts inside every
  fused loop: 1.6x the kernel time of a quantized Adam update). Reducing
  ``inner`` (keeping the axes) gives one value per block, of shape
  ``scale_parts``."""

  parts: tuple[tuple[int, ...], ...]  # per dimension: (outer, inner) or one
  scale_parts: tuple[tuple[int, ...], ...]  # ``parts``, inner lengths 1
  inner: tuple[int, ...]  # axes of the split array within a block
  pair: int  # the inner axis that 4-bit codes pair along (``pack_axis``)


def _layout(shape, tile, packed: bool = False) -> _Layout:
  """The layout of a leaf of ``shape``; ``packed``: of its 4-bit codes
  (``shape`` and tile halved on ``pack_axis``, whose inner part is kept even
  where it has length 1, so that ``pair`` is the same axis)."""
  axis = pack_axis(tile)
  parts, scale_parts, inner, pair = [], [], [], -1
  for d, (length, t) in enumerate(zip(shape, tile)):
    keep = packed and d == axis
    t = t // 2 if keep else t
    outer, scale = (), ()
    if length // t > 1 or (t == 1 and not keep):
      outer = scale = (length // t,)
    axes = sum(len(p) for p in parts) + len(outer)
    if t > 1 or keep:
      pair = axes if d == axis else pair
      inner.append(axes)
      outer, scale = outer + (t,), scale + (1,)
    parts.append(outer)
    scale_parts.append(scale)
  return _Layout(tuple(parts), tuple(scale_parts), tuple(inner), pair)


def _split(x, parts):
  """``x`` with each dimension ``d`` reshaped to ``parts[d]``, one at a time
  (a sharded dimension keeps its mesh axes on its outer part)."""
  for d in reversed(range(len(parts))):
    if parts[d] != (x.shape[d],):
      x = x.reshape(*x.shape[:d], *parts[d], *x.shape[d + 1:])
  return x


def _merge(x, parts):
  """Inverse of ``_split``."""
  for d in reversed(range(len(parts))):
    axis, n = sum(len(p) for p in parts[:d]), len(parts[d])
    if n != 1:
      x = x.reshape(*x.shape[:axis], math.prod(parts[d]), *x.shape[axis + n:])
  return x


def quantize(x: jax.Array, tile, book: codes.CodeBook, bits: int) -> BlockCodes:
  """``x`` as codes of ``book`` and a per-block absmax scale."""
  layout = _layout(x.shape, tile)
  x = _fitted(x.astype(jnp.float32), tile)
  scales = _absmax(_split(x, layout.parts), layout.inner, book.signed)
  full = _per_element(scales, layout)
  # +-inf saturate to +-scale; nan stays nan (the code nearest 0).
  index = codes.encode(jnp.clip(x, -full if book.signed else 0.0, full), full,
                       book)
  if bits == 4:  # pairs within a block: entries k and k + t/2 of its tile
    packed = _layout(_packed_shape(x.shape, tile), tile, packed=True)
    index = _merge(packing.pack(_split(index, layout.parts), layout.pair),
                   packed.parts)
  return BlockCodes(index, _merge(scales, layout.scale_parts))


def _per_element(scales, layout: _Layout):
  """Block ``scales`` (in the split shape, inner lengths 1) broadcast to one
  per element of the leaf, in the leaf's own shape.

  Codes are computed and decoded in the leaf's own shape rather than in the
  split view: the compiled update then copies fewer of its donated arrays
  (AdamW on the wide LM tree, 8 simulated devices: 43 -> 29 copies at 8
  bits, 29 -> 15 at 4), and the 4-bit update took 0.87-0.96x its time in
  side-by-side runs (8-bit: 0.97-1.02x).
  """
  shape = tuple(n for part in layout.parts for n in part)
  return _merge(jnp.broadcast_to(scales, shape), layout.parts)


def _absmax(blocks, inner, signed: bool):
  """Per block (reducing ``inner``, kept as length 1): the largest finite
  ``|x|`` (``signed``) or ``max(x, 0)``.

  The same values bit for bit on every backend, written for each compiler's
  fusion (``jax.lax.platform_dependent`` picks one when the update is
  lowered): XLA:CPU gets ``_absmax_two_valued``, every other backend
  ``_absmax_of_magnitudes``. Each form is slower on the other compiler:
  the 8-bit AdamW update took 4.53x its time on XLA:CPU with the second form
  (16 leaves of 256 x 1024, one device) and 1.35x on one H200 with the
  first (16 of 4096 x 4096; ``benchmarks/results/backend_forms*.md``).
  """
  return jax.lax.platform_dependent(
      blocks, cpu=lambda b: _absmax_two_valued(b, inner, signed),
      default=lambda b: _absmax_of_magnitudes(b, inner, signed))


def _absmax_two_valued(blocks, inner, signed: bool):
  """``_absmax`` from one reduction of each block's largest and smallest
  finite value (the absmax is ``max(largest, -smallest)``; unsigned, the
  larger of the two is the largest, and using both keeps the pair): XLA:CPU
  runs this two-valued reduction as one loop over the computation that
  produces ``blocks``, where a single ``max`` goes to a library kernel that
  first needs ``blocks`` written out, one more pass over memory per moment.
  (XLA:GPU writes the finiteness test of this form out as a kernel of its
  own.)
  """
  finite = jnp.where(jnp.abs(blocks) < jnp.inf, blocks, 0.0)
  largest, smallest = jax.lax.reduce(
      (finite, finite), (np.float32(-np.inf), np.float32(np.inf)),
      lambda a, b: (jnp.maximum(a[0], b[0]), jnp.minimum(a[1], b[1])), inner)
  absmax = (jnp.maximum(largest, -smallest) if signed else
            jnp.maximum(jnp.maximum(largest, smallest), 0.0))
  return jnp.expand_dims(absmax, inner)


def _absmax_of_magnitudes(blocks, inner, signed: bool):
  """``_absmax`` as one ``max`` over ``|x|`` (unsigned: ``x``), non-finite
  values replaced by ``-inf`` (unsigned, ``-inf`` is kept as it is): XLA:GPU
  fuses it and the moments' computation into one reduction kernel (8-bit
  AdamW on one H200: two kernels per param, both block maxima and the new
  params in the first, the codes in the second)."""
  magnitude = jnp.abs(blocks) if signed else blocks
  finite = jnp.where(magnitude < jnp.inf, magnitude, -jnp.inf)
  return jnp.maximum(jnp.max(finite, axis=inner, keepdims=True), 0.0)


def _fitted(x, tile):
  """``x``, or where its type splits a dimension over Explicit axes into
  shards that cut its tiles (a state read from a checkpoint of another
  mesh), ``x`` resharded with those dimensions whole: splitting a dimension
  into blocks keeps its mesh axes only on whole blocks per shard. On Auto
  axes ``x`` itself (the partitioner moves what it needs)."""
  sharding = typed_layouts.explicit_sharding(x)
  if sharding is None:
    return x
  spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
  fits = tuple(entry if length % t == 0 else None for entry, length, t in
               zip(spec, sharding.shard_shape(x.shape), tile))
  return x if fits == spec else jax.sharding.reshard(
      x, sharding.update(spec=P(*fits)))


def _packed_shape(shape, tile) -> tuple[int, ...]:
  """The stored 4-bit codes' shape: ``shape`` halved on ``pack_axis``."""
  axis = pack_axis(tile)
  return tuple(n // 2 if d == axis else n for d, n in enumerate(shape))


def dequantize(q: BlockCodes, tile, book: codes.CodeBook, bits: int,
               dtype) -> jax.Array:
  """The values that ``quantize`` stored, in ``dtype``."""
  layout = _layout(tuple(n * t for n, t in zip(q.scales.shape, tile)), tile)
  codes_tile = _packed_shape(tile, tile) if bits == 4 else tile  # pairs halve it
  index = _fitted(q.codes, codes_tile)
  scales = q.scales if index is q.codes else typed_layouts.laid_out_like(
      q.scales, index)  # the codes' layout, where it was refitted
  if bits == 4:
    packed = _layout(q.codes.shape, tile, packed=True)
    index = _merge(packing.unpack(_split(index, packed.parts), layout.pair,
                                in_loops=book.family == "companded"),
                   layout.parts)
  full = _per_element(_split(scales, layout.scale_parts), layout)
  return codes.decode(index, full, book).astype(dtype)
