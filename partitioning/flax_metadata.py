"""PartitionSpecs from Flax partitioning metadata, without importing Flax.

Flax linen boxes annotated params: ``nn.with_partitioning`` gives an
``nn.Partitioned`` whose ``names`` are mesh axes; ``nn.with_logical_partitioning``
gives an ``nn.LogicallyPartitioned`` whose ``names`` are logical axes
('embed', 'mlp', ...) mapped to mesh axes by logical axis rules such as
``[('batch', 'data'), ('embed', None), ('mlp', 'model')]``. A box is recognised
by its attributes (``value``, ``names``, ``unbox``); a logical one also has
``rules``.

Flax NNX keeps the annotation in each ``nnx.Variable``'s metadata
(``nnx.with_partitioning(init, names)`` sets ``out_sharding``, optionally with
``sharding_rules``), recognised by ``get_metadata`` and ``get_value``. As in
``nnx.get_partition_spec``, a name that the rules (the variable's own and
``logical_rules``) map is replaced by its mesh axes, any other name is a mesh
axis itself.
"""

from typing import Any, Sequence

import jax
from jax.sharding import PartitionSpec

from partitioning.rules import Rules, match_partition_rules
from partitioning.specs import PartitionError, entry_axes, is_nnx_variable, param_path

__all__ = ["LogicalRules", "is_boxed", "logical_to_spec", "specs_from_flax_metadata"]

LogicalRules = Sequence[tuple[str, str | tuple[str, ...] | None]]

_UNASSIGNED = object()


def is_boxed(x: Any) -> bool:
  """A Flax partitioning box (``nn.Partitioned`` and subclasses); never an
  ``nnx.Variable`` (whose ``.value`` is deprecated: not even looked up)."""
  return not is_nnx_variable(x) and all(hasattr(x, a) for a in ("names", "unbox", "value"))


def _is_logical(box: Any) -> bool:
  return hasattr(box, "rules")


def logical_to_spec(names: Sequence[str | None], rules: LogicalRules) -> PartitionSpec:
  """Maps logical dimension names to a PartitionSpec, the way Flax does.

  Rules are tried in order; a rule ``(logical, mesh_axes)`` shards the
  dimension named ``logical`` over ``mesh_axes`` if that dimension is not yet
  assigned and none of ``mesh_axes`` is used by another dimension. Names no
  rule assigns stay unsharded.
  """
  named = [n for n in names if isinstance(n, str)]
  repeated = sorted({n for n in named if named.count(n) > 1})
  if repeated:
    raise PartitionError(f"Logical names {tuple(names)} repeat {repeated}: each dimension needs its own name.")
  result = [_UNASSIGNED if isinstance(n, str) else n for n in names]
  for logical, mesh_axes in rules:
    if logical not in names:
      continue
    pos = list(names).index(logical)
    taken = {a for entry in result if entry is not _UNASSIGNED for a in entry_axes(entry)}
    if result[pos] is _UNASSIGNED and not taken & set(entry_axes(mesh_axes)):
      result[pos] = mesh_axes
  return PartitionSpec(*(None if e is _UNASSIGNED else e for e in result))


def _box_spec(path: str, box: Any, logical_rules: LogicalRules | None) -> PartitionSpec:
  if not _is_logical(box):
    return PartitionSpec(*box.names)
  rules = box.rules if box.rules is not None else logical_rules
  if rules is None:
    raise PartitionError(
        f"Param {path!r} has logical axis names {tuple(box.names)} but no logical"
        " axis rules: pass logical_rules=[('embed', 'fsdp'), ('mlp', 'model'), ...]."
    )
  try:
    return logical_to_spec(box.names, rules)
  except PartitionError as e:
    raise PartitionError(f"Param {path!r}: {e}") from None


def _variable_spec(path: str, variable: Any, logical_rules: LogicalRules | None) -> PartitionSpec | None:
  """An NNX variable's spec from its ``out_sharding``; None where it has none."""
  metadata = variable.get_metadata()
  names = metadata.get("out_sharding")
  if not names:
    return None
  names = getattr(names, "spec", names)  # a NamedSharding given as the annotation
  rules = dict(logical_rules or ())
  for logical, mesh_axes in metadata.get("sharding_rules") or ():
    if rules.get(logical, mesh_axes) != mesh_axes:
      raise PartitionError(
          f"Param {path!r}: its sharding_rules map {logical!r} to {mesh_axes!r}, logical_rules to "
          f"{rules[logical]!r}; give one mapping per logical name.")
    rules[logical] = mesh_axes
  return PartitionSpec(*(rules[n] if isinstance(n, str) and n in rules else n for n in names))


def _unboxed_and_spec(path: str, leaf: Any, logical_rules: LogicalRules | None) -> tuple[Any, Any]:
  """A leaf's value and its spec from its metadata (None: it has none)."""
  if is_boxed(leaf):
    return leaf.value, _box_spec(path, leaf, logical_rules)
  if is_nnx_variable(leaf):
    return leaf.get_value(), _variable_spec(path, leaf, logical_rules)
  return leaf, None


def specs_from_flax_metadata(
    params: Any,
    logical_rules: LogicalRules | None = None,
    fallback_rules: Rules | None = None,
) -> tuple[Any, Any]:
  """Unboxes Flax params and reads their partitioning: ``(params, specs)``.

  ``params``: linen variables (``nn.Partitioned`` boxes) or an NNX state
  (``nnx.state(model, nnx.Param)``, abstract from ``nnx.eval_shape`` or not);
  both results keep its containers, each box or ``Variable`` replaced by its
  value and by its spec. Boxed leaves get their spec from their names (through
  ``logical_rules`` for logically partitioned ones, unless the box carries its
  own rules). Leaves without metadata are partitioned by ``fallback_rules`` if
  given, else replicated (``P()``), as Flax does.
  """
  is_leaf = lambda x: is_boxed(x) or is_nnx_variable(x)
  flat, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_leaf)
  pairs = [_unboxed_and_spec(param_path(kp), leaf, logical_rules) for kp, leaf in flat]
  values, specs = [value for value, _ in pairs], [spec for _, spec in pairs]
  unboxed = jax.tree.unflatten(treedef, values)
  plain = [i for i, s in enumerate(specs) if s is None]
  if plain and fallback_rules is not None:
    plain_tree = {param_path(flat[i][0]): values[i] for i in plain}
    plain_specs = match_partition_rules(fallback_rules, plain_tree)
    for i in plain:
      specs[i] = plain_specs[param_path(flat[i][0])]
  specs = [PartitionSpec() if s is None else s for s in specs]
  return unboxed, jax.tree.unflatten(treedef, specs)
