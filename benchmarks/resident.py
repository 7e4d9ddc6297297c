"""Bytes of arrays resident on devices, read from their addressable shards."""

import collections

import jax


def unique_and_per_device(tree) -> tuple[int, collections.Counter]:
  """(bytes of ``tree`` counting each distinct shard once, replicas not;
  bytes on each device)."""
  unique, per_device = 0, collections.Counter()
  for leaf in jax.tree.leaves(tree):
    seen = set()
    for shard in leaf.addressable_shards:
      per_device[shard.device] += shard.data.nbytes
      if str(shard.index) not in seen:
        seen.add(str(shard.index))
        unique += shard.data.nbytes
  return unique, per_device
