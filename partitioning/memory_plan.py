"""Per-device memory of sharded params and optimizer state, from shapes alone.

Leaves are arrays or ``jax.ShapeDtypeStruct``s carrying a ``.sharding``; a
NamedSharding may live on an AbstractMesh, so a plan for 256 devices needs no
devices. A leaf's bytes on a device are its largest shard's: each dimension
split ``ceil(size / ways)`` over the product of its mesh axes. Summing these is
exact for NamedShardings: the mesh's first device holds the largest shard of
every leaf. Leaves without a sharding count as replicated on every device.
Leaves whose sharding's memory kind is host memory (``pinned_host``,
``unpinned_host``: optimizer state offloaded between steps) are counted per
device as well, and also apart, so a plan tells how much of a device's share
is held in host memory rather than in the accelerator's.
"""

import math
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding

from partitioning.specs import PartitionError, entry_axes, leaf_dtype, leaves_with_paths
from partitioning.table import format_table

__all__ = ["MemoryPlan", "TreeMemory", "format_bytes", "leaf_device_bytes", "memory_plan"]

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
HOST_MEMORY_KINDS = ("pinned_host", "unpinned_host")


def format_bytes(n: float) -> str:
  """Binary units: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
  for unit in _UNITS:
    if abs(n) < 1024 or unit == _UNITS[-1]:
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
    n /= 1024


def _shard_shape(path: str, shape: tuple[int, ...], sharding: Any) -> tuple[int, ...]:
  if sharding is None:
    return shape
  if not isinstance(sharding, NamedSharding):
    return tuple(sharding.shard_shape(shape))
  mesh_shape = dict(sharding.mesh.shape)
  if len(sharding.spec) > len(shape):
    raise PartitionError(f"{path} {shape}: spec {sharding.spec} is longer than the rank.")
  out = list(shape)
  for dim, entry in enumerate(sharding.spec):
    unknown = [a for a in entry_axes(entry) if a not in mesh_shape]
    if unknown:
      raise PartitionError(f"{path}: spec {sharding.spec} names axes {unknown} not in the mesh {mesh_shape}.")
    out[dim] = -(-shape[dim] // math.prod(mesh_shape[a] for a in entry_axes(entry)))
  return tuple(out)


def leaf_device_bytes(leaf: Any, path: str = "") -> int:
  """Bytes of the largest shard of one leaf."""
  shape = tuple(np.shape(leaf))
  sharding = getattr(leaf, "sharding", None)
  return math.prod(_shard_shape(path, shape, sharding)) * leaf_dtype(leaf).itemsize


def _device_count(sharding: Any) -> int | None:
  if sharding is None:
    return None
  if isinstance(sharding, NamedSharding):
    return sharding.mesh.size
  return len(sharding.device_set)


class TreeMemory(NamedTuple):
  """Bytes of one tree: unsharded, on the most loaded device, and ideal (total / N);
  ``host_bytes``: the part of ``per_device_bytes`` in host memory."""

  total_bytes: int
  per_device_bytes: int
  ideal_bytes: float
  host_bytes: int = 0

  @property
  def ratio(self) -> float:
    """per-device / ideal: 1.0 is perfectly sharded, N is fully replicated."""
    return self.per_device_bytes / self.ideal_bytes if self.ideal_bytes else 1.0


def _tree_memory(tree: Any, num_devices: int) -> TreeMemory:
  leaves = leaves_with_paths(tree)
  total = sum(math.prod(np.shape(x)) * leaf_dtype(x).itemsize for _, x in leaves)
  on_a_device = [(leaf_device_bytes(x, path), _in_host_memory(x)) for path, x in leaves]
  per_device = sum(n for n, _ in on_a_device)
  host = sum(n for n, in_host in on_a_device if in_host)
  return TreeMemory(total, per_device, total / num_devices, host)


def _in_host_memory(leaf: Any) -> bool:
  return getattr(getattr(leaf, "sharding", None), "memory_kind", None) in HOST_MEMORY_KINDS


class MemoryPlan(NamedTuple):
  """Memory of params, optionally optimizer state and gradients, on ``num_devices`` devices."""

  num_devices: int
  params: TreeMemory
  state: TreeMemory | None
  grads: TreeMemory | None = None

  @property
  def per_device_bytes(self) -> int:
    return sum(m.per_device_bytes for m in self if isinstance(m, TreeMemory))

  def table(self) -> str:
    """A printable table: total, per device, ideal and their ratio per tree."""
    trees = [("params", self.params), ("grads", self.grads), ("opt state", self.state)]
    rows = [(name, m) for name, m in trees if m is not None]
    if len(rows) > 1:
      name = "+".join("state" if n == "opt state" else n for n, _ in rows)
      rows.append((name, TreeMemory(*(sum(v) for v in zip(*(m for _, m in rows))))))
    header = ("", "total", "per device", "ideal (total/N)", "per-device/ideal")
    body = [
        (name, format_bytes(m.total_bytes), format_bytes(m.per_device_bytes),
         format_bytes(m.ideal_bytes), f"{m.ratio:.3f}")
        for name, m in rows
    ]
    if any(m.host_bytes for _, m in rows):  # offloaded state: say how much of a share it is
      header += ("of which in host memory",)
      body = [row + (format_bytes(m.host_bytes),) for row, (_, m) in zip(body, rows)]
    return f"Memory plan on {self.num_devices} devices\n" + format_table(header, body, right_from=1)


def memory_plan(params: Any, state: Any = None, *, grads: Any = None,
                num_devices: int | None = None) -> MemoryPlan:
  """Plans per-device bytes of ``params``, optimizer ``state`` and ``grads`` from their shardings.

  ``grads`` are the gradients as the step holds them (the sharded step keeps
  them in the params' shardings: pass the params again). ``num_devices``
  defaults to the largest device count among the leaves' shardings (a
  NamedSharding's mesh size); pass it when no leaf has one.
  """
  if num_devices is None:
    counts = [
        _device_count(getattr(x, "sharding", None))
        for x in jax.tree.leaves((params, state, grads))
    ]
    counts = [c for c in counts if c is not None]
    if not counts:
      raise PartitionError("No leaf carries a sharding: pass num_devices=... to memory_plan.")
    num_devices = max(counts)
  optional = lambda tree: None if tree is None else _tree_memory(tree, num_devices)
  return MemoryPlan(num_devices, _tree_memory(params, num_devices), optional(state),
                    optional(grads))
