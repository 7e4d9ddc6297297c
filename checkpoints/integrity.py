"""Checksums of saved arrays that do not depend on how the arrays are sharded.

Each leaf's bits are read as unsigned words (``uint32`` words for 4-, 8- and
16-byte dtypes, the value of each byte or 16-bit word for 1- and 2-byte dtypes,
the low bits only for sub-byte dtypes), laid out as a matrix: a row for every
index of the leading dimensions, a column for every word of the last one (a 0-d
or 1-d leaf: rows of ``ROW`` consecutive words). The checksum is a pair of
residues modulo the prime P = 2**61 - 1:

  ``[L(row sums), L(column sums)]``, with ``L(s) = sum over i of s[i] * prod_d z_d ** i_d``,

where the row and column sums are exact integers and the points ``z_d`` (one
per dimension) are drawn from a seed chosen at random for every save and kept
with the checksums. ``L`` is linear, so each process adds up the shards it holds
(one replica of each, where the bytes already are: zero-copy NumPy views of CPU
device buffers, or a small reduction on an accelerator) and the sum is the same
on every mesh.

What it catches: a change that alters some row sum or some column sum (by less
than P: by fewer than 2**29 changed words in that row or column) changes a
nonzero polynomial of degree at most ``sum_d (n_d - 1)`` (``n_d`` the extents of
the rows' or the columns' index), which vanishes at the random points with
probability at most that degree over P, below (rows + columns) / P. Row and
column sums change for any change of one to three words, for any change inside
one row or one column, and for any change that only sets, or only clears, bits
within a row: paired sign flips, a negated block of positive values
(quantization scales), an exponent bit set in one word and cleared in another.
A change escapes only if it leaves every row sum and every column sum exactly
as they were (it needs at least four words, such as +d, -d in one row and
-d, +d in another at the same columns), or in the case of probability above.

Why not TensorStore's zarr3 ``crc32c`` codec, which verifies every chunk as it
is read: Orbax 0.12.8 has no option to put it on array chunks (it puts it on
the zarr3 shard index only, in a private function), and a checksum per stored
chunk would pass a whole chunk of another step, or values rewritten by a
faulty writer, which this one does not.
"""

import concurrent.futures
import hashlib
import os
import secrets
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from checkpoints import mersenne

__all__ = ["ALGORITHM", "ROW", "checksums", "local_blocks", "mismatches", "new_seed", "point", "words"]

ALGORITHM = "exact-row-and-column-sums-mod-2^61-1/1"
ROW = 1 << 12  # words per row of a 0-d or 1-d leaf
_EXACT_ON_DEVICE = 1 << 16  # 16-bit halves summed in uint32: exact up to this many terms
_BUFFER = 1 << 20  # NumPy's casting buffer (elements) for the uint32 -> uint64 sums: 2x faster than 8192


def new_seed() -> int:
  """A fresh random seed for the points of one save (the same on every process)."""
  seed = np.array([secrets.randbits(32), secrets.randbits(32)], np.uint32)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    seed = np.asarray(multihost_utils.broadcast_one_to_all(seed))
  return int(seed[0]) << 32 | int(seed[1])


def point(seed: int, role: str, d: int) -> int:
  """The point of dimension ``d`` of the row (``role="row"``) or column sums: in [2, P),
  derived from the seed by BLAKE2b (stable across NumPy versions)."""
  digest = hashlib.blake2b(f"{seed}/{role}/{d}".encode(), digest_size=16).digest()
  return 2 + int.from_bytes(digest, "little") % (mersenne.P - 2)


def words(block: np.ndarray) -> np.ndarray:
  """``block`` (ndim >= 1) as unsigned words: a view except for sub-byte dtypes."""
  dtype = block.dtype
  bits = jax.dtypes.itemsize_bits(dtype) if dtype != np.bool_ else 8
  block = np.ascontiguousarray(block)
  if bits < 8:
    return block.view(np.uint8) & np.uint8((1 << bits) - 1)
  if dtype.itemsize in (1, 2):
    return block.view(np.uint8 if dtype.itemsize == 1 else np.uint16)
  return block.view(np.uint32)  # itemsize 4, 8, 16: the last dimension grows by itemsize // 4


def _words_per_item(dtype) -> int:
  return max(np.dtype(dtype).itemsize // 4, 1)


@jax.jit
def _device_words(block: jax.Array) -> jax.Array:
  """``words`` on the block's own device, as uint32."""
  dtype = np.dtype(block.dtype)
  bits = jax.dtypes.itemsize_bits(dtype) if dtype != np.bool_ else 8
  if dtype == np.bool_:
    return block.astype(jnp.uint32)
  if bits < 8:  # the same bits as an unsigned sub-byte integer, then widened
    return jax.lax.bitcast_convert_type(block, getattr(jnp, f"uint{bits}")).astype(jnp.uint32)
  if dtype.itemsize in (1, 2):
    unsigned = jnp.uint8 if dtype.itemsize == 1 else jnp.uint16
    return jax.lax.bitcast_convert_type(block, unsigned).astype(jnp.uint32)
  u = jax.lax.bitcast_convert_type(block, jnp.uint32)
  return u.reshape(u.shape[:-2] + (u.shape[-2] * u.shape[-1],)) if dtype.itemsize > 4 else u


@jax.jit
def _device_sums(u: jax.Array) -> tuple:
  """Row and column sums of a uint32 matrix as exact 16-bit-half sums (each < 2**32)."""
  low, high = u & 0xFFFF, u >> 16
  return (low.sum(axis=-1, dtype=jnp.uint32), high.sum(axis=-1, dtype=jnp.uint32),
          low.sum(axis=0, dtype=jnp.uint32), high.sum(axis=0, dtype=jnp.uint32))


def _sums(matrix, on_device: bool) -> tuple[np.ndarray, np.ndarray]:
  """Exact (row sums, column sums) of a 2-d block of words, as uint64."""
  if on_device and max(matrix.shape) <= _EXACT_ON_DEVICE:
    low_r, high_r, low_c, high_c = (np.asarray(s, np.uint64) for s in _device_sums(matrix))
    return low_r + (high_r << np.uint64(16)), low_c + (high_c << np.uint64(16))
  matrix = np.asarray(matrix)
  np.setbufsize(_BUFFER)  # per thread
  return matrix.sum(axis=-1, dtype=np.uint64), matrix.sum(axis=0, dtype=np.uint64)


def _pieces(u, start: int):
  """``(matrix, row, column)`` pieces of a run of words starting at flat word ``start`` of a
  0-d or 1-d leaf, cut on its rows of ``ROW`` words."""
  out, at, end = [], start, start + u.shape[0]
  while at < end:
    row, column = divmod(at, ROW)
    if column or end - at < ROW:  # a partial row
      n = min(ROW - column, end - at)
      out.append((u[at - start:at - start + n].reshape(1, n), row, column))
    else:  # full rows
      n = (end - at) // ROW * ROW
      out.append((u[at - start:at - start + n].reshape(-1, ROW), row, 0))
    at += n
  return out


def _block_hash(block, starts: list[int], on_device: bool, points) -> np.ndarray:
  """This block's share ``[L(row sums), L(column sums)]``; ``starts`` are its global offsets."""
  block = block.reshape(np.shape(block) or (1,))
  u = _device_words(block) if on_device else words(np.asarray(block))
  if u.ndim == 1:
    parts = [(m, [r], [c]) for m, r, c in _pieces(u, starts[-1])]
    rows_points, columns_points = points(1)
  else:
    parts = [(u.reshape(-1, u.shape[-1]), starts[:-1], starts[-1:])]
    rows_points, columns_points = points(u.ndim - 1)
  total = np.zeros(2, object)
  for matrix, row_starts, column_start in parts:
    row_sums, column_sums = _sums(matrix, on_device)
    row_sums = row_sums.reshape(u.shape[:-1] if u.ndim > 1 else (-1,))
    total += [mersenne.polynomial(row_sums, row_starts, rows_points),
              mersenne.polynomial(column_sums, column_start, columns_points)]
  return total % mersenne.P


def _starts(index: tuple, shape: tuple, per_item: int) -> list[int]:
  """Global start of a shard along each word dimension (a 0-d leaf: ``[0]``)."""
  starts = [s.start or 0 for s in index] or [0]
  starts[-1] *= per_item if shape else 1
  return starts


def local_blocks(leaf: Any, force_device: bool = False) -> list[tuple[Any, list[int], bool]]:
  """``(block, global word offsets, on_device)`` of the parts of a leaf this process adds up:
  one replica of each of its shards; a host value, or with several processes an array on this
  process's devices only (the same on every process), on process 0 only (it alone writes it)."""
  shape = tuple(np.shape(leaf))
  if not isinstance(leaf, jax.Array):
    return [(np.asarray(leaf), [0] * max(len(shape), 1), False)] if jax.process_index() == 0 else []
  if jax.process_count() > 1 and leaf.is_fully_addressable and jax.process_index() != 0:
    return []
  per_item = _words_per_item(leaf.dtype)
  return [(shard.data, _starts(shard.index, shape, per_item),
           force_device or shard.device.platform != "cpu")
          for shard in leaf.addressable_shards if shard.replica_id == 0]


_POOL = None


def _pool() -> concurrent.futures.ThreadPoolExecutor:
  global _POOL  # pylint: disable=global-statement
  if _POOL is None:
    _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 8),
                                                  thread_name_prefix="checkpoint_checksums")
  return _POOL


def _points(seed: int):
  """``points(leading) -> (row points, column points)`` for a matrix with ``leading`` row dims."""
  return lambda leading: ([point(seed, "row", d) for d in range(leading)], [point(seed, "column", 0)])


def _sum_over_processes(per_leaf: list[np.ndarray]) -> list[list[int]]:
  flat = [int(v) for sums in per_leaf for v in sums]
  if jax.process_count() > 1 and flat:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    halves = np.array([[v >> 32, v & 0xFFFFFFFF] for v in flat], np.uint32)  # jax has no uint64
    gathered = np.asarray(multihost_utils.process_allgather(halves)).reshape(-1, len(flat), 2)
    flat = [sum(int(h) << 32 | int(l) for h, l in column) % mersenne.P
            for column in gathered.transpose(1, 0, 2)]
  return [flat[2 * i:2 * i + 2] for i in range(len(per_leaf))]


def checksums(leaves: dict[str, Any], seed: int, *, force_device: bool = False) -> dict[str, list[int]]:
  """``{leaf name: [row residue, column residue]}`` of ``{leaf name: array}`` (as written or read).

  Every process must call it with the same names and seed (a collective with
  several processes). CPU shards are read in place by a thread pool (NumPy
  releases the GIL in its sums); accelerator shards are summed on their
  devices. ``force_device`` sums CPU shards the accelerator way (tests).
  """
  names = list(leaves)
  points = _points(seed)
  tasks = [(i, *block) for i, name in enumerate(names) for block in local_blocks(leaves[name], force_device)]
  hashes = _pool().map(lambda t: _block_hash(t[1], t[2], t[3], points), tasks)
  totals = [np.zeros(2, object) for _ in names]
  for (i, *_), h in zip(tasks, hashes):
    totals[i] = (totals[i] + h) % mersenne.P
  return dict(zip(names, _sum_over_processes(totals)))


def mismatches(saved: dict[str, list[int]], read: dict[str, list[int]]) -> list[str]:
  """Names of the leaves whose checksum as read differs from the one saved."""
  return [n for n in read if list(saved.get(n, [])) != list(read[n])]
