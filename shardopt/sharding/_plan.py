"""The state sharding plan: how each state leaf is laid out, and why.

``LeafPlan`` is one leaf (its spec, the param it derives from, what ZeRO did
to it, its bytes per device); ``StatePlan`` is the whole state (the
``NamedSharding`` tree, the update layout, the leaves ZeRO left out, the
moments ``quantized_state`` keeps in float) and prints as a per-leaf report.
``ReplicatedStateWarning`` is what the plan warns with where state is less
sharded than asked.
"""

import math
from typing import Any
from typing import NamedTuple
import warnings

from jax.sharding import PartitionSpec as P

from shardopt._src.quantization.report import QuantizedLeaf
from shardopt.sharding._zero import DEFAULT_MIN_SHARD_BYTES

__all__ = ["LeafPlan", "ReplicatedStateWarning", "StatePlan"]


class ReplicatedStateWarning(UserWarning):
  """State that should follow its param's sharding but does not."""


class LeafPlan(NamedTuple):
  """How one state leaf is laid out, and why."""

  path: str  # the leaf's path in the state, as ``jax.tree_util.keystr``
  shape: tuple[int, ...]
  dtype: Any
  spec: P  # one entry per dimension
  param: str | None  # path of the param it derives from, if any
  mirrors: bool  # derives from ``param`` and has its shape
  zero: str  # ZeRO outcome: "dim k", a reason it was not sharded, or ""
  device_bytes: int  # bytes of this leaf resident on each device
  zero_split: bool = False  # split over the ZeRO axis (of more than one device)
  zero_added: bool = False  # ... by ZeRO (not by its param's own layout)


class StatePlan(NamedTuple):
  """Derived state shardings plus a printable per-leaf report."""

  shardings: Any  # NamedSharding tree with the structure of tx.init(params)
  leaves: tuple[LeafPlan, ...]
  axis: str | None  # the ZeRO axis, if one was asked for
  under_sharded: tuple[str, ...]  # derived leaves less sharded than their param
  min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES  # ZeRO leaves smaller alone
  # Per param (the params' tree): the layout ``tx.update`` sees the param and
  # its gradient in, the param's sharding plus the ZeRO axis on the
  # dimension its state is split on.
  update_shardings: Any = None
  axis_size: int | None = None  # the size of ``axis`` on the mesh
  # Moments a ``quantized_state`` inside the transformation keeps in float
  # because no block fits their shard here (paths in its inner state).
  float_fallbacks: tuple[QuantizedLeaf, ...] = ()

  @property
  def zero_splits_nothing(self) -> bool:
    """ZeRO was asked for over an axis of size 1, which splits nothing."""
    return self.axis is not None and self.axis_size == 1

  @property
  def zero_sharded(self) -> tuple[LeafPlan, ...]:
    """Leaves that ZeRO sharded over ``axis``."""
    return tuple(l for l in self.leaves if l.zero_split)

  @property
  def zero_skipped(self) -> tuple[LeafPlan, ...]:
    """Leaves of at least ``min_shard_bytes`` (scalars aside) that ZeRO did
    not shard over ``axis``; ``zero`` says why."""
    return tuple(
        l for l in self.leaves if self.axis and l.shape and not l.zero_split
        and _nbytes(l) >= self.min_shard_bytes)

  @property
  def zero_too_small(self) -> tuple[LeafPlan, ...]:
    """Leaves under ``min_shard_bytes`` (scalars aside) that ZeRO left as
    they were: too small to be worth splitting."""
    return tuple(
        l for l in self.leaves if self.axis and l.shape and not l.zero_split
        and _nbytes(l) < self.min_shard_bytes)

  @property
  def bytes_per_device(self) -> int:
    """Bytes of the whole state resident on each device."""
    return sum(l.device_bytes for l in self.leaves)

  def warn_zero_skipped(self, stacklevel: int = 1) -> None:
    """Warns, listing the mirrors ZeRO could not shard and why, one line
    per leaf, if any (not where the ZeRO axis has size 1:
    ``plan_state_shardings`` warned about that once); and where ZeRO split
    no leaf at all, leaves under ``min_shard_bytes`` left as they were."""
    if self.zero_splits_nothing:
      return
    if self.zero_too_small and not any(l.zero_added for l in self.leaves):
      warnings.warn(
          f"shard_state_over={self.axis!r} split no state leaf itself:"
          f" {len(self.zero_too_small)} leaves under min_shard_bytes="
          f"{self.min_shard_bytes} bytes were left as they are (pass a smaller"
          " min_shard_bytes, e.g. 0, to split those that can be)",
          ReplicatedStateWarning,
          stacklevel=stacklevel + 1)
    if self.zero_skipped:
      warnings.warn(
          f"shard_state_over={self.axis!r} left these state leaves as they were "
          "(not sharded over it by ZeRO):\n" + "\n".join(
              f"  {l.path} {l.shape}: {l.zero.removeprefix('not sharded: ')}"
              for l in self.zero_skipped),
          ReplicatedStateWarning, stacklevel=stacklevel + 1)

  def __str__(self) -> str:
    head = (f"state sharding plan: {len(self.leaves)} leaves, "
            f"{self.bytes_per_device:,} bytes per device")
    if self.zero_splits_nothing:
      head += (f"; ZeRO over {self.axis!r}: the axis has size 1, so no leaf is split"
               " (bytes per device as without ZeRO)")
    elif self.axis:
      mirrors = sum(l.mirrors for l in self.zero_skipped)
      head += (f"; ZeRO over {self.axis!r}: {len(self.zero_sharded)} sharded,"
               f" {mirrors} mirrors not, {len(self.zero_skipped) - mirrors}"
               f" other leaves >= {self.min_shard_bytes} bytes not,"
               f" {len(self.zero_too_small)} smaller left as they are")
    width = max([len(l.path) for l in self.leaves] + [4])
    lines = [head]
    for l in self.leaves:
      origin = f" <- params{l.param}" if l.param is not None else ""
      zero = f"  zero: {l.zero}" if l.zero else ""
      lines.append(f"  {l.path:<{width}}  {l.shape!s:<14} {l.dtype!s:<8} "
                   f"{l.spec}{origin}{zero}")
    if self.float_fallbacks:
      lines.append("quantized_state keeps these moments in float (paths in "
                   "its inner state):")
      lines += [f"  {l.path}  {l.shape}  {l.stored}: {l.reason}"
                for l in self.float_fallbacks]
    return "\n".join(lines)


def _nbytes(leaf: LeafPlan) -> int:
  return math.prod(leaf.shape) * getattr(leaf.dtype, "itemsize", 0)
