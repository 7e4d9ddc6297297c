"""Code books for quantized optimizer state: encoding and decoding.

A code book is a sorted table of at most ``2**bits`` values in ``[-1, 1]``;
a value normalised by its block's scale is stored as the index of an entry
(a ``uint8``; two 4-bit indices share a byte: ``packing``). Encoding and
decoding are elementwise arithmetic (no table lookups), so they trace on
sharded operands, run shard-local and fuse with the optimizer's update.

Two families, chosen by ``code_book(bits, signed, code)``:

``code="companded"``: signed moments in FlashOptim's companded code
(Gonzalez Ortiz et al. 2026), non-negative moments as small unsigned floats.

* Companded signed code, ``L = 2**(bits - 1) - 1``: ``y = 2x / (1 + |x|)``
  rounded to a multiple of ``1 / L``; decoding inverts the compander,
  ``x = y / (2 - |y|)``. The compander's slope is 2 at 0 and 1/2 at 1, so
  small magnitudes get 4x the resolution of large ones. 8-bit: 255 entries,
  smallest magnitude 1/253; 4-bit: 15 entries, smallest 1/13. Rounding is to
  the nearest entry in ``y``: in ``x`` one of the two entries around the
  value, not always the nearer (``max_error`` bounds the distance).
* Minifloat zero-free code, for non-negative leaves (second moments): the
  value over its block's largest as a float with ``e`` exponent and ``m``
  mantissa bits and no sign, rounded to nearest: 8-bit ``e5m3``, entries
  ``2**-31`` to 1 (8 steps per octave, at most 1/16 of a value's octave
  off), 4-bit ``e4m0``, the powers of two ``2**-15`` to 1. A second moment's
  error is relative to the value itself, not to its block's largest, so
  ``1 / sqrt(v)`` is as accurate for the block's small values as for its
  large ones, and no positive value rounds to zero. Encoding and decoding
  are integer arithmetic on the float32 bits (exact, one division to
  normalise). (FlashOptim's linear code of ``sqrt(v)`` moved the updates of
  optimizers whose second moment spans decades in a block, AcProp's,
  by 11-15% at 8 bits: tests/test_quantized_state.py. A 4-bit e3m1, entries
  ``2**-7`` to 1, moved Adam's update 20% and AcProp's 43% off float state
  over 5 steps, against e4m0's 17% and 28%.)

``code="dynamic"`` (Dettmers et al. 2021): ``levels = bits - signed``
decades; level ``i`` holds ``2**i`` evenly spaced magnitudes
``10**(i - levels + 1) * (0.1 + 0.9 * (j + 1) / 2**i)``, ``j < 2**i``. The
largest entry is exactly 1 and zero is an entry. 8-bit signed: 255 entries,
smallest magnitude 1e-6; 8-bit unsigned: 256 entries, smallest 1e-7; 4-bit
signed: 15 entries, smallest 1e-2. The 4-bit unsigned book is the linear
zero-free code of the root above. Encoding finds the decade by comparisons
(one per level) and rounds to the nearest entry; a positive value never
rounds to the zero entry of an unsigned book (the zero-point problem of Li
et al.): only an exact zero gets the zero code.

``max_error(book)``: the largest distance from a value in ``[-1, 1]``
(signed) or ``[0, 1]`` to the entry it is stored as, in units of the
block's scale (for a root book: of roots, in units of the scale's root).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "CODES",
    "CodeBook",
    "code_book",
    "decode",
    "encode",
    "max_error",
]

CODES = ("companded", "dynamic")


class CodeBook(NamedTuple):
  """A code: its formula, width and sign, and its table (for inspection)."""

  name: str
  bits: int
  signed: bool
  kind: str  # "companded", "dynamic", "minifloat" or "linear" (zero-free)
  values: np.ndarray  # float32, ascending: the entries of indices 0, 1, ...
  root: bool = False  # the entries are of sqrt(x / scale)

  @property
  def mantissa_bits(self) -> int:
    """A minifloat book's mantissa bits (its exponent has the rest)."""
    return {8: 3, 4: 0}[self.bits]

  @property
  def levels(self) -> int:
    """Dynamic: decades; companded: steps of ``y`` per sign; linear: steps;
    minifloat: octaves."""
    if self.kind == "minifloat":
      return 2 ** (self.bits - self.mantissa_bits) - 1
    if self.kind == "companded":
      return 2 ** (self.bits - 1) - 1
    if self.kind == "linear":
      return 2 ** self.bits
    return self.bits - 1 if self.signed else self.bits

  @property
  def zero_index(self) -> int:
    """The index of 0 (signed: negatives below it); -1 for no zero entry."""
    if self.kind in ("linear", "minifloat"):
      return -1
    if self.kind == "companded":
      return self.levels
    return 2 ** self.levels - 1 if self.signed else 0

  @property
  def family(self) -> str:
    """The ``code`` (one of ``CODES``) this book belongs to."""
    return "companded" if self.kind in ("companded", "minifloat") else "dynamic"


@functools.cache
def code_book(bits: int, signed: bool, code: str = "dynamic") -> CodeBook:
  """The code book for ``bits`` in {8, 4} of family ``code`` (``CODES``).

  Signed: the companded or the dynamic code. Non-negative: companded's
  minifloat code; dynamic's unsigned code at 8 bits, the linear zero-free
  code of the root at 4."""
  if bits not in (4, 8):
    raise ValueError(f"bits={bits}: quantized state supports 8 or 4 bits.")
  if code not in CODES:
    raise ValueError(f"code={code!r}: expected one of {CODES}.")
  if signed or code == "dynamic":
    kind = "linear" if (not signed and bits == 4) else code
  else:
    kind = "minifloat"
  root = kind == "linear"
  sign = "zero-free" if kind in ("linear", "minifloat") else (
      "signed" if signed else "unsigned")
  name = f"{kind}-{sign}-{'sqrt-' if root else ''}{bits}"
  book = CodeBook(name, bits, signed, kind, np.zeros(0), root)
  size = {"companded": 2 * book.levels + 1, "linear": book.levels,
          "minifloat": (book.levels << book.mantissa_bits) + 1,
          "dynamic": 2 ** bits - 1 if signed else 2 ** bits}[kind]
  values = _entries(np.arange(size, dtype=np.uint8), book, np)
  return book._replace(values=values)


def max_error(book: CodeBook) -> float:
  """The largest ``|x - decode(encode(x))|`` over ``x`` in the book's range,
  from its table: half the widest gap for nearest-entry rounding; for the
  companded code the widest distance from an entry to the value whose
  compander lies half way to the next one; for the zero-free code also the
  distance from 0 to its first entry."""
  values = book.values.astype(np.float64)
  if book.kind == "companded":
    y = values / (1 + np.abs(values)) * 2
    middle = (y[:-1] + y[1:]) / 2
    boundary = middle / (2 - np.abs(middle))
    return float(max(np.max(boundary - values[:-1]),
                     np.max(values[1:] - boundary)))
  below = values[0] if book.zero_index < 0 else 0.0
  return float(max(np.max(np.diff(values)) / 2, below))


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


def _encode_dynamic(normalized, book: CodeBook):
  magnitude = jnp.abs(normalized) if book.signed else jnp.maximum(normalized, 0)
  rank = _dynamic_rank(magnitude, book.levels)
  if not book.signed:
    rank = jnp.where(magnitude > 0, jnp.maximum(rank, 0), -1)
  offset = jnp.where(normalized < 0, -(rank + 1), rank + 1)
  return (book.zero_index + offset).astype(jnp.uint8)


def encode(x, scale, book: CodeBook):
  """The index (``uint8``) each value of ``x`` is stored as, in units of
  ``scale`` (broadcast against ``x``): the nearest entry to ``x / scale``
  (companded: nearest in the compander; a root book: to ``sqrt(x / scale)``).

  ``x`` must lie within ``[-scale, scale]`` (unsigned books: ``[0, scale]``)
  or be nan, stored as the code nearest 0, as is ``x = 0`` where
  ``scale = 0``. Each code divides once, by a denominator that depends on
  ``x`` (by ``scale`` alone XLA would hoist a reciprocal per block into a
  loop of its own), and uses the quotient once (XLA does not fuse a division
  into a loop that reads it twice).
  """
  x = jnp.where(jnp.isnan(x), 0.0, x)
  magnitude = jnp.abs(x)
  if book.kind == "companded":  # 2n / (1 + |n|) L steps, n = x / scale
    y = x * np.float32(2 * book.levels) / jnp.where(
        scale > 0, scale + magnitude, 1.0)
    return (jnp.round(y) + book.levels).astype(jnp.uint8)
  normalized = x / jnp.where(scale > 0, jnp.maximum(scale, magnitude), 1.0)
  if book.kind == "minifloat":
    return _encode_minifloat(normalized, book)
  if book.kind == "linear":
    if book.root:
      normalized = jnp.sqrt(normalized)
    index = jnp.round(normalized * book.levels) - 1
    return jnp.clip(index, 0, book.levels - 1).astype(jnp.uint8)
  return _encode_dynamic(normalized, book)


# The float32 bits of ``2**-octaves``, shifted to a minifloat's mantissa.
def _minifloat_bias(book: CodeBook) -> int:
  return (127 - book.levels) << book.mantissa_bits


def _encode_minifloat(normalized, book: CodeBook):
  """Round ``normalized`` in [0, 1] to the nearest minifloat entry: add half
  a step to the float32 bits (a carry moves to the next octave), keep the
  exponent and the top mantissa bits, clip below the smallest entry."""
  drop = 23 - book.mantissa_bits
  bits = jax.lax.bitcast_convert_type(normalized, jnp.int32)
  index = ((bits + (1 << (drop - 1))) >> drop) - _minifloat_bias(book)
  return jnp.clip(index, 0, book.levels << book.mantissa_bits).astype(jnp.uint8)


def decode(index, scale, book: CodeBook):
  """The ``float32`` values that ``index`` stores in units of ``scale``:
  ``entry * scale`` (a root book: ``entry**2 * scale``)."""
  entry = _entries(index, book, jnp)
  return (entry * entry if book.root else entry) * scale


def _entries(index, book: CodeBook, xp):
  """The ``float32`` entries of ``book`` at ``index`` (``xp``: jax.numpy, or
  numpy to build the table)."""
  # Constant divisors as multiplications by their float32 reciprocals (XLA
  # rewrites them so; numpy must round the table the same way).
  if book.kind == "companded":
    y = (index.astype(xp.float32) - np.float32(book.levels)) * np.float32(
        1 / book.levels)
    return y / (np.float32(2) - xp.abs(y))
  if book.kind == "minifloat":
    bits = (index.astype(xp.int32) + _minifloat_bias(book)) << (
        23 - book.mantissa_bits)
    if xp is np:
      return bits.view(np.float32)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)
  if book.kind == "linear":
    return (index.astype(xp.float32) + 1) * np.float32(1 / book.levels)
  index = index.astype(xp.int32)
  offset = index - book.zero_index
  rank = xp.abs(offset) - 1
  magnitude = _dynamic_magnitude(xp.maximum(rank, 0), book.levels, xp)
  signed = xp.sign(offset).astype(xp.float32) * magnitude
  return xp.where(offset == 0, np.float32(0.0), signed).astype(xp.float32)
