"""How ``quantized_state`` stores each float leaf: tile and width, or why not.

Blocks are tiles of the global array fitted, when ``init`` is traced with
the params typed by their layout (as ``shardopt.make_sharded_optimizer``
and ``shardopt.state_shardings`` do, ZeRO included), inside one device's
shard of the moment: quantizing and decoding then need no communication.
With ``block_layout="portable"``, where a block of at least half
``block_size`` fits the shard of every mesh of as many devices that splits
the same dimensions, the blocks are fitted to all of them, so a checkpoint
moved between such meshes keeps its blocks.
Which param a moment belongs to comes from the stand-in trace of
``shardopt._src.ownership``, the same the sharding layer uses.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import moments
from shardopt._src import ownership
from shardopt._src import typed_layouts
from shardopt._src.quantization import blocks

__all__ = ["BLOCK_LAYOUTS", "Decision", "decide", "moment_code"]

BLOCK_LAYOUTS = ("portable", "fitted")
_SMALLEST_BLOCK = 32


class Decision(NamedTuple):
  """How one float state leaf is stored: ``tile`` (None: kept) and
  ``bits``, and why it is kept or wider than asked (else "")."""

  tile: tuple[int, ...] | None
  signed: bool
  reason: str
  bits: int
  no_block_fits: bool = False  # a moment kept in float for want of a tile


def _block_sizes(most: int, least: int) -> list[int]:
  """The block sizes a moment may get, largest first: ``most`` (a power of
  two) halved while at least ``least``."""
  sizes = []
  while most >= least:
    sizes.append(most)
    most //= 2
  return sizes


def _largest_tile(shape, sizes: list[int], fit):
  """The tile of the first of ``sizes`` (largest first) whose lengths
  divide ``fit``; None if there is none."""
  tiles = (blocks.choose_tile(shape, size, fit) for size in sizes)
  return next((tile for tile in tiles if tile is not None), None)


def _words(sizes: list[int]) -> str:
  """``[256, 128, 64]`` as ``"256, 128 or 64"``."""
  shown = [str(n) for n in sizes]
  return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _is_float(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _tile(leaf, block_size: int,
          block_layout: str) -> tuple[tuple[int, ...] | None, str]:
  """The tile of a moment, or why none: for a ``"portable"`` layout the
  largest of at most ``block_size`` elements inside its shard on every mesh
  of as many devices that splits the same dimensions (a checkpoint moved
  between them keeps its blocks), where one of at least half
  ``block_size`` is; else the largest, down to ``_SMALLEST_BLOCK``, inside
  this mesh's shard."""
  if block_layout == "portable":
    portable = _largest_tile(leaf.shape, _block_sizes(block_size, max(block_size // 2, 1)),
                             typed_layouts.finest_shard_shape(leaf))
    if portable is not None:
      return portable, ""
  fit = typed_layouts.shard_shape(leaf)
  smallest = min(_SMALLEST_BLOCK, block_size)
  sizes = _block_sizes(block_size, smallest)
  tile = _largest_tile(leaf.shape, sizes, fit)
  if tile is not None:
    return tile, ""
  return None, f"no tile of {_words(sizes)} elements divides its shard {fit}"


def moment_code(kind: moments.LeafKind, bits: int) -> tuple[bool, int]:
  """A declared moment's code: signed (else non-negative) and its width,
  ``bits`` or the ``min_bits`` it declares if more."""
  return kind.kind != moments.NONNEGATIVE, max(bits, kind.min_bits)


def decide(init, state, params, bits: int, block_size: int, min_size: int,
           block_layout: str) -> list[Decision | None]:
  """Per leaf of ``state`` (``init``'s, from ``params``): how it is stored
  (None: not a float array, nothing to report; a float scalar is kept and
  reported)."""
  kinds = moments.leaf_kinds(state, params)
  owners = ownership.state_owners(init, params, state)
  param_shapes = [tuple(p.shape) for p in jax.tree.leaves(params)]
  decisions = []
  for leaf, kind, owner in zip(jax.tree.leaves(state), kinds, owners):
    if not _is_float(leaf):
      decisions.append(None)
      continue
    signed, width = moment_code(kind, bits)
    if kind.kind is None:
      reason = (f"{kind.kept} ({kind.field})" if kind.kept else
                f"not a declared moment ({kind.field or 'no state class'})")
    elif owner is None or tuple(leaf.shape) != param_shapes[owner]:
      reason = f"a moment not shaped like its param ({kind.field})"
    elif not leaf.shape:
      reason = f"a scalar moment ({kind.field}): no block to quantize"
    elif leaf.size < min_size:
      reason = f"{leaf.size} elements < min_size={min_size}"
    else:
      tile, reason = _tile(leaf, block_size, block_layout)
      if tile is not None and width > bits:
        reason = f"{width} bits: {kind.field} declares min_bits={width}"
      decisions.append(Decision(tile, signed, reason, width, tile is None))
      continue
    decisions.append(Decision(None, signed, reason, bits))
  return decisions
