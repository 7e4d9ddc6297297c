"""Blocked views of params for Shampoo and SOAP, aligned with the param's shards.

A param of shape ``(d_1, ..., d_k)`` is cut, along each dimension ``i``, into
``n_i = d_i / b_i`` blocks of ``b_i`` elements. ``n_i`` is a multiple of
``g_i = gcd(d_i, max_shards)`` (``max_shards``: the devices a dimension may
be split over, by default all of them), and ``b_i`` is the largest divisor of
``d_i / g_i`` not above ``block_size``. Every even split of the dimension
over ``s`` devices has ``s`` dividing ``g_i``, so each shard holds
``n_i / s`` whole blocks, whatever the mesh; and ``b_i`` depends on the
shape alone, so every trace of ``init`` (sharded or not) builds the same
state. The blocked view has shape
``(n_1, ..., n_k, b_1, ..., b_k)``: block indices first, then the position
inside the block. A per-dimension statistic of the blocks has shape
``(n_1, ..., n_k, b_i, b_i)``; its leading block dimensions carry the param's
mesh axes, so the statistics of a block live on the device that holds that
block of the param, and ``shardopt.sharding`` derives their shardings like
any other state leaf.

``init`` checks the tiling when it is traced on sharded params (as
``plan_state_shardings`` does) and raises, naming the param, when a split
is uneven or ``max_shards`` was set below it.
"""

import math
import string
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "BlockLayout",
    "apply_along",
    "block_layout",
    "block_sizes",
    "check_aligned",
    "explicit_spec",
    "eye_like",
    "from_blocks",
    "gram",
    "is_blocked",
    "refresh_due",
    "reshape",
    "to_blocks",
    "unzip",
]

_OUTER = string.ascii_lowercase[:8]
_INNER = string.ascii_uppercase[:8]


class BlockLayout(NamedTuple):
  """How one param is cut into blocks."""

  shape: tuple[int, ...]  # the param's shape
  block: tuple[int, ...]  # b_i: block length per dimension
  grid: tuple[int, ...]  # n_i: blocks per dimension

  def __str__(self) -> str:
    if not self.block:
      return f"{self.shape}: not blocked (rank < 2)"
    return (f"{self.shape}: {' x '.join(map(str, self.grid))} blocks of "
            f"{' x '.join(map(str, self.block))}")


def is_blocked(shape) -> bool:
  """Params of rank 2 and more are preconditioned per block; others are not."""
  return 2 <= len(shape) <= len(_OUTER)


def _largest_divisor(n: int, at_most: int) -> int:
  return max(b for b in range(1, min(n, at_most) + 1) if n % b == 0)


def block_sizes(shape, block_size: int,
                max_shards: int | None = None) -> tuple[int, ...]:
  """Per dimension ``d``, the largest divisor of ``d / gcd(d, max_shards)``
  not above ``block_size`` (``max_shards`` None: ``jax.device_count()``)."""
  shards = jax.device_count() if max_shards is None else max_shards
  return tuple(_largest_divisor(d // math.gcd(d, shards), block_size)
               for d in shape)


def block_layout(params, block_size: int, max_shards: int | None = None) -> Any:
  """The ``BlockLayout`` of every param (``str()`` of one reads as a sentence).

  Args:
    params: a tree of arrays or ``jax.ShapeDtypeStruct``.
    block_size: the ``block_size`` given to ``shampoo``/``soap``.
    max_shards: their ``max_shards``.

  Returns:
    A tree of ``BlockLayout`` with the structure of ``params``.
  """
  def layout(p):
    shape = tuple(p.shape)
    if not is_blocked(shape):
      return BlockLayout(shape, (), ())
    block = block_sizes(shape, block_size, max_shards)
    return BlockLayout(shape, block, tuple(d // b for d, b in zip(shape, block)))
  return jax.tree.map(layout, params)


def explicit_spec(x) -> tuple | None:
  """``x``'s spec (one entry per dim) when it carries Explicit mesh axes."""
  sharding = getattr(jax.typeof(x), "sharding", None)
  if sharding is None or sharding.mesh.empty or not any(sharding.spec):
    return None
  spec = tuple(sharding.spec)
  return spec + (None,) * (x.ndim - len(spec))


def in_layout_of(x: jax.Array, like: jax.Array) -> jax.Array:
  """``x`` resharded to ``like``'s layout on Explicit mesh axes (a state
  split further by ZeRO than its param), unchanged elsewhere."""
  sharding = getattr(jax.typeof(like), "sharding", None)
  if sharding is None or jax.sharding.AxisType.Explicit not in getattr(
      sharding.mesh, "axis_types", ()):
    return x
  return jax.sharding.reshard(x, NamedSharding(sharding.mesh, sharding.spec))


def reshape(x, shape, spec_entries):
  """``x.reshape(shape)``, telling JAX the result's spec on Explicit axes."""
  if spec_entries is None:
    return jnp.reshape(x, shape)
  mesh = jax.typeof(x).sharding.mesh
  return jax.lax.reshape(x, shape,
                         out_sharding=NamedSharding(mesh, P(*spec_entries)))


def to_blocks(x: jax.Array, block: tuple[int, ...]) -> jax.Array:
  """``(d_1..d_k) -> (n_1..n_k, b_1..b_k)``; block dims keep ``x``'s axes."""
  k = x.ndim
  split = [s for d, b in zip(x.shape, block) for s in (d // b, b)]
  spec = explicit_spec(x)
  split_spec = None if spec is None else [e for s in spec for e in (s, None)]
  y = reshape(x, split, split_spec)
  return jnp.transpose(y, [2 * i for i in range(k)] + [2 * i + 1 for i in range(k)])


def from_blocks(y: jax.Array, like: jax.Array) -> jax.Array:
  """Inverse of ``to_blocks``: back to ``like``'s shape (and spec)."""
  k = like.ndim
  order = [j for i in range(k) for j in (i, k + i)]
  return reshape(jnp.transpose(y, order), like.shape, explicit_spec(like))


def _subscripts(k: int) -> tuple[str, str]:
  return _OUTER[:k], _INNER[:k]


def gram(blocks: jax.Array, dim: int) -> jax.Array:
  """Per block, ``G_(i) G_(i)^T`` along inner dim ``dim``: ``(n.., b_i, b_i)``."""
  k = blocks.ndim // 2
  outer, inner = _subscripts(k)
  other = inner.replace(inner[dim], "z")
  spec = f"{outer}{inner},{outer}{other}->{outer}{inner[dim]}z"
  return jnp.einsum(spec, blocks, blocks)


def apply_along(mats: jax.Array, blocks: jax.Array, dim: int,
                transpose: bool = False) -> jax.Array:
  """Per block, multiplies inner dim ``dim`` by ``mats`` (``M x`` or ``M^T x``)."""
  k = blocks.ndim // 2
  outer, inner = _subscripts(k)
  pair = f"z{inner[dim]}" if transpose else f"{inner[dim]}z"
  source = inner.replace(inner[dim], "z")
  return jnp.einsum(f"{outer}{pair},{outer}{source}->{outer}{inner}",
                    mats, blocks)


def eye_like(mats: jax.Array) -> jax.Array:
  """Identity matrices in every block, laid out like ``mats``."""
  return jnp.zeros_like(mats) + jnp.eye(mats.shape[-1], dtype=mats.dtype)


def check_aligned(path: str, x, block: tuple[int, ...]) -> None:
  """Raises when blocks of ``x`` would straddle two shards of ``x``."""
  spec = explicit_spec(x)
  if spec is None:
    return
  mesh = jax.typeof(x).sharding.mesh
  for dim, (entry, d, b) in enumerate(zip(spec, x.shape, block)):
    names = entry if isinstance(entry, tuple) else (entry,)
    split = math.prod(mesh.shape[n] for n in names if n is not None)
    if d % split or (d // b) % split:
      raise ValueError(
          f"params{path}: dimension {dim} (length {d}) is split over mesh "
          f"axes {entry} ({split} devices), which blocks of {b} do not tile, "
          "so a block's statistics would span devices. Split it evenly, and "
          f"leave max_shards at its default (all devices) or pass a multiple "
          f"of {split}.")


def refresh_due(count, start: int, every: int) -> jax.Array:
  """Whether step ``count`` (1-based) recomputes the preconditioners: at
  ``start`` and every ``every`` steps after it."""
  return (count >= start) & ((count - start) % every == 0)


def unzip(template, results, size: int) -> tuple:
  """A tree of ``size``-tuples (at ``template``'s leaves) as ``size`` trees."""
  return tuple(jax.tree.map(lambda _, r, i=i: r[i], template, results)
               for i in range(size))
