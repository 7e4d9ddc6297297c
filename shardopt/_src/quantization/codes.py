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
  cannot blow up.

``encode`` rounds to the nearest entry, except that a positive value never
rounds to the zero entry of an unsigned book (the zero-point problem of Li et
al.): only an exact zero gets the zero code.
"""

import functools
from typing import NamedTuple

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
  book = CodeBook(f"{kind}-{bits}", bits, signed, dynamic, np.zeros(0))
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
  """Index ``k`` of the nearest positive magnitude, -1 where 0 is nearer."""
  tiny = np.float32(10.0 ** (1 - levels))
  safe = jnp.maximum(magnitude, tiny / 4)
  level = jnp.clip(jnp.ceil(jnp.log10(safe)).astype(jnp.int32) + levels - 1,
                   0, levels - 1)
  steps = jnp.left_shift(1, level)
  j_float = (safe / _decade(level, levels) - 0.1) * steps.astype(jnp.float32) / 0.9
  j = jnp.clip(jnp.round(j_float).astype(jnp.int32) - 1, -1, steps - 1)
  rank = steps - 1 + j
  # Below the smallest magnitude the neighbours are 0 and ``tiny``.
  return jnp.where(level == 0, jnp.where(magnitude >= tiny / 2, 0, -1), rank)


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
  """Two 4-bit indices per byte: entries ``2k`` (low nibble) and ``2k + 1``
  (high nibble) of ``axis``, which must have even length."""
  axis = axis % index.ndim
  shape = index.shape
  pairs = index.reshape(*shape[:axis], shape[axis] // 2, 2, *shape[axis + 1:])
  low = jnp.take(pairs, 0, axis=axis + 1)
  high = jnp.take(pairs, 1, axis=axis + 1)
  return (low | (high << 4)).astype(jnp.uint8)


def unpack(packed, axis: int):
  """Inverse of ``pack``: ``axis`` doubles in length."""
  axis = axis % packed.ndim
  pairs = jnp.stack([packed & 0xF, packed >> 4], axis=axis + 1)
  shape = packed.shape
  return pairs.reshape(*shape[:axis], shape[axis] * 2, *shape[axis + 1:])
