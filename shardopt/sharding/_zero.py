"""ZeRO: where one more mesh axis goes on a state leaf, or why it cannot.

Every state leaf of at least ``min_shard_bytes`` (its whole size) gets the
ZeRO axis on one free (``None`` in its spec), divisible dimension; smaller
leaves stay as they are (tiny vectors replicate), and so do scalars.

All leaves derived from one param split the *same* param dimension: the
param's largest free dimension divisible by the axis size (the first on a
tie). A mirror takes it directly; a leaf that stacks copies of the param
(``(m, *param)``, as L-BFGS's memories) takes it among its trailing
dimensions; a statistic reduced from the param (Adafactor's row and column
factors, SM3's covers) takes it if it kept that dimension. Statistics of one
param are combined by broadcasting, so two of them split over one axis on
different param dimensions would be an illegal layout on Explicit meshes.
A leaf that derives from no param takes its own largest such dimension.
A leaf laid out in blocks of its param (its rank, every dimension a divisor
of the param's: quantized state's scales and packed 4-bit codes) splits the
same dimension whatever its size, when its block count there divides, so a
block, its codes and its scale live on one device. A grid of per-block
statistics (``(*blocks, *per_block)``: one leading dimension per param
dimension counting its blocks, as Shampoo's and SOAP's) splits the block
count of that dimension, when it divides, so whole blocks move together.
"""

import itertools
import math

from shardopt.sharding._specs import spec_axes

__all__ = ["DEFAULT_MIN_SHARD_BYTES", "param_dims", "zero_dimension"]

DEFAULT_MIN_SHARD_BYTES = 4096


def _free_divisible(shape, spec, size) -> tuple[str, int | None]:
  """The largest free dimension divisible by ``size``, or why none is."""
  free = [d for d in range(len(shape)) if spec[d] is None]
  if not free:
    return "not sharded: no free dimension", None
  fits = [d for d in free if shape[d] % size == 0]
  if not fits:
    return (f"not sharded: no free dimension divisible by {size} "
            f"(free dims {[shape[d] for d in free]})"), None
  dim = max(fits, key=lambda d: shape[d])
  return f"dim {dim}", dim


def _in_blocks_of(shape, param_shape) -> bool:
  """The param's rank, not its shape, every dimension a divisor of the
  param's and above 1 where the param's is (a block-wise layout)."""
  return (len(shape) == len(param_shape) and tuple(shape) != tuple(param_shape)
          and all(p % s == 0 and (s > 1 or p == 1)
                  for s, p in zip(shape, param_shape)))


def _block_grid_of(shape, param_shape) -> bool:
  """More dimensions than the param, the leading ones each a divisor of the
  param's dimension (its block count there): per-block statistics."""
  rank = len(param_shape)
  return (0 < rank < len(shape)
          and all(p % g == 0 for g, p in zip(shape[:rank], param_shape)))


def param_dims(shape, param_shape) -> list[int | None] | None:
  """Per leaf dimension, the param dimension it keeps (None: its own, e.g. a
  history dimension); None when the two shapes match no single way."""
  shape, param_shape = tuple(shape), tuple(param_shape)
  rank, param_rank = len(shape), len(param_shape)
  if shape == param_shape:
    return list(range(rank))
  if 0 < param_rank < rank and shape[-param_rank:] == param_shape:
    return [None] * (rank - param_rank) + list(range(param_rank))
  if rank == param_rank and all(s in (p, 1) for s, p in zip(shape, param_shape)):
    return [d if s == p else None for d, (s, p) in enumerate(zip(shape, param_shape))]
  if _in_blocks_of(shape, param_shape):
    return list(range(rank))
  if _block_grid_of(shape, param_shape):
    return list(range(param_rank)) + [None] * (rank - param_rank)
  if rank < param_rank:
    matches = [kept for kept in itertools.combinations(range(param_rank), rank)
               if all(shape[i] == param_shape[d] for i, d in enumerate(kept))]
    if len(matches) == 1:
      return list(matches[0])
  return None


def zero_dimension(shape, dtype, spec, param_shape, param_spec, axis: str,
                   size: int, min_shard_bytes: int) -> tuple[str, int | None]:
  """``("dim k", k)`` where ``axis`` goes on a leaf, or ``(reason, None)``.

  Args:
    shape: the leaf's shape.
    dtype: its dtype.
    spec: its spec, one entry per dimension.
    param_shape: the shape of the param it derives from, or None.
    param_spec: that param's spec (one entry per dimension), or None.
    axis: the ZeRO mesh axis.
    size: that axis's size.
    min_shard_bytes: leaves smaller than this are left as they are.

  Returns:
    ``("dim k", k)``, or a reason starting "not sharded: " and None.
  """
  if not shape:
    return "not sharded: scalar", None
  nbytes = math.prod(shape) * getattr(dtype, "itemsize", 0)
  in_blocks = param_shape is not None and _in_blocks_of(shape, param_shape)
  if nbytes < min_shard_bytes and not in_blocks:
    return (f"not sharded: {nbytes} bytes < min_shard_bytes="
            f"{min_shard_bytes}"), None
  if axis in spec_axes(spec):
    return f"not sharded: {axis!r} already used in {spec}", None
  if param_shape is None:
    return _free_divisible(shape, spec, size)
  if axis in spec_axes(param_spec):
    return (f"not sharded: its param is already sharded over {axis!r} "
            f"({param_spec})"), None
  reason, param_dim = _free_divisible(param_shape, param_spec, size)
  if param_dim is None:
    return reason, None
  kept = param_dims(shape, param_shape)
  if kept is None:
    return (f"not sharded: its shape {tuple(shape)} matches its param's "
            f"{tuple(param_shape)} in no single way"), None
  if param_dim not in kept:
    return (f"not sharded: it does not keep dimension {param_dim} of its "
            "param, the one ZeRO splits"), None
  dim = kept.index(param_dim)
  if spec[dim] is not None:
    return f"not sharded: dimension {dim} is already sharded ({spec})", None
  if shape[dim] % size:  # a block count
    return (f"not sharded: {shape[dim]} blocks along its param's ZeRO "
            f"dimension {param_dim}, not divisible by {size}"), None
  return f"dim {dim}" + (" (blocks of its param)" if in_blocks else ""), dim
