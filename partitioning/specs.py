"""The error type of partitioning/ and small helpers on PartitionSpecs and paths.

A PartitionSpec has one entry per array dimension: ``None`` (not sharded), a
mesh axis name, or a tuple of mesh axis names (sharded over their product).
Parameter paths are the '/'-joined keys of a pytree leaf, e.g.
``'decoder/layers_0/mlp/wi/kernel'``.
"""

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec

__all__ = [
    "PartitionError",
    "as_spec",
    "entry_axes",
    "is_spec",
    "leaf_dtype",
    "leaves_with_paths",
    "param_path",
    "spec_axes",
    "zip_specs",
]


class PartitionError(ValueError):
  """A mesh, rule or spec that cannot partition the given params."""


def is_spec(x: Any) -> bool:
  return isinstance(x, PartitionSpec)


def as_spec(x: PartitionSpec | Sequence | None) -> PartitionSpec:
  """Turns ``None``, a tuple or a list of entries into a PartitionSpec."""
  if x is None:
    return PartitionSpec()
  if isinstance(x, PartitionSpec):
    return x
  if isinstance(x, (tuple, list)):
    return PartitionSpec(*x)
  raise PartitionError(
      f"Expected a PartitionSpec, a tuple of mesh axis names or None; got"
      f" {x!r} of type {type(x).__name__}."
  )


def leaf_dtype(leaf: Any) -> Any:
  """A param's dtype: its own (a typed PRNG key's included), or for a Python
  scalar the one jax gives it (``jnp.asarray(1.0)``: float32 unless x64 is
  on)."""
  if hasattr(leaf, "dtype"):
    return leaf.dtype
  return np.dtype(jax.dtypes.canonicalize_dtype(np.result_type(leaf)))


def entry_axes(entry: Any) -> tuple[str, ...]:
  """The mesh axes one spec entry shards a dimension over."""
  if entry is None or entry is PartitionSpec.UNCONSTRAINED:
    return ()
  if isinstance(entry, (tuple, list)):
    return tuple(entry)
  return (entry,)


def spec_axes(spec: PartitionSpec) -> tuple[str, ...]:
  """All mesh axes a spec uses, in order, repeats kept."""
  return tuple(axis for entry in spec for axis in entry_axes(entry))


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def param_path(keypath: Sequence[Any]) -> str:
  """'/'-joined names of a jax key path: ``('a', 0, 'kernel') -> 'a/0/kernel'``."""
  return "/".join(_key_name(k) for k in keypath)


def is_nnx_variable(x: Any) -> bool:
  """A Flax NNX ``Variable`` (``nnx.Param`` and the others), recognised by its methods."""
  return callable(getattr(x, "get_metadata", None)) and callable(getattr(x, "get_value", None))


def leaves_with_paths(tree: Any, is_leaf=None) -> list[tuple[str, Any]]:
  """``(path, leaf)`` pairs of a pytree, in flattening order.

  A Flax NNX ``Variable`` is named by where it sits (``'l1/kernel'``, as in
  ``nnx.to_pure_dict(nnx.state(model))`` and linen's params), not by its own
  ``value`` field.
  """
  own_leaf = is_leaf or (lambda x: False)
  variable = lambda x: is_nnx_variable(x) and not own_leaf(x)
  pairs = []
  for keypath, node in jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: variable(x) or own_leaf(x))[0]:
    if not variable(node):
      pairs.append((param_path(keypath), node))
      continue
    inner = jax.tree_util.tree_flatten_with_path(node, is_leaf=is_leaf)[0]
    pairs += [(param_path(keypath + key[1:]), leaf) for key, leaf in inner]  # key[0]: the field
  return pairs


def zip_specs(params: Any, specs: Any) -> list[tuple[str, Any, Any]]:
  """``(path, param, spec)`` triples; raises if the two trees do not match.

  A ``None`` in the params (a layer without a bias) is no param: it takes a
  ``None`` spec, as ``match_partition_rules`` gives it, and has no triple.
  """
  param_leaves = leaves_with_paths(params)
  absent = {p for p, x in leaves_with_paths(params, is_leaf=lambda x: x is None) if x is None}
  given = leaves_with_paths(specs, is_leaf=lambda x: x is None or is_spec(x))
  spec_leaves = [(p, s) for p, s in given if s is not None or p not in absent]
  param_paths = [p for p, _ in param_leaves]
  spec_paths = [p for p, _ in spec_leaves]
  if param_paths != spec_paths:
    missing = sorted(set(param_paths) - set(spec_paths))
    extra = sorted(set(spec_paths) - set(param_paths))
    raise PartitionError(
        "The specs tree does not match the params tree (build it with"
        " match_partition_rules(rules, params)):"
        + (f"\n  params without a spec: {missing}" if missing else "")
        + (f"\n  specs without a param: {extra}" if extra else "")
        + ("" if missing or extra else "\n  same paths, different order or nesting")
    )
  return [(p, x, s) for (p, x), (_, s) in zip(param_leaves, spec_leaves)]
