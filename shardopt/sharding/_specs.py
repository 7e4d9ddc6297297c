"""Small helpers on PartitionSpecs of state leaves."""

import math

from jax.sharding import PartitionSpec as P

__all__ = ["device_bytes", "entry_size", "full_spec", "spec_axes"]


def full_spec(spec, ndim: int) -> P:
  """``spec`` padded with ``None`` to one entry per dimension."""
  entries = tuple(spec)
  return P(*entries, *([None] * (ndim - len(entries))))


def spec_axes(spec) -> set[str]:
  """The mesh axes a spec uses."""
  names = set()
  for entry in spec:
    if isinstance(entry, tuple):
      names.update(entry)
    elif entry is not None:
      names.add(entry)
  return names


def entry_size(mesh, entry) -> int:
  """Into how many parts a spec entry (an axis, a tuple of axes or None)
  splits its dimension on ``mesh``."""
  names = entry if isinstance(entry, tuple) else (entry,)
  return math.prod(mesh.shape[n] for n in names if n is not None)


def device_bytes(leaf, spec, mesh) -> int:
  """Bytes of one shard of ``leaf`` laid out by ``spec`` on ``mesh``."""
  shard = [-(-dim // entry_size(mesh, entry)) for dim, entry in zip(leaf.shape, spec)]
  return math.prod(shard) * getattr(leaf.dtype, "itemsize", 0)
