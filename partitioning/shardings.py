"""NamedShardings from specs, and sharded abstract params (no memory allocated)."""

from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding

from partitioning.rules import Rules, match_partition_rules
from partitioning.specs import PartitionError, is_spec
from partitioning.validation import validate_specs

__all__ = ["abstract_params", "named_shardings", "sharded_abstract_params"]


def named_shardings(mesh: Mesh | AbstractMesh, specs: Any) -> Any:
  """The tree of ``NamedSharding(mesh, spec)`` for a tree of PartitionSpecs."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=is_spec)


def abstract_params(params: Any, shardings: Any) -> Any:
  """``jax.ShapeDtypeStruct(shape, dtype, sharding=...)`` for each param.

  ``params`` holds arrays or ShapeDtypeStructs; on an AbstractMesh this
  describes a layout of any size without devices (for ``jax.eval_shape``,
  memory plans, or as an Orbax restore target).
  """
  try:
    return jax.tree.map(
        lambda p, s: jax.ShapeDtypeStruct(np.shape(p), p.dtype, sharding=s),
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
