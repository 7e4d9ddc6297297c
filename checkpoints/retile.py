"""Quantized optimizer state restored onto a mesh whose blocks differ.

``shardopt.quantized_state`` fits its blocks (tiles of each moment) inside
one device's shard, so the same state saved on one mesh may have other
tiles, hence other code and scale shapes, than the restore target built for
another mesh. ``saved_tiles`` gives, for every quantized leaf of the target
whose saved shapes differ, a stand-in of the saved shapes (read in the
target's layout where it divides them, else whole on every device);
``retile`` then re-encodes each one in the target's tiles, placed in the
target's shardings. Where the tiles agree nothing changes: those leaves are
read as they are, bit for bit.

What the codes mean (width, code family, sign) is not in their shapes:
``code_notes`` describes it for the saved layout, so a restore into codes
of another meaning is refused as a layout difference, never misread.
"""

from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
from jax.sharding import SingleDeviceSharding

import shardopt
from checkpoints import layout

__all__ = ["code_notes", "retile", "saved_tiles"]


def _is_quantized(x) -> bool:
  return isinstance(x, shardopt.QuantizedArray)


def _divides(shape, sharding) -> bool:
  return all(n % split == 0 for n, split in
             zip(shape, _splits(sharding, len(shape))))


def _splits(sharding, ndim: int) -> list[int]:
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
  out = []
  for entry in spec:
    names = entry if isinstance(entry, tuple) else (entry,)
    size = 1
    for name in names:
      if name is not None:
        size *= sharding.mesh.shape[name]
    out.append(size)
  return out


def _stand_in(saved_spec: dict, like) -> jax.ShapeDtypeStruct:
  """A leaf of the saved shape, in ``like``'s spec where it divides (else
  whole on every device), in device memory: ``retile`` computes on it there
  and writes the result to the memory ``like`` lives in (host-offloaded
  state: ``state_memory_kind``). A target on one device reads it whole
  there; one without a sharding keeps none (the read then says what to
  pass, as for any leaf)."""
  shape = tuple(saved_spec["shape"])
  sharding = getattr(like, "sharding", None)
  if isinstance(sharding, NamedSharding):
    spec = sharding.spec if _divides(shape, sharding) else PartitionSpec()
    sharding = NamedSharding(sharding.mesh, spec)
  elif isinstance(sharding, SingleDeviceSharding):
    sharding = SingleDeviceSharding(next(iter(sharding.device_set)))
  return jax.ShapeDtypeStruct(shape, like.dtype, sharding=sharding)


def code_notes(tree: Any, prefix: str = "") -> dict[str, dict]:
  """``{name of each quantized leaf's codes: {"quantized": its code}}``
  (e.g. ``"8-bit companded signed"``), the names as ``layout.named_leaves``
  gives them (after ``prefix``, where given)."""
  nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_quantized)[0]
  start = f"{prefix}." if prefix else ""
  return {f"{start}{layout.leaf_name(path)}.codes": {"quantized": _meaning(node)}
          for path, node in nodes if _is_quantized(node)}


def _meaning(q) -> str:
  return f"{q.bits}-bit {q.code} {'signed' if q.signed else 'non-negative'}"


def saved_tiles(target: Any, saved: dict[str, dict]) -> tuple[Any, list[str]]:
  """``(read_target, names)``: ``target`` with each quantized leaf whose
  saved codes or scales have other shapes replaced by a stand-in of the
  saved shapes, and the names of those leaves."""
  nodes, treedef = jax.tree_util.tree_flatten_with_path(
      target, is_leaf=_is_quantized)
  changed, out = [], []
  for path, node in nodes:
    if not _is_quantized(node):
      out.append(node)
      continue
    name = layout.leaf_name(path)
    codes, scales = saved.get(f"{name}.codes"), saved.get(f"{name}.scales")
    if (codes is None or scales is None
        or (tuple(codes["shape"]), tuple(scales["shape"]))
        == (tuple(node.codes.shape), tuple(node.scales.shape))):
      out.append(node)
      continue
    changed.append(name)
    out.append(shardopt.QuantizedArray(
        _stand_in(codes, node.codes), _stand_in(scales, node.scales),
        node.shape, node.bits, node.signed, node.code))
  return jax.tree_util.tree_unflatten(treedef, out), changed


def retile(state: Any, target: Any) -> Any:
  """``state`` (read with ``saved_tiles``' stand-ins) with every quantized
  leaf in ``target``'s tiles and shardings."""
  def one(read, like):
    if not _is_quantized(read) or (
        read.codes.shape == like.codes.shape
        and read.scales.shape == like.scales.shape):
      return read
    shardings = shardopt.QuantizedArray(
        like.codes.sharding, like.scales.sharding, like.shape, like.bits,
        like.signed, like.code)
    return jax.jit(lambda q: shardopt.retile_quantized(q, like),
                   out_shardings=shardings)(read)
  return jax.tree.map(one, state, target, is_leaf=_is_quantized)
