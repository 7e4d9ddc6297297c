"""Checksums of saved arrays that do not depend on how the arrays are sharded.

Each leaf's bits are read as unsigned words (``uint32`` words for 4-, 8- and
16-byte dtypes, the value of each byte or 16-bit word for 1- and 2-byte dtypes,
the low bits only for sub-byte dtypes). Over these words ``u`` at global index
``(i_0, ..., i_{k-1})`` (a 0-d leaf counts as shape ``(1,)``), the checksum is

  ``[sum(u), sum(u * i_0), ..., sum(u * i_{k-1})]``, all modulo 2**32.

Sums modulo 2**32 are exact in any order, so each process adds up the shards it
holds (one replica of each), where the bytes already are: zero-copy NumPy views
of CPU device buffers, or a small jitted reduction on an accelerator. Saving on
one mesh and restoring onto another gives the same numbers. Any change of a
single word changes ``sum(u)``; two words ``u_p != u_q`` exchanged between
positions whose index ``d`` differs change moment ``d`` unless
``(p_d - q_d) * (u_p - u_q)`` is a multiple of 2**32. Other damage escapes
only if it happens to leave every number unchanged (for random damage, odds of
about 2**-32 per number).
"""

import concurrent.futures
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ALGORITHM", "checksums", "mismatches"]

ALGORITHM = "u32-sum-and-index-moments/1"
_MASK = (1 << 32) - 1
_BLOCK = 1 << 12  # moments of long vectors are taken over (blocks, _BLOCK) views


def _words(block: np.ndarray) -> np.ndarray:
  """``block`` (C-contiguous, ndim >= 1) as unsigned words: a view except for sub-byte dtypes."""
  dtype = block.dtype
  bits = jax.dtypes.itemsize_bits(dtype) if dtype != np.bool_ else 8
  if bits < 8:
    return block.view(np.uint8) & np.uint8((1 << bits) - 1)
  if dtype.itemsize in (1, 2):
    return block.view(np.uint8 if dtype.itemsize == 1 else np.uint16)
  return block.view(np.uint32)  # itemsize 4, 8, 16: the last dimension grows by itemsize // 4


def _words_per_item(dtype) -> int:
  return max(np.dtype(dtype).itemsize // 4, 1)


def _moment(v: np.ndarray) -> int:
  """``sum(j * v[j])`` modulo 2**32 of a vector of unsigned words."""
  n = v.shape[0]
  if n <= 4 * _BLOCK:
    return int(np.dot(np.arange(n, dtype=np.uint64), v.astype(np.uint64))) & _MASK
  rows = n // _BLOCK
  head = v[:rows * _BLOCK].reshape(rows, _BLOCK)
  tail = v[rows * _BLOCK:]
  row_sums = head.sum(axis=1, dtype=np.uint32)
  col_sums = head.sum(axis=0, dtype=np.uint32)
  tail_sum = int(tail.sum(dtype=np.uint64))
  return (_BLOCK * _moment(row_sums) + _moment(col_sums) + rows * _BLOCK * tail_sum + _moment(tail)) & _MASK


def _host_partial(block: np.ndarray) -> list[int]:
  """``[sum(u), sum(u * j_0), ...]`` of one block with *local* indices ``j``."""
  u = _words(np.ascontiguousarray(block).reshape(block.shape or (1,)))
  if u.ndim == 1:
    return [int(u.sum(dtype=np.uint64)) & _MASK, _moment(u)]
  lead = u.sum(axis=-1, dtype=np.uint32)  # one pass; the other dimensions come from this smaller array
  last = u.reshape(-1, u.shape[-1]).sum(axis=0, dtype=np.uint32)  # second pass
  axes = tuple(range(lead.ndim))
  moments = [_moment(lead.sum(axis=axes[:d] + axes[d + 1:], dtype=np.uint32)) for d in axes]
  return [int(last.sum(dtype=np.uint64)) & _MASK] + moments + [_moment(last)]


@jax.jit
def _device_partial(block: jax.Array) -> jax.Array:
  """``_host_partial`` computed on the block's own (accelerator) device."""
  block = block.reshape(block.shape or (1,))
  dtype = np.dtype(block.dtype)
  bits = jax.dtypes.itemsize_bits(dtype) if dtype != np.bool_ else 8
  if dtype == np.bool_:
    u = block.astype(jnp.uint8)
  elif bits < 8:  # the same bits as an unsigned sub-byte integer, then widened
    u = jax.lax.bitcast_convert_type(block, getattr(jnp, f"uint{bits}")).astype(jnp.uint8)
  elif dtype.itemsize in (1, 2):
    u = jax.lax.bitcast_convert_type(block, jnp.uint8 if dtype.itemsize == 1 else jnp.uint16)
  else:
    u = jax.lax.bitcast_convert_type(block, jnp.uint32)
    if dtype.itemsize > 4:  # (..., n, words) -> (..., n * words), as NumPy's view
      u = u.reshape(u.shape[:-2] + (u.shape[-2] * u.shape[-1],))
  u = u.astype(jnp.uint32)
  sums = [jnp.sum(u, dtype=jnp.uint32)]
  sums += [jnp.sum(u * jax.lax.broadcasted_iota(jnp.uint32, u.shape, d), dtype=jnp.uint32) for d in range(u.ndim)]
  return jnp.stack(sums)


def _offsets(index: tuple, shape: tuple, words: int) -> list[int]:
  """Global start of a shard along each word dimension (a 0-d leaf: ``[0]``)."""
  starts = [s.start or 0 for s in index] or [0]
  starts[-1] *= words if shape else 1
  return starts


def _blocks(leaf: Any, force_device: bool) -> list[tuple[Any, list[int], bool]]:
  """``(block, global offsets, on_device)`` of the parts of a leaf this process adds up:
  one replica of each of its shards; a host value, or with several processes an array on this
  process's devices only (the same on every process), on process 0 only (it alone writes it)."""
  shape = tuple(np.shape(leaf))
  if not isinstance(leaf, jax.Array):
    return [(np.asarray(leaf), [0] * max(len(shape), 1), False)] if jax.process_index() == 0 else []
  if jax.process_count() > 1 and leaf.is_fully_addressable and jax.process_index() != 0:
    return []
  words = _words_per_item(leaf.dtype)
  return [(shard.data, _offsets(shard.index, shape, words), force_device or shard.device.platform != "cpu")
          for shard in leaf.addressable_shards if shard.replica_id == 0]


def _add_shard(total: list[int], partial: list[int], offsets: list[int]) -> None:
  """Adds a shard's local sums to ``total``, moving its moments to global indices."""
  count = partial[0]
  total[0] = (total[0] + count) & _MASK
  for d, (moment, start) in enumerate(zip(partial[1:], offsets)):
    total[d + 1] = (total[d + 1] + moment + start * count) & _MASK


def _local_checksums(leaves: list[Any], force_device: bool) -> list[list[int]]:
  """This process's share of each leaf's checksum.

  Accelerator shards are reduced on their devices (dispatched together, then
  fetched); CPU shards are read in place by a thread pool (NumPy releases the
  GIL in its reductions).
  """
  tasks = [(i, *block) for i, leaf in enumerate(leaves) for block in _blocks(leaf, force_device)]
  on_device = {k: _device_partial(t[1]) for k, t in enumerate(tasks) if t[3]}
  host = [k for k, t in enumerate(tasks) if not t[3]]
  partials = dict(zip(host, _pool().map(lambda k: _host_partial(np.asarray(tasks[k][1])), host)))
  partials.update({k: [int(v) for v in np.asarray(p)] for k, p in on_device.items()})
  totals = [[0] * (1 + max(np.ndim(leaf), 1)) for leaf in leaves]
  for k, (i, _, offsets, _) in enumerate(tasks):
    _add_shard(totals[i], partials[k], offsets)
  return totals


_POOL = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
  global _POOL  # pylint: disable=global-statement
  if _POOL is None:
    _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 8),
                                                  thread_name_prefix="checkpoint_checksums")
  return _POOL


def _sum_over_processes(per_leaf: list[list[int]]) -> list[list[int]]:
  if jax.process_count() == 1 or not per_leaf:
    return per_leaf
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  flat = np.array([v for sums in per_leaf for v in sums], np.uint32)
  gathered = multihost_utils.process_allgather(flat).astype(np.uint64).sum(axis=0) & _MASK
  out, at = [], 0
  for sums in per_leaf:
    out.append([int(v) for v in gathered[at:at + len(sums)]])
    at += len(sums)
  return out


def checksums(leaves: dict[str, Any], *, force_device: bool = False) -> dict[str, list[int]]:
  """``{leaf name: checksum}`` of ``{leaf name: array}`` (the arrays as written or as read).

  Every process must call it with the same names (a collective with several
  processes). ``force_device`` computes CPU shards the accelerator way (tests).
  """
  names = list(leaves)
  per_leaf = _sum_over_processes(_local_checksums([leaves[n] for n in names], force_device))
  return dict(zip(names, per_leaf))


def mismatches(saved: dict[str, list[int]], read: dict[str, list[int]]) -> list[str]:
  """Names of the leaves whose checksum as read differs from the one saved."""
  return [n for n in read if list(saved.get(n, [])) != list(read[n])]
