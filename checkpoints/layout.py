"""The leaf-path form of a training state, and the way back to the caller's types.

A state is written as a flat dict ``{leaf name: array}`` (names are the
dotted key paths, e.g. ``opt_state.0.mu.dense.kernel``) next to a JSON layout
``{leaf name: {shape, dtype, key_impl}}`` (a quantized leaf's codes also
say their code: ``quantized``). Restoring never trusts the saved
tree's container types: the arrays are read by name and put back into the
*target's* treedef, so ``TrainState``, optimizer-state NamedTuples,
``EmptyState``, ``None`` leaves and nnx ``State``/``Variable`` nodes come back
as the caller built them. Typed PRNG keys are stored as their raw key data and
re-wrapped with the saved implementation; raw ``uint32`` keys are plain arrays.
An array with no elements (a zero-length dimension, e.g. GaLore's projector of
a param it does not project) has no data to write (Orbax refuses it): the
layout alone records it, and a restore makes it again (``empty_value``).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from checkpoints.errors import StructureMismatchError

__all__ = [
    "check_same", "describe", "differences", "empty_value", "is_empty", "leaf_name", "name_under", "named_leaves",
    "read_args", "rebuild", "to_saveable",
]

_PY_SCALARS = (bool, int, float)


def _escape(part: str) -> str:
  return part.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")


def _entry(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return _escape(str(getattr(key, attr)))
  return _escape(str(key))


def leaf_name(path) -> str:
  """Dotted name of a key path; '.', '/' and '%' inside a key are escaped."""
  return ".".join(_entry(k) for k in path) or "<root>"


def name_under(prefix: str, path) -> str:
  """The whole state's name of the node at ``path`` of a subtree saved under
  ``prefix`` (``prefix`` itself for the subtree's root; ``leaf_name(path)``
  without a prefix)."""
  if not prefix:
    return leaf_name(path)
  return f"{prefix}.{leaf_name(path)}" if path else prefix


def named_leaves(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
  """``[(leaf name, leaf)]`` in the tree's flatten order (names after
  ``prefix``: ``name_under``); names are unique."""
  pairs = [(name_under(prefix, p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]
  seen = set()
  for name, _ in pairs:
    if name in seen:
      raise ValueError(f"Two leaves of the state share the checkpoint name {name!r}; rename one of the keys.")
    seen.add(name)
  return pairs


def _is_key(leaf) -> bool:
  return hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _spec(name: str, leaf) -> dict:
  if isinstance(leaf, _PY_SCALARS):
    return {"shape": [], "dtype": f"python:{type(leaf).__name__}", "key_impl": None}
  if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
    raise TypeError(
        f"State leaf {name!r} is a {type(leaf).__name__}; checkpoints hold arrays, ShapeDtypeStructs and "
        "Python scalars only. Make it static (a pytree field with pytree_node=False) or an array.")
  key_impl = leaf.dtype._impl.name if _is_key(leaf) else None  # pylint: disable=protected-access
  return {"shape": list(leaf.shape), "dtype": str(leaf.dtype), "key_impl": key_impl}


def describe(pairs: list[tuple[str, Any]], notes: dict[str, dict] | None = None) -> dict[str, dict]:
  """``{leaf name: {"shape", "dtype", "key_impl"}}`` of ``named_leaves`` pairs: the JSON layout;
  ``notes`` adds fields to named leaves (``retile.code_notes``: what quantized codes mean)."""
  notes = notes or {}
  return {name: {**_spec(name, leaf), **notes.get(name, {})} for name, leaf in pairs}


def _host_local(leaf) -> bool:
  """An array on this process's devices only (e.g. a key made outside jit) in a multi-process job."""
  return jax.process_count() > 1 and isinstance(leaf, jax.Array) and leaf.is_fully_addressable


def to_saveable(tree: Any) -> dict[str, Any]:
  """``{leaf name: array}`` as written: keys as raw key data, scalars as numpy.

  With several processes, host-local arrays (the same value on every process,
  like a step counter or a key built outside jit) are written as numpy.
  """
  out = {}
  for name, leaf in named_leaves(tree):
    if is_empty(leaf):
      continue
    if _is_key(leaf):
      leaf = jax.random.key_data(leaf)
    if isinstance(leaf, _PY_SCALARS) or _host_local(leaf):
      leaf = np.asarray(leaf)
    out[name] = leaf
  return out


def _compatible(saved: dict, target: dict) -> bool:
  """Whether a leaf saved as ``saved`` restores into ``target``: the same
  layout; a Python scalar from the same Python type or a 0-d array of its
  kind (one saved by another process count). A record written before
  quantized codes were described (no ``quantized`` field) matches on shapes
  alone."""
  if target["dtype"].startswith("python:"):
    kind = {"python:bool": "b", "python:int": "iu", "python:float": "f"}[target["dtype"]]
    same_kind = (saved["dtype"] == target["dtype"] if saved["dtype"].startswith("python:")
                 else np.dtype(saved["dtype"]).kind in kind)
    return saved["shape"] == [] and saved["key_impl"] is None and same_kind
  if "quantized" not in saved:
    target = {k: v for k, v in target.items() if k != "quantized"}
  return saved == target


def differences(saved: dict[str, dict], target: dict[str, dict]) -> list[tuple[str, str]]:
  """``[(path, what differs)]`` between a saved layout and a target layout."""
  out = [(n, "in the target, not in the checkpoint") for n in sorted(target.keys() - saved.keys())]
  out += [(n, "in the checkpoint, not in the target") for n in sorted(saved.keys() - target.keys())]
  for n in sorted(saved.keys() & target.keys()):
    if not _compatible(saved[n], target[n]):
      out.append((n, f"saved {_fmt(saved[n])} vs target {_fmt(target[n])}"))
  return out


def _fmt(spec: dict) -> str:
  impl = f" ({spec['key_impl']} key)" if spec["key_impl"] else ""
  codes = f" ({spec['quantized']} codes)" if spec.get("quantized") else ""
  return f"{spec['dtype']}{tuple(spec['shape'])}{impl}{codes}"


def check_same(saved: dict[str, dict], target: dict[str, dict], what: str, hint=None,
               more: list[tuple[str, str]] = ()) -> None:
  """Raises StructureMismatchError listing every differing path, and ``more``
  (``[(path, what differs)]`` found otherwise: ``state_classes.differences``).

  ``hint(paths)`` may return advice appended to the message.
  """
  diffs = differences(saved, target) + list(more)
  if diffs:
    advice = hint([n for n, _ in diffs]) if hint else ""
    raise StructureMismatchError(
        f"{what}: the checkpoint's tree differs from the restore target at {len(diffs)} path(s):\n"
        + "\n".join(f"  {n}: {d}" for n, d in diffs) + advice)


def _key_data_sharding(name: str, sharding, extra_dims: int, ndim: int):
  if isinstance(sharding, NamedSharding):
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec) + extra_dims)
    return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)
  if isinstance(sharding, SingleDeviceSharding) or sharding.is_fully_replicated:
    return sharding
  raise TypeError(f"Restore target {name!r}: a PRNG key needs a NamedSharding or a single-device sharding.")


def _read_arg(name: str, leaf):
  """(item, restore arg) telling orbax how to read one leaf for this target."""
  if isinstance(leaf, _PY_SCALARS) or isinstance(leaf, (np.ndarray, np.generic)):
    return np.zeros((), np.asarray(leaf).dtype), ocp.RestoreArgs(restore_type=np.ndarray)
  sharding = getattr(leaf, "sharding", None)
  if sharding is None:
    raise ValueError(
        f"Restore target {name!r} has no sharding: pass a jax.ShapeDtypeStruct(shape, dtype, sharding=...) "
        "built for the current mesh (or a jax.Array); opt.init.eval_shape(params) gives a sharded "
        "optimizer's state so (jax.eval_shape drops the shardings).")
  shape, dtype = leaf.shape, leaf.dtype
  if _is_key(leaf):
    data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(shape, dtype))
    sharding = _key_data_sharding(name, sharding, len(data.shape) - len(shape), len(shape))
    shape, dtype = data.shape, data.dtype
  item = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  return item, ocp.ArrayRestoreArgs(sharding=sharding, global_shape=shape, dtype=dtype)


def is_empty(leaf) -> bool:
  """Whether ``leaf`` is an array (or its ShapeDtypeStruct) with no elements."""
  return not isinstance(leaf, _PY_SCALARS) and 0 in tuple(getattr(leaf, "shape", ()))


def empty_value(name: str, leaf):
  """The value a restore reads for the empty leaf ``leaf`` of the target (as
  ``read_args`` would have it read: key data for a PRNG key), laid out in
  its sharding."""
  if isinstance(leaf, (np.ndarray, np.generic)):
    return np.zeros(leaf.shape, leaf.dtype)
  item, _ = _read_arg(name, leaf)
  return jax.device_put(np.zeros(item.shape, item.dtype), item.sharding)


def read_args(pairs: list[tuple[str, Any]]) -> tuple[dict, dict]:
  """Orbax ``(item, restore_args)`` flat dicts for ``[(name, target leaf)]``."""
  item, args = {}, {}
  for name, leaf in pairs:
    item[name], args[name] = _read_arg(name, leaf)
  return item, args


def _put_back(leaf, value, saved_spec: dict):
  """``value`` read for the target ``leaf``, as the leaf's own type: a Python or NumPy scalar,
  a NumPy array, or a jax array, uncommitted where the leaf is (``jnp.zeros`` made by
  ``tx.init``: a committed one could not meet params on a mesh in one jit)."""
  if isinstance(leaf, _PY_SCALARS):
    return type(leaf)(np.asarray(value).item())
  if isinstance(leaf, np.generic):
    return np.asarray(value, dtype=leaf.dtype)[()]
  if isinstance(leaf, np.ndarray):
    return np.asarray(value, dtype=leaf.dtype)
  if isinstance(leaf, jax.Array) and not leaf.committed:
    value = jnp.asarray(np.asarray(value))
  if _is_key(leaf):
    return jax.random.wrap_key_data(value, impl=saved_spec["key_impl"])
  return value


def rebuild(target: Any, pairs: list[tuple[str, Any]], values: dict[str, Any], saved: dict[str, dict]) -> Any:
  """The target's tree (its own types) holding ``values`` read by leaf name.

  ``pairs`` are the target's ``(name, leaf)`` in flatten order; leaves whose
  name is not in ``values`` keep the target's own value.
  """
  leaves = [_put_back(x, values[n], saved[n]) if n in values else x for n, x in pairs]
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target), leaves)
