"""Quantized optimizer state restored onto a mesh that lays it out otherwise.

``shardopt.quantized_state`` fits its blocks (tiles of each moment) inside
one device's shard, on every mesh of its device count where it can, so the
same state saved on one mesh may have other tiles, hence other code and
scale shapes, than the restore target built for another mesh (of another
device count, rules or ZeRO setting); or be codes on one mesh and float on
the other (no tile fits the other mesh's shard). ``saved_tiles`` gives, for every target leaf saved
in another form, a stand-in of the saved form (read in the target's layout
where it divides it, else whole on every device); ``retile`` then brings
each one to the target's form in the target's shardings: codes re-encoded
in the target's tiles, codes decoded into a float target, float encoded in
the target's tiles. Where the forms agree nothing changes: those leaves are
read as they are, bit for bit.

An nnx ``Variable`` holds one array: a float moment of an nnx optimizer's
state (``nnx_checkpoint_state``) is one, where a quantized one is a
``QuantizedArray``. Both are taken whole, so a Variable target reads the
codes saved at its node, and a quantized target the float of a Variable
saved at its node; the float comes back in a Variable like the target's.

What the codes mean (width, code family, sign) is not in their shapes:
``code_notes`` describes it for the saved layout, so a restore into codes
of another meaning is refused as a layout difference, never misread, and
saved codes restored into float are decoded as what they were written as.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
from jax.sharding import SingleDeviceSharding

import shardopt
from checkpoints import layout
from shardopt._src.quantization import quantized_array

__all__ = ["code_notes", "retile", "saved_tiles"]


def _is_quantized(x) -> bool:
  return isinstance(x, shardopt.QuantizedArray)


def _is_variable(x) -> bool:
  return isinstance(x, nnx.Variable)


def _is_node(x) -> bool:
  """A node re-tiled whole: quantized codes and scales, or a Variable's one array."""
  return _is_quantized(x) or _is_variable(x)


def _held_name(name: str, variable) -> str | None:
  """The name of ``variable``'s array (``variable`` at node ``name``), as
  ``layout.named_leaves`` names it; None where it holds other than one array."""
  held = jax.tree_util.tree_flatten_with_path(variable)[0]
  return f"{name}.{layout.leaf_name(held[0][0])}" if len(held) == 1 else None


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


def _stand_in(shape, dtype, like) -> jax.ShapeDtypeStruct:
  """A leaf of ``shape`` and ``dtype``, in ``like``'s spec where it divides
  (else whole on every device), in device memory: ``retile`` computes on it
  there and writes the result to the memory ``like`` lives in
  (host-offloaded state: ``state_memory_kind``). A target on one device
  reads it whole there; one without a sharding keeps none (the read then
  says what to pass, as for any leaf)."""
  shape = tuple(shape)
  sharding = getattr(like, "sharding", None)
  if isinstance(sharding, NamedSharding):
    spec = sharding.spec if _divides(shape, sharding) else PartitionSpec()
    sharding = NamedSharding(sharding.mesh, spec)
  elif isinstance(sharding, SingleDeviceSharding):
    sharding = SingleDeviceSharding(next(iter(sharding.device_set)))
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def code_notes(tree: Any, prefix: str = "") -> dict[str, dict]:
  """``{name of each quantized leaf's codes: {"quantized": its code}}``
  (e.g. ``"8-bit companded signed"``), the names as ``layout.named_leaves``
  gives them (after ``prefix``, where given)."""
  nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_quantized)[0]
  return {f"{layout.name_under(prefix, path)}.codes": {"quantized": _meaning(node.bits, node.signed, node.code)}
          for path, node in nodes if _is_quantized(node)}


def _meaning(bits: int, signed: bool, code: str) -> str:
  return f"{bits}-bit {code} {'signed' if signed else 'non-negative'}"


def _code_of(meaning) -> tuple[int, bool, str] | None:
  """``(bits, signed, code)`` that ``_meaning`` writes as ``meaning``; None
  for anything else (a record written before codes said what they mean)."""
  words = meaning.split(" ") if isinstance(meaning, str) else []
  if len(words) != 3 or not words[0].removesuffix("-bit").isdigit():
    return None
  form = (int(words[0].removesuffix("-bit")), words[2] == "signed", words[1])
  return form if _meaning(*form) == meaning else None


def saved_tiles(target: Any, saved: dict[str, dict], prefix: str = "") -> tuple[Any, list[str]]:
  """``(read_target, names)``: ``target`` with each leaf saved in another
  form (quantized in other tiles, quantized where the target is float, float
  where it is quantized) replaced by a stand-in of the saved form, and the
  names of those leaves (after ``prefix``: a target restored as the subtree
  saved under it)."""
  nodes, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=_is_node)
  changed, out = [], []
  for path, node in nodes:
    name = layout.name_under(prefix, path)
    read = _saved_form(name, node, saved)
    if read is not None:
      changed.append(name)
    out.append(node if read is None else read)
  return jax.tree_util.tree_unflatten(treedef, out), changed


def _saved_form(name: str, node, saved: dict[str, dict]):
  """A stand-in of the form ``name`` was saved in where it is not
  ``node``'s, else None (read as it is, or its difference reported)."""
  codes, scales = saved.get(f"{name}.codes"), saved.get(f"{name}.scales")
  if _is_quantized(node):
    if codes is not None and scales is not None:
      return _other_tiles(node, codes, scales)
    read = _saved_float(node, saved.get(name))
    return _saved_variable(name, node, saved) if read is None else read
  own = _held_name(name, node) if _is_variable(node) else name
  if own is None or own in saved or codes is None or scales is None:
    return None
  return _saved_codes(node.get_value() if _is_variable(node) else node, codes, scales)


def _other_tiles(node, codes: dict, scales: dict):
  """``node``'s codes and scales in their saved shapes, where only they
  differ: codes recorded with another meaning (bits, sign, code) are left
  for the restore to report, in the target's own shapes."""
  same_shapes = (tuple(codes["shape"]), tuple(scales["shape"])) == (node.codes.shape, node.scales.shape)
  meaning = codes.get("quantized")
  if same_shapes or (meaning is not None and meaning != _meaning(node.bits, node.signed, node.code)):
    return None
  return shardopt.QuantizedArray(
      _stand_in(codes["shape"], node.codes.dtype, node.codes),
      _stand_in(scales["shape"], node.scales.dtype, node.scales),
      node.shape, node.bits, node.signed, node.code)


def _saved_float(node, spec: dict | None):
  """A float leaf of ``node``'s shape (its difference from the saved one
  reported as any leaf's) where ``spec`` is a saved float array."""
  if spec is None or spec["key_impl"] is not None or spec["dtype"].startswith("python:"):
    return None
  dtype = jnp.dtype(spec["dtype"])
  if not jnp.issubdtype(dtype, jnp.floating):
    return None
  return _stand_in(node.shape, dtype, node.codes)


def _saved_variable(name: str, node, saved: dict[str, dict]):
  """A Variable holding a float leaf of ``node``'s shape where ``name`` was
  saved as a Variable holding a float array, else None."""
  read = nnx.Variable(_stand_in(node.shape, jnp.float32, node.codes))
  value = _saved_float(node, saved.get(_held_name(name, read)))
  return None if value is None else read.replace(value)


def _saved_codes(node, codes: dict, scales: dict):
  """The saved codes of a leaf of ``node``'s shape, as written (their
  recorded code), where they are the codes of such a leaf."""
  form = _code_of(codes.get("quantized"))
  if form is None or not hasattr(node, "shape"):
    return None
  read = shardopt.QuantizedArray(
      _stand_in(codes["shape"], jnp.dtype(codes["dtype"]), node),
      _stand_in(scales["shape"], jnp.dtype(scales["dtype"]), node),
      tuple(node.shape), *form)
  return read if _encodes(read) else None


def _encodes(q) -> bool:
  """Whether ``q``'s codes and scales have the shapes that encoding a leaf
  of ``q.shape`` in blocks of ``q.tile`` gives."""
  shape, blocks = q.shape, q.scales.shape
  if len(blocks) != len(shape) or any(m == 0 or n % m for n, m in zip(shape, blocks)):
    return False
  want = jax.eval_shape(lambda x: quantized_array.requantize(x, q),
                        jax.ShapeDtypeStruct(shape, jnp.float32))
  return (want.codes.shape, want.scales.shape) == (q.codes.shape, q.scales.shape)


def retile(state: Any, target: Any) -> Any:
  """``state`` (read with ``saved_tiles``' stand-ins) with every leaf saved
  in another form in ``target``'s form (tiles, or float) and shardings."""
  return jax.tree.map(_as_target, state, target, is_leaf=_is_node)


def _as_target(read, like):
  """``read`` in ``like``'s form and shardings: re-tiled, decoded into
  ``like``'s dtype, or encoded in ``like``'s tiles; itself where it has it.
  A Variable's array is brought to the form, and a Variable ``like`` holds it."""
  if _is_variable(like) and not _is_variable(read):
    return like.replace(_as_target(read, like.get_value()))
  if _is_variable(read) and not _is_variable(like):
    return _as_target(read.get_value(), like)
  if _is_quantized(read) and _is_quantized(like):
    if (read.codes.shape, read.scales.shape) == (like.codes.shape, like.scales.shape):
      return read
    convert = lambda q: shardopt.retile_quantized(q, like)
  elif _is_quantized(like):
    convert = lambda x: quantized_array.requantize(x, like)
  elif _is_quantized(read):
    convert = lambda q: q.decode(like.dtype)
  else:
    return read
  return jax.jit(convert, out_shardings=_shardings(like))(read)


def _shardings(like):
  if not _is_quantized(like):
    return like.sharding
  return shardopt.QuantizedArray(like.codes.sharding, like.scales.sharding, like.shape,
                                 like.bits, like.signed, like.code)
