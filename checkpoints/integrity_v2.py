"""The checksum of steps written in format 2 (``u32-sum-and-index-moments/1``), to verify them.

Over the words ``u`` of a leaf (``integrity.words``) at global index
``(i_0, ..., i_{k-1})`` (a 0-d leaf counts as shape ``(1,)``):
``[sum(u), sum(u * i_0), ..., sum(u * i_{k-1})]``, all modulo 2**32. Linear
modulo 2**32, it misses damage whose sums cancel there, e.g. two sign flips at
indices of the same parity (2**31 * 2 = 0); new steps use ``integrity``.
"""

from typing import Any

import jax
import numpy as np

from checkpoints import integrity

__all__ = ["ALGORITHM", "checksums"]

ALGORITHM = "u32-sum-and-index-moments/1"
_MASK = (1 << 32) - 1


def _moment(v: np.ndarray) -> int:
  """``sum(j * v[j])`` modulo 2**32 of a vector of words."""
  return int(np.dot(np.arange(v.shape[0], dtype=np.uint64), v.astype(np.uint64))) & _MASK


def _partial(block: np.ndarray) -> list[int]:
  """``[sum(u), sum(u * j_0), ...]`` of one block with *local* indices ``j``."""
  u = integrity.words(block.reshape(block.shape or (1,))).astype(np.uint64)
  sums = [int(u.sum()) & _MASK]
  for d in range(u.ndim):
    sums.append(_moment(u.sum(axis=tuple(a for a in range(u.ndim) if a != d))))
  return sums


def checksums(leaves: dict[str, Any]) -> dict[str, list[int]]:
  """``{leaf name: checksum}`` of the arrays as read (a collective with several processes)."""
  out = {}
  for name, leaf in leaves.items():
    total = [0] * (1 + max(np.ndim(leaf), 1))
    for block, starts, _ in integrity.local_blocks(leaf):
      partial = _partial(np.asarray(block))
      total[0] = (total[0] + partial[0]) & _MASK
      for d, (moment, start) in enumerate(zip(partial[1:], starts)):
        total[d + 1] = (total[d + 1] + moment + start * partial[0]) & _MASK
    out[name] = total
  if jax.process_count() > 1 and out:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    flat = np.array([v for sums in out.values() for v in sums], np.uint32)
    summed = np.asarray(multihost_utils.process_allgather(flat)).reshape(-1, flat.size)
    summed = summed.astype(np.uint64).sum(axis=0) & _MASK
    at = 0
    for name, sums in out.items():
      out[name] = [int(v) for v in summed[at:at + len(sums)]]
      at += len(sums)
  return out
