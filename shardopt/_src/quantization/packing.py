"""Two 4-bit code indices per byte: ``pack`` and its inverse ``unpack``.

Each is written twice, the same bytes either way, and
``jax.lax.platform_dependent`` compiles the form its backend's compiler fuses
(``benchmarks/backend_forms.py`` times one against the other).
"""

import jax
import jax.numpy as jnp
import numpy as np

from shardopt._src import typed_layouts

__all__ = ["pack", "unpack"]


def pack(index, axis: int):
  """Two 4-bit indices per byte along ``axis`` (even length ``2h``): entry
  ``k`` in the low nibble, entry ``k + h`` in the high one.

  The same bytes on every backend, written for each compiler's fusion
  (``jax.lax.platform_dependent``, as ``blocks._absmax``): on XLA:CPU by a
  window sum (``_pack_by_window_sum``), elsewhere, and wherever ``axis`` is
  split across devices in ``index``'s sharding type (Explicit mesh axes, a
  block not fitted to the shards), from the two halves
  (``_pack_halves``; with the window sum the 4-bit AdamW update took 1.03x
  as long on one H200, with the halves 2.69-3.31x on XLA:CPU:
  ``benchmarks/results/backend_forms*.md``).
  """
  if typed_layouts.split_along(index, axis):
    return _pack_halves(index, axis)
  return jax.lax.platform_dependent(
      index, cpu=lambda i: _pack_by_window_sum(i, axis),
      default=lambda i: _pack_halves(i, axis))


def _pack_halves(index, axis: int):
  """``pack`` from slices of the two halves."""
  half = index.shape[axis] // 2
  low = jax.lax.slice_in_dim(index, 0, half, axis=axis)
  high = jax.lax.slice_in_dim(index, half, index.shape[axis], axis=axis)
  return (low | (high << 4)).astype(jnp.uint8)


def _pack_by_window_sum(index, axis: int):
  """``pack`` as a window sum (``reduce_window`` over windows of the two
  entries ``h`` apart, the high one weighted by 16: exact in ``uint8``),
  which XLA:CPU runs as a kernel of its own after the encode's loop. Packed
  inside that loop (a sum over a pair axis, slices of the halves, strided
  slices of neighbours or a ``uint16`` bitcast), the loop changes shape
  between its operands and its output, and XLA:CPU does not vectorise it."""
  shape = index.shape
  half = shape[axis] // 2
  weights = np.repeat(np.uint8([1, 16]), half).reshape(
      [2 * half if d == axis else 1 for d in range(len(shape))])
  weighted = index.astype(jnp.uint8) * weights
  window = tuple(2 if d == axis else 1 for d in range(len(shape)))
  dilation = tuple(half if d == axis else 1 for d in range(len(shape)))
  return jax.lax.reduce_window(weighted, np.uint8(0), jax.lax.add, window,
                               (1,) * len(shape), "VALID",
                               window_dilation=dilation)


def unpack(packed, axis: int, in_loops: bool = True):
  """Inverse of ``pack``: ``axis`` doubles in length.

  On XLA:CPU, where ``axis`` is split across devices in ``packed``'s
  sharding type, or with ``in_loops=False``: the two nibbles' arrays
  concatenated (``_unpack_concatenated``), which the compilers write out.
  Otherwise, on other backends (``jax.lax.platform_dependent``, as
  ``pack``), a shift by the half a value comes from (``_unpack_by_shifts``),
  which XLA:GPU fuses into the loops that decode the codes and XLA:CPU does
  not vectorise. ``blocks.dequantize`` asks for it for the companded
  family's books only: on one H200 the 4-bit AdamW update took 1.23x
  float32's time with it and 1.59x without, the dynamic code's 2.83x with it
  and 2.02x without (``benchmarks/results/backend_forms_gpu.md``).
  """
  if typed_layouts.split_along(packed, axis) or not in_loops:
    return _unpack_concatenated(packed, axis)
  return jax.lax.platform_dependent(
      packed, cpu=lambda p: _unpack_concatenated(p, axis),
      default=lambda p: _unpack_by_shifts(p, axis))


def _unpack_concatenated(packed, axis: int):
  return jnp.concatenate([packed & 0xF, packed >> 4], axis=axis)


def _unpack_by_shifts(packed, axis: int):
  """``unpack`` as one elementwise computation: a new axis of the two
  halves, each shifting ``packed`` by its nibble's place, merged into
  ``axis``."""
  shape = list(packed.shape)
  halves = shape[:axis] + [2] + shape[axis:]
  wide = jnp.broadcast_to(jnp.expand_dims(packed, axis), halves)
  shift = jax.lax.broadcasted_iota(jnp.uint8, halves, axis) * np.uint8(4)
  shape[axis] *= 2
  return ((wide >> shift) & np.uint8(0xF)).reshape(shape)
