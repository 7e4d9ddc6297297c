"""ZeRO: which dimension of each param's state the ZeRO axis splits.

The decision is made once per param (``param_zero``): the state of a param
that is not yet split over the axis, of at least ``min_shard_bytes`` or with
a state leaf of at least that (L-BFGS's ``(m, *param)`` memories), is split
on the param's largest free (``None`` in its spec) dimension divisible by
the axis size (the first on a tie). The param's *update layout* is its spec
with the axis on that dimension: the sharded step hands ``tx.update`` the
param's gradient and the param itself in that layout, and ``init`` is traced
on it, so every state leaf built from the param (mirrors, statistics that
keep the dimension, quantized codes and scales, Shampoo's block grids) comes
out split the same way and every ``cond``, ``select`` or ``scan`` of the
update sees one layout. A param already split over the axis (FSDP) keeps
its layout; its state follows it and counts as ZeRO-sharded.

``leaf_zero`` then says, per state leaf, what ZeRO did: a leaf of a split
param that came out without the axis (built from a bare shape, e.g.
L-BFGS's ``(m, *param)`` memories) gets it on the dimension that keeps the
param's, when that divides; a leaf of no param (a statistic of all params,
a flattened vector) of at least ``min_shard_bytes`` gets it on its own
largest free divisible dimension; scalars and smaller leaves stay as they
are. An axis of size 1 splits nothing: no leaf counts as ZeRO-sharded over
it, each large one is listed with that reason, and the plan warns once.
"""

import math
from typing import NamedTuple

from shardopt._src.ownership import param_dims
from shardopt.sharding._specs import spec_axes

__all__ = ["DEFAULT_MIN_SHARD_BYTES", "ParamZero", "leaf_zero", "param_zero", "unit_axis"]

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


def unit_axis(axis: str) -> str:
  """Why ZeRO over an axis of size 1 splits nothing."""
  return f"not sharded: mesh axis {axis!r} has size 1, so it splits nothing"


class ParamZero(NamedTuple):
  """ZeRO's decision for one param's state."""

  dim: int | None  # the param dimension split over the axis, if any
  reason: str  # "dim k", possibly with a note, or "not sharded: <why>"
  own_layout: bool = False  # the param itself is split over the axis (FSDP)


def param_zero(shape, dtype, spec, axis: str, size: int,
               min_shard_bytes: int, state_bytes: int = 0) -> ParamZero:
  """Where ZeRO splits the state of a param of ``shape`` laid out ``spec``.

  Args:
    shape: the param's shape.
    dtype: its dtype.
    spec: its spec, one entry per dimension.
    axis: the ZeRO mesh axis.
    size: that axis's size.
    min_shard_bytes: params smaller than this, whose state leaves are all
      smaller too, keep their state's layout.
    state_bytes: the bytes of the param's largest state leaf.
  """
  if size == 1:
    return ParamZero(None, unit_axis(axis))
  for dim, entry in enumerate(spec):
    if axis in spec_axes((entry,)):
      return ParamZero(dim, f"dim {dim} (the param's own layout)", True)
  if not shape:
    return ParamZero(None, "not sharded: scalar param")
  nbytes = math.prod(shape) * getattr(dtype, "itemsize", 0)
  if max(nbytes, state_bytes) < min_shard_bytes:
    largest = f" and its largest state leaf {state_bytes}" if state_bytes > nbytes else ""
    return ParamZero(None, f"not sharded: its param has {nbytes} bytes{largest} < "
                     f"min_shard_bytes={min_shard_bytes}")
  reason, dim = _free_divisible(shape, spec, size)
  return ParamZero(dim, reason)


def leaf_zero(shape, dtype, spec, param_shape, zero: ParamZero | None,
              axis: str, size: int,
              min_shard_bytes: int) -> tuple[str, int | None]:
  """What ZeRO does to one state leaf: ``(outcome, dim)``.

  Args:
    shape: the leaf's shape.
    dtype: its dtype.
    spec: its spec as derived, one entry per dimension.
    param_shape: the shape of the param it derives from, or None.
    zero: that param's ``param_zero``, or None.
    axis: the ZeRO mesh axis.
    size: that axis's size.
    min_shard_bytes: leaves of no param smaller than this stay as they are.

  Returns:
    ``(outcome, dim)``: the outcome starts with ``"dim k"`` when the leaf is
    split over ``axis`` on dimension ``k`` (``dim`` is ``k`` when the axis
    must still be added there, None when the leaf has it already), else it
    is a reason starting ``"not sharded: "`` and ``dim`` is None.
  """
  if not shape:
    return "not sharded: scalar", None
  if size == 1:
    return unit_axis(axis), None
  for dim, entry in enumerate(spec):
    if axis in spec_axes((entry,)):
      own = zero is not None and zero.own_layout
      return f"dim {dim}" + (" (the param's own layout)" if own else ""), None
  if zero is None:
    nbytes = math.prod(shape) * getattr(dtype, "itemsize", 0)
    if nbytes < min_shard_bytes:
      return (f"not sharded: {nbytes} bytes < min_shard_bytes="
              f"{min_shard_bytes}"), None
    reason, dim = _free_divisible(shape, spec, size)
    return reason, dim
  if zero.dim is None:
    return zero.reason, None
  kept = param_dims(shape, param_shape)
  if kept is None:
    return (f"not sharded: its shape {tuple(shape)} matches its param's "
            f"{tuple(param_shape)} in no single way"), None
  if zero.dim not in kept:
    return (f"not sharded: it does not keep dimension {zero.dim} of its "
            "param, the one ZeRO splits"), None
  dim = kept.index(zero.dim)
  if spec[dim] is not None:
    return f"not sharded: dimension {dim} is already sharded ({spec})", None
  if shape[dim] % size:  # a block count
    blocks = f"{shape[dim]} block" + ("" if shape[dim] == 1 else "s")
    return (f"not sharded: {blocks} along its param's ZeRO dimension "
            f"{zero.dim}, not divisible by {size}"), None
  return f"dim {dim}", dim
