"""Putting trees in a layout inside the sharded step, on Auto or Explicit axes.

``in_layout`` lays a tree out in given shardings inside a jitted function:
``reshard`` on Explicit axes (the type changes), a sharding constraint on
Auto axes (a hint the partitioner honours). ``typed`` calls a function with
its argument typed in given shardings on any mesh: on Auto axes through
``jax.sharding.explicit_axes``, so that code reading the types (the state's
derivation, ``quantized_state``'s blocks) sees the same layout whatever the
user's mesh is. ``update_in_layout`` is the one place where the sharded
step hands ``tx.update`` its inputs in their update layout. ``under_mesh``
traces a jitted entry point with its mesh's axes in context.
"""

import functools

import jax
from jax.sharding import AxisType

__all__ = ["in_layout", "mesh_of", "typed", "under_mesh", "update_in_layout"]


def mesh_of(shardings):
  """The mesh of the first sharding in a tree of ``NamedSharding``s."""
  return jax.tree.leaves(shardings)[0].mesh


def _auto_axes(mesh) -> tuple[str, ...]:
  return tuple(name for name, kind in zip(mesh.axis_names, mesh.axis_types)
               if kind == AxisType.Auto)


def in_layout(tree, shardings):
  """``tree`` laid out in ``shardings`` (a matching tree) inside ``jit``."""
  if AxisType.Explicit in mesh_of(shardings).axis_types:
    return jax.sharding.reshard(tree, shardings)
  return jax.lax.with_sharding_constraint(tree, shardings)


def under_mesh(fn, mesh):
  """``fn`` traced with ``mesh``'s axes in context
  (``jax.sharding.use_abstract_mesh``): what it traces (a loss, a
  ``value_fn``) may name ``PartitionSpec``s without a mesh context of the
  caller's, whether the jitted function is called eagerly or inside another
  ``jit`` (where ``jax.set_mesh`` is refused)."""

  @functools.wraps(fn)
  def call(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return call


def typed(fn, shardings):
  """``x -> fn(x)`` with ``x`` typed in ``shardings`` (one per leaf of ``x``,
  in its flatten order; any container) while ``fn`` runs, inside ``jit``;
  ``fn``'s results keep the mesh's axis types."""
  mesh = mesh_of(shardings)
  auto = _auto_axes(mesh)

  def call(x):
    shardings_of_x = jax.tree.unflatten(jax.tree.structure(x),
                                        jax.tree.leaves(shardings))
    x = in_layout(x, shardings_of_x)
    if not auto:
      return fn(x)
    specs = jax.tree.map(lambda s: s.spec, shardings_of_x)
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return jax.sharding.explicit_axes(fn, axes=auto, in_sharding=(specs,))(x)

  return call


def _params_like(value, params) -> bool:
  return (params is not None and not callable(value)
          and jax.tree.structure(value) == jax.tree.structure(params))


def update_in_layout(tx, grads, state, params, update_shardings,
                     param_shardings, **extra_args):
  """``tx.update`` with grads and params (and any extra argument shaped
  like them, e.g. a line search's ``grad``) in their update layout, inside
  ``jit``; returns ``(updates, new_state)``, the updates in the params'
  layout. ``params`` may be None (``tx.update`` then gets None)."""
  grads = in_layout(grads, update_shardings)
  moved = None if params is None else in_layout(params, update_shardings)
  extra_args = {k: _extra_in_layout(k, v, params, update_shardings,
                                    param_shardings)
                for k, v in extra_args.items()}
  updates, new_state = tx.update(grads, state, moved, **extra_args)
  return in_layout(updates, param_shardings), new_state


# The extra arguments that are functions of the params (optax's line-search
# protocol: value_fn; Sophia's obj_fn).
_FUNCTIONS_OF_PARAMS = ("value_fn", "obj_fn")


def _extra_in_layout(name, value, params, update_shardings, param_shardings):
  """An extra argument for ``tx.update``: shaped like the params, in the
  update layout; a function of the params, called with them laid back out
  in their own (the user's loss sees the layout it was written for)."""
  if _params_like(value, params):
    return in_layout(value, update_shardings)
  if name in _FUNCTIONS_OF_PARAMS and callable(value):
    @functools.wraps(value)  # its signature, for the keywords it accepts
    def in_params_layout(p, *args, **kwargs):
      if _params_like(p, params):
        p = in_layout(p, param_shardings)
      return value(p, *args, **kwargs)
    return in_params_layout
  return value
