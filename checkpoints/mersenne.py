"""Arithmetic modulo the Mersenne prime P = 2**61 - 1 on uint64 NumPy arrays.

Products of two residues need 122 bits; ``mul`` splits each factor into 32-bit
halves so every partial product fits a uint64, and folds with 2**61 = 1 (mod P).
"""

import functools

import numpy as np

__all__ = ["P", "fold", "mul", "polynomial", "powers", "sum_along"]

P = (1 << 61) - 1
_P = np.uint64(P)
_LOW32 = np.uint64((1 << 32) - 1)
_LOW29 = np.uint64((1 << 29) - 1)


def fold(x: np.ndarray) -> np.ndarray:
  """Any uint64 values as residues in [0, P)."""
  x = (x & _P) + (x >> np.uint64(61))  # < 2**61 + 8
  return x - (x >= _P).astype(np.uint64) * _P


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """``a * b mod P`` of residues (broadcasting)."""
  a0, a1 = a & _LOW32, a >> np.uint64(32)  # a1 < 2**29
  b0, b1 = b & _LOW32, b >> np.uint64(32)
  low = a0 * b0  # < 2**64
  mid = a0 * b1 + a1 * b0  # < 2**62; mid * 2**32 = (mid >> 29) * 2**61 + (mid & LOW29) * 2**32
  high = a1 * b1  # < 2**58; high * 2**64 = 8 * high (mod P)
  total = ((high << np.uint64(3)) + (mid >> np.uint64(29)) + ((mid & _LOW29) << np.uint64(32))
           + (low & _P) + (low >> np.uint64(61)))  # < 2**63
  return fold(total)


def sum_along(x: np.ndarray, axis: int = -1) -> np.ndarray:
  """Sum of residues along ``axis``, mod P (halves summed apart: exact below 2**32 terms)."""
  low = (x & _LOW32).sum(axis=axis, dtype=np.uint64)
  high = fold((x >> np.uint64(32)).sum(axis=axis, dtype=np.uint64))
  return fold(fold(low) + mul(high, np.uint64(1 << 32)))


@functools.lru_cache(maxsize=256)
def powers(z: int, start: int, n: int) -> np.ndarray:
  """``[z**start, ..., z**(start + n - 1)] mod P`` as uint64 (read-only; cached: the shards of a
  state share their offsets and extents)."""
  out = np.array([pow(z, start, P)], np.uint64)
  while out.size < n:
    out = np.concatenate([out, mul(out, np.uint64(pow(z, out.size, P)))])
  out = out[:n]
  out.flags.writeable = False
  return out


def polynomial(coefficients: np.ndarray, starts, points) -> int:
  """``sum over i of c[i] * prod_d points[d] ** (starts[d] + i_d) mod P`` of a uint64 array ``c``
  (any values; reduced mod P first): the multilinear form of an array whose index ``i`` sits at
  ``starts + i`` in a larger one, so parts of an array add up to the whole's value."""
  h = fold(coefficients)
  for d in reversed(range(h.ndim)):
    h = sum_along(mul(h, powers(int(points[d]), int(starts[d]), h.shape[-1])))
  return int(h)
