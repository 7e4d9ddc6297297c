"""A batch axis split into microbatches and merged back, its sharding kept.

The split is column-major, ``(num_microbatches, microbatch_size)``:
microbatch ``j`` holds rows ``j, j + n, j + 2n, ...``, so a batch axis split
over a mesh axis stays split within every microbatch (on an Explicit mesh
the new axes' specs say so).
"""

from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from shardopt._src import typed_layouts

__all__ = ["merge_batch_axis", "reshape_batch_axis"]


def reshape_batch_axis(tree: Any, microbatch_size: int, axis: int = 0) -> Any:
  """Splits each leaf's batch axis into ``(num_microbatches, microbatch_size)``.

  Column-major, so that the batch axis's sharding carries over to the
  ``microbatch_size`` axis; the ``num_microbatches`` axis is replicated.

  Args:
    tree: arrays with a batch axis.
    microbatch_size: rows per microbatch.
    axis: the batch axis.

  Returns:
    The tree with each batch axis split in two at ``axis``.

  Raises:
    ValueError: on an Explicit mesh, when the number of shards of the batch
      axis does not divide ``microbatch_size``.
  """
  def split(x):
    shape = x.shape[:axis] + (-1, microbatch_size) + x.shape[axis + 1:]
    sharding = typed_layouts.explicit_sharding(x)
    if sharding is None:
      return x.reshape(shape, order="F")
    spec = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
    shards = x.shape[axis] // sharding.shard_shape(x.shape)[axis]
    if microbatch_size % shards:
      raise ValueError(f"reshape_batch_axis: the batch axis is split into {shards} shards,"
                       f" which must divide microbatch_size={microbatch_size}")
    spec = PartitionSpec(*spec[:axis], None, spec[axis], *spec[axis + 1:])
    return x.reshape(shape, order="F", out_sharding=NamedSharding(sharding.mesh, spec))

  return jax.tree.map(split, tree)


def merge_batch_axis(x):
  """Merges axes 0 and 1 of ``x`` (``(num_microbatches, microbatch_size)``)
  back into the batch's row order: the inverse of ``reshape_batch_axis`` at
  axis 0, the ``microbatch_size`` axis's sharding kept."""
  shape = (-1, *x.shape[2:])
  sharding = typed_layouts.explicit_sharding(x)
  if sharding is None:
    return x.reshape(shape, order="F")
  spec = PartitionSpec(*tuple(sharding.spec)[1:])
  return x.reshape(shape, order="F", out_sharding=NamedSharding(sharding.mesh, spec))
