"""Checks a tree of PartitionSpecs against the params and a mesh, all problems at once.

Finds, for every param: mesh axes the mesh does not have, a mesh axis used
twice in one spec, a spec longer than the array's rank, and a dimension whose
size the product of its mesh axes' sizes does not divide. Raises one
PartitionError with one line per problem, each naming the param and its spec.
"""

import math
from typing import Any

import numpy as np
from jax.sharding import AbstractMesh, Mesh

from partitioning.specs import PartitionError, entry_axes, is_spec, spec_axes, zip_specs

__all__ = ["spec_problems", "validate_specs"]


def _problems(path: str, shape: tuple[int, ...], spec: Any, mesh_shape: dict[str, int]) -> list[str]:
  where = f"{path} {tuple(shape)} with {spec}"
  if not is_spec(spec):
    return [f"{where}: not a PartitionSpec; use P(...) (P() replicates)."]
  out = []
  axes = spec_axes(spec)
  unknown = sorted({a for a in axes if a not in mesh_shape})
  if unknown:
    out.append(f"{where}: unknown mesh axes {unknown}; the mesh has {list(mesh_shape)}.")
  repeated = sorted({a for a in axes if axes.count(a) > 1})
  if repeated:
    out.append(f"{where}: mesh axes {repeated} used more than once; an axis can shard one dimension only.")
  if len(spec) > len(shape):
    out.append(
        f"{where}: spec has {len(spec)} entries but the array has rank {len(shape)};"
        " drop the extra entries."
    )
  for dim, (size, entry) in enumerate(zip(shape, spec)):
    known = [a for a in entry_axes(entry) if a in mesh_shape]
    ways = math.prod(mesh_shape[a] for a in known)
    if size % ways:
      out.append(
          f"{where}: dim {dim} of size {size} is not divisible by {ways}, the size of"
          f" mesh axes {tuple(known)}; shard another dim or pad it to a multiple of {ways}."
      )
  return out


def spec_problems(params: Any, specs: Any, mesh: Mesh | AbstractMesh) -> list[str]:
  """Every problem found, one line each; empty when the specs are sound."""
  mesh_shape = dict(mesh.shape)
  return [
      line
      for path, param, spec in zip_specs(params, specs)
      for line in _problems(path, np.shape(param), spec, mesh_shape)
  ]


def validate_specs(params: Any, specs: Any, mesh: Mesh | AbstractMesh) -> None:
  """Raises PartitionError listing every problem of ``specs`` on ``mesh``."""
  problems = spec_problems(params, specs, mesh)
  if problems:
    mesh_desc = ", ".join(f"{k}={v}" for k, v in dict(mesh.shape).items())
    raise PartitionError(
        f"{len(problems)} partitioning problem(s) on mesh ({mesh_desc}):\n"
        + "\n".join(f"  {line}" for line in problems)
    )
