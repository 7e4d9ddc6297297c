"""Tracing with layouts as types: params that carry their sharding.

On a mesh whose axes are Explicit, JAX types every traced array with its
sharding, so code that builds state from the params (``zeros_like``,
reductions, reshapes) sees, and passes on, how each array is split. The
sharding layer traces a transformation's ``init`` this way, on any mesh, to
derive the state's layout; ``quantized_state`` reads the same types to fit
its blocks inside one device's shard (and, run eagerly on arrays placed on a
mesh, their shardings).

``explicit_abstract_mesh`` is the mesh's device-free copy with Explicit
axes; ``eval_shape_typed`` evaluates a function's output shapes on params
typed with given specs on it; ``shard_shape`` is the shape of one device's
piece of an array as its type or its placement lays it out (its global shape
when nothing does: traced on an Auto mesh, no mesh, one device) and
``finest_shard_shape`` the shortest piece of each dimension on any mesh of
as many devices that splits the same dimensions; ``whole`` gathers an array
an operation needs unsplit (an SVD) where Explicit axes split it, and
``laid_out_like`` puts a result back in the layout of the state it replaces.
"""

import math

import jax
from jax.sharding import AbstractMesh
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["eval_shape_typed", "eval_shape_with_shardings",
           "explicit_abstract_mesh", "explicit_sharding", "finest_shard_shape",
           "laid_out_like", "shard_shape", "whole"]


def explicit_abstract_mesh(mesh) -> AbstractMesh:
  """``mesh`` (concrete or abstract) as an ``AbstractMesh``, every axis
  Explicit."""
  return mesh.abstract_mesh.update_axis_types(
      {name: AxisType.Explicit for name in mesh.axis_names})


def eval_shape_typed(fn, params, specs, mesh):
  """``jax.eval_shape(fn, params)`` with each param typed ``specs`` (same
  tree, one ``PartitionSpec`` per param) on ``mesh``'s Explicit copy: the
  outputs are ``ShapeDtypeStruct``s whose ``sharding`` says how ``fn``
  lays them out."""
  explicit = explicit_abstract_mesh(mesh)
  typed = jax.tree.map(
      lambda p, spec: jax.ShapeDtypeStruct(
          p.shape, p.dtype, sharding=NamedSharding(explicit, spec)),
      params, specs)
  with jax.sharding.use_abstract_mesh(explicit):
    return jax.eval_shape(fn, typed)


def eval_shape_with_shardings(fn, *args):
  """``jax.eval_shape(fn, *args)`` whose ``ShapeDtypeStruct``s carry the
  sharding each output's type names (``jax.eval_shape`` leaves it out on a
  mesh with both Explicit and Auto axes: jax 0.10)."""
  jaxpr, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
  return jax.tree.unflatten(jax.tree.structure(shapes), [
      jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                           sharding=_explicit_sharding_of(aval))
      for aval in jaxpr.out_avals])


def _typed_sharding(x) -> NamedSharding | None:
  """The ``NamedSharding`` that lays out ``x`` on a mesh with axes: its type
  where ``x`` is traced, its own sharding where ``x`` is an array (on Auto
  axes too: eager code, ``nnx.Optimizer``'s ``init``); else None."""
  sharding = (x.sharding if _is_array(x) else
              getattr(jax.typeof(x), "sharding", None))
  if not isinstance(sharding, NamedSharding) or not sharding.mesh.axis_names:
    return None
  return sharding


def _is_array(x) -> bool:
  """Whether ``x`` is a concrete ``jax.Array`` (not a tracer)."""
  return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


def shard_shape(x) -> tuple[int, ...]:
  """The shape of the piece of ``x`` one device holds, as typed where ``x``
  is traced or as placed where it is an array on a mesh; ``x``'s global
  shape where neither splits it."""
  sharding = _typed_sharding(x)
  shape = tuple(jax.typeof(x).shape)
  return shape if sharding is None else tuple(sharding.shard_shape(shape))


def finest_shard_shape(x) -> tuple[int, ...]:
  """Per dimension of ``x``, the shortest piece one device can hold on any
  mesh of as many devices whose axes split the same dimensions as ``x``'s
  type (or placement) does: ``length // gcd(length, devices)`` for a split
  dimension (whatever the axes' sizes, an even split ``k`` divides both, so
  this divides the piece of every such mesh, this one included), the whole
  length for one no axis names; ``x``'s global shape where neither its type
  nor its placement splits it. A tile fitted to it is the same on (2, 4),
  (4, 2) and (8, 1)."""
  sharding = _typed_sharding(x)
  shape = tuple(jax.typeof(x).shape)
  if sharding is None:
    return shape
  spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
  return tuple(length // math.gcd(length, sharding.mesh.size)
               if names is not None else length
               for length, names in zip(shape, spec))


def explicit_sharding(x) -> NamedSharding | None:
  """``x``'s sharding where Explicit axes type it (inside a trace on a mesh
  with such axes), else None."""
  return _explicit_sharding_of(jax.typeof(x))


def _explicit_sharding_of(aval) -> NamedSharding | None:
  sharding = getattr(aval, "sharding", None)
  if isinstance(sharding, NamedSharding) and any(
      kind == AxisType.Explicit for kind in sharding.mesh.axis_types):
    return sharding
  return None


def split_along(x, axis: int) -> bool:
  """Whether ``x``'s type splits dimension ``axis`` over mesh axes (Explicit
  axes type it so; on Auto axes and outside a mesh it does not)."""
  spec = getattr(jax.typeof(x).sharding, "spec", None) or ()
  return axis < len(spec) and spec[axis] is not None


def whole(x):
  """``x`` unsplit on every device where its type splits it over Explicit
  axes (operations such as ``jnp.linalg.svd`` refuse split operands there);
  ``x`` itself otherwise (on Auto axes the partitioner gathers as needed)."""
  sharding = explicit_sharding(x)
  if sharding is None or all(entry is None for entry in sharding.spec):
    return x
  return jax.sharding.reshard(x, sharding.update(spec=P()))


def laid_out_like(x, like):
  """``x`` in ``like``'s layout where Explicit axes type ``like`` (e.g. a
  fresh result about to replace the state ``like`` in one branch of a
  ``cond``); ``x`` itself otherwise."""
  sharding = explicit_sharding(like)
  return x if sharding is None else jax.sharding.reshard(x, sharding)
