"""Code books for quantized optimizer state: encoding and decoding.

A code book is a sorted table of at most ``2**bits`` values in ``[-1, 1]``;
a value normalised by its block's scale is stored as the index of the
nearest entry (a ``uint8``; two 4-bit indices share a byte, see ``pack``).
Encoding and decoding are elementwise arithmetic (no table lookups), so they
trace on sharded operands and run shard-local.

* Dynamic code (Dettmers et al. 2021), ``bits`` with or without a sign bit:
  ``levels = bits - signed`` decades; level ``i`` holds ``2**i`` evenly
  spaced magnitudes ``10**(i - levels + 1) * (0.1 + 0.9 * (j + 1) / 2**i)``,
  ``j < 2**i``, so small magnitudes keep a relative precision a linear code
  loses. The largest entry is exactly 1 (a block's absmax is stored exactly)
  and zero is an entry. 8-bit signed: 255 entries, smallest magnitude 1e-6;
  8-bit unsigned: 256 entries, smallest 1e-7; 4-bit signed: 15 entries,
  smallest 1e-2.
* Linear zero-free code (Li et al. 2023), for a 4-bit second moment:
  ``(j + 1) / 16``. No positive value can round to zero, so ``1 / sqrt(v)``
  cannot blow up. It codes ``sqrt(v)`` (``root``; blocks.py takes the root
  before and squares after): 16 linear steps of the root span a 256-fold
  range of ``v``, where 16 steps of ``v`` itself would flatten every value
  under 1/32 of its block's largest to 1/16 of it.

``encode`` rounds to the nearest entry, except that a positive value never
rounds to the zero entry of an unsigned book (the zero-point problem of Li et
al.): only an exact zero gets the zero code.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "CodeBook",
    "code_book",
    "decode",
    "encode",
    "pack",
    "unpack",
]


class CodeBook(NamedTuple):
  """A code: its kind, width and sign, and its table (for inspection)."""

  name: str
  bits: int
  signed: bool
  dynamic: bool  # dynamic (decades) or linear zero-free
  values: np.ndarray  # float32, ascending: decode(0), decode(1), ...
  root: bool = False  # codes the square root of the value (see quantize)

  @property
  def levels(self) -> int:
    return self.bits - 1 if self.signed else self.bits

  @property
  def zero_index(self) -> int:
    """The index of 0 (signed: negatives below it); -1 for no zero entry."""
    if not self.dynamic:
      return -1
    return 2 ** self.levels - 1 if self.signed else 0


@functools.cache
def code_book(bits: int, signed: bool) -> CodeBook:
  """The code for ``bits`` in {8, 4}: dynamic, except 4-bit unsigned (linear
  zero-free)."""
  if bits not in (4, 8):
    raise ValueError(f"bits={bits}: quantized state supports 8 or 4 bits.")
  dynamic = signed or bits == 8
  kind = ("dynamic-signed" if signed else "dynamic-unsigned") if dynamic else (
      "linear-zero-free")
  size = 2 ** (bits - 1) * 2 - 1 if signed else 2 ** bits
  root = not dynamic
  name = f"{kind}-{'sqrt-' if root else ''}{bits}"
  book = CodeBook(name, bits, signed, dynamic, np.zeros(0), root)
  values = decode(np.arange(size, dtype=np.uint8), book, xp=np)
  return book._replace(values=values)


def _decade(level, levels: int, xp=jnp):
  """``10**(level - levels + 1)`` for an integer array ``level``."""
  out = xp.zeros(level.shape, xp.float32)
  for l in range(levels):
    out = xp.where(level == l, np.float32(10.0 ** (l - levels + 1)), out)
  return out


def _dynamic_magnitude(k, levels: int, xp=jnp):
  """The ``k``-th positive magnitude (``k >= 0``) of a dynamic code."""
  level = xp.zeros(k.shape, xp.int32)
  for m in range(1, levels):
    level = level + (k + 1 >= 2 ** m).astype(xp.int32)
  steps = xp.left_shift(1, level).astype(xp.float32)
  position = (k + 2).astype(xp.float32) - steps  # j + 1, within the level
  # 0.1 + 0.9 * position / steps as one exact ratio of small integers, so
  # numpy and XLA round it (and the table and decode agree) identically.
  fraction = (steps + np.float32(9) * position) / (np.float32(10) * steps)
  return _decade(level, levels, xp) * fraction


def _dynamic_rank(magnitude, levels: int):
  """Index ``k`` of the nearest positive magnitude, -1 where 0 is nearer.

  The level is found by comparing with the decade bounds, then the position
  within the level by rounding (one multiply-add per element)."""
  tiny = np.float32(10.0 ** (1 - levels))
  scale = jnp.full(magnitude.shape, np.float32(1 / (0.9 * tiny)))
  offset = jnp.full(magnitude.shape, np.float32(0.1 / 0.9))
  first = jnp.zeros(magnitude.shape, jnp.int32)  # rank of the level's start
  for level in range(1, levels):
    above = magnitude > np.float32(10.0 ** (level - levels))
    decade, steps = 10.0 ** (level - levels + 1), 2 ** level
    scale = jnp.where(above, np.float32(steps / (0.9 * decade)), scale)
    offset = jnp.where(above, np.float32(0.1 * steps / 0.9), offset)
    first = jnp.where(above, steps - 1, first)
  steps = first + 1
  j = jnp.clip(jnp.round(magnitude * scale - offset).astype(jnp.int32) - 1,
               -1, steps - 1)
  # Level 0 holds one magnitude (``tiny``); below it the neighbour is 0.
  return jnp.where(first == 0, jnp.where(magnitude >= tiny / 2, 0, -1),
                   first + j)


def encode(normalized, book: CodeBook):
  """Index (``uint8``) of the nearest entry of ``book`` to each value.

  ``normalized`` must be finite and within ``[-1, 1]``; an unsigned book
  takes negative values as 0.
  """
  if not book.dynamic:
    steps = 2 ** book.bits
    index = jnp.clip(jnp.round(normalized * steps) - 1, 0, steps - 1)
    return index.astype(jnp.uint8)
  magnitude = jnp.abs(normalized) if book.signed else jnp.maximum(normalized, 0)
  rank = _dynamic_rank(magnitude, book.levels)
  if not book.signed:
    rank = jnp.where(magnitude > 0, jnp.maximum(rank, 0), -1)
  offset = jnp.where(normalized < 0, -(rank + 1), rank + 1)
  return (book.zero_index + offset).astype(jnp.uint8)


def decode(index, book: CodeBook, xp=jnp):
  """The ``float32`` entries of ``book`` at ``index`` (``xp``: jax.numpy, or
  numpy to build the table)."""
  index = index.astype(xp.int32)
  if not book.dynamic:
    return (index + 1).astype(xp.float32) / np.float32(2 ** book.bits)
  offset = index - book.zero_index
  rank = xp.abs(offset) - 1
  magnitude = _dynamic_magnitude(xp.maximum(rank, 0), book.levels, xp)
  signed = xp.sign(offset).astype(xp.float32) * magnitude
  return xp.where(offset == 0, np.float32(0.0), signed).astype(xp.float32)


def pack(index, axis: int):
  """Two 4-bit indices per byte along ``axis`` (even length ``2h``): entry
  ``k`` in the low nibble, entry ``k + h`` in the high one.

  A weighted sum over the pair (taking the halves as slices made XLA:CPU
  recompute the fused codes per half, 20x slower). Where ``axis`` is sharded
  so that its halves cannot be split off (a tile not fitted to the shards),
  the sum does not trace on Explicit meshes and the slices are used.
  """
  try:
    return _pack_by_sum(index, axis)
  except Exception as err:  # jax's ShardingTypeError is not public
    if type(err).__name__ != "ShardingTypeError":
      raise
    half = index.shape[axis] // 2
    low = jax.lax.slice_in_dim(index, 0, half, axis=axis)
    high = jax.lax.slice_in_dim(index, half, 2 * half, axis=axis)
    return (low | (high << 4)).astype(jnp.uint8)


def _pack_by_sum(index, axis: int):
  shape = index.shape
  pairs = index.reshape(*shape[:axis], 2, shape[axis] // 2, *shape[axis + 1:])
  weights = np.asarray([1, 16], np.int32).reshape(
      (1,) * axis + (2,) + (1,) * (len(shape) - axis))
  return jnp.sum(pairs.astype(jnp.int32) * weights, axis=axis).astype(jnp.uint8)


def unpack(packed, axis: int):
  """Inverse of ``pack``: ``axis`` doubles in length."""
  return jnp.concatenate([packed & 0xF, packed >> 4], axis=axis)
