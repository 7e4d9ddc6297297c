"""NamedShardings from specs, and sharded abstract params (no memory allocated)."""

from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding

from partitioning.rules import Rules, match_partition_rules
from partitioning.specs import PartitionError, is_spec, leaf_dtype, spec_axes
from partitioning.validation import validate_specs

__all__ = ["abstract_params", "named_shardings", "sharded_abstract_params"]


def named_shardings(mesh: Mesh | AbstractMesh, specs: Any) -> Any:
  """The tree of ``NamedSharding(mesh, spec)`` for a tree of PartitionSpecs.

  Raises PartitionError naming the path of a leaf that is not a
  PartitionSpec (a spec written as a tuple is a tree of its entries) or of
  a spec naming an axis the mesh lacks."""

  def one(path, spec):
    where = jax.tree_util.keystr(path)
    if not is_spec(spec):
      raise PartitionError(
          f"specs{where} is {spec!r}, not a PartitionSpec (a spec written as a tuple is read"
          " as a tree of its entries): write PartitionSpec(...), or use match_partition_rules.")
    unknown = [axis for axis in spec_axes(spec) if axis not in mesh.axis_names]
    if unknown:
      raise PartitionError(
          f"specs{where} = {spec} names mesh axes {unknown}, which the mesh (axes"
          f" {tuple(mesh.axis_names)}) lacks: fix the spec, or build the mesh with them.")
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, specs, is_leaf=is_spec)


def abstract_params(params: Any, shardings: Any) -> Any:
  """``jax.ShapeDtypeStruct(shape, dtype, sharding=...)`` for each param.

  ``params`` holds arrays or ShapeDtypeStructs; on an AbstractMesh this
  describes a layout of any size without devices (for ``jax.eval_shape``,
  memory plans, or as an Orbax restore target).
  """
  try:
    return jax.tree.map(
        lambda p, s: jax.ShapeDtypeStruct(np.shape(p), leaf_dtype(p), sharding=s),
        params,
        shardings,
    )
  except ValueError as e:
    raise PartitionError(
        f"The shardings tree does not match the params tree: {e}"
    ) from None


def sharded_abstract_params(rules: Rules, params: Any, mesh: Mesh | AbstractMesh) -> Any:
  """Rules -> validated specs -> sharded ShapeDtypeStructs, in one call."""
  specs = match_partition_rules(rules, params)
  validate_specs(params, specs, mesh)
  return abstract_params(params, named_shardings(mesh, specs))
