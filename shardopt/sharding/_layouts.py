"""Putting trees in a layout inside the sharded step, on Auto or Explicit axes.

``in_layout`` lays a tree out in given shardings inside a jitted function:
``reshard`` on Explicit axes (the type changes), a sharding constraint on
Auto axes (a hint the partitioner honours), each over its own axes on a
mesh of both kinds. ``typed`` calls a function with
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
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt._src import state_structure
from shardopt._src.tree_math import apply_updates
from shardopt.sharding._liveness import is_concrete_array

__all__ = ["apply_in_layout", "in_layout", "mesh_of", "typed", "under_mesh",
           "update_in_layout"]


def mesh_of(shardings):
  """The mesh of the first sharding in a tree of ``NamedSharding``s."""
  return jax.tree.leaves(shardings)[0].mesh


def _axes_of_type(mesh, axis_type) -> tuple[str, ...]:
  return tuple(name for name, kind in zip(mesh.axis_names, mesh.axis_types)
               if kind == axis_type)


def in_layout(tree, shardings):
  """``tree`` laid out in ``shardings`` (a matching tree) inside ``jit``: a
  ``reshard`` on Explicit axes (the type changes), a sharding constraint on
  Auto axes (a hint the partitioner honours); on a mesh of both kinds, each
  over the axes of its own kind (called eagerly there, ``device_put``: an
  eager constraint would replace the Explicit axes' split)."""
  mesh = mesh_of(shardings)
  explicit = _axes_of_type(mesh, AxisType.Explicit)
  auto = _axes_of_type(mesh, AxisType.Auto)
  if not explicit:
    return jax.lax.with_sharding_constraint(tree, shardings)
  if not auto:
    return jax.sharding.reshard(tree, shardings)
  if all(map(is_concrete_array, jax.tree.leaves(tree))):
    return jax.device_put(tree, shardings)  # called eagerly
  return jax.lax.with_sharding_constraint(
      jax.sharding.reshard(tree, _only(shardings, explicit)),
      _only(shardings, auto))


def _only(shardings, axes):
  """``shardings`` with each spec naming only the mesh axes in ``axes``."""
  return jax.tree.map(
      lambda s: NamedSharding(s.mesh, _spec_on(s.spec, axes)), shardings)


def _spec_on(spec, axes) -> P:
  """``spec`` with each entry keeping only the mesh axes in ``axes``."""
  def keep(entry):
    if entry is None or entry is P.UNCONSTRAINED:
      return entry
    kept = tuple(name for name in ((entry,) if isinstance(entry, str) else entry)
                 if name in axes)
    return kept[0] if len(kept) == 1 else (kept or None)

  return P(*map(keep, spec))


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
  auto = _axes_of_type(mesh, AxisType.Auto)

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
  layout. ``params`` may be None (``tx.update`` then gets None).

  On Explicit mesh axes ``tx.update`` runs with those axes Auto
  (``_on_auto_axes``), as on an Auto mesh: its inputs and outputs keep the
  layouts fixed here and the state's own (matched by path), and XLA's partitioner
  places what it computes in between. A transformation written without
  sharding types (optax's own: a ``vdot`` or a matmul over a split
  dimension, an SVD) then runs on either kind of mesh.
  """
  updates, new_state, _ = _updated(tx, grads, state, params, update_shardings,
                                   param_shardings, **extra_args)
  return in_layout(updates, param_shardings), new_state


def apply_in_layout(tx, grads, state, params, update_shardings,
                    param_shardings, **extra_args):
  """``update_in_layout``'s update applied where it is computed: returns
  ``(new_params, updates, new_state)``, the updates added to the params in
  their update layout and the sum laid out in ``param_shardings`` (with
  ZeRO one all-gather of the new params; gathering the updates first held a
  full-size update beside the params: 1.25x the ZeRO'd Adam state in
  temporaries, more than the step without ZeRO), the updates in the update
  layout. Same values as ``apply_updates(params, updates)``."""
  updates, new_state, moved = _updated(tx, grads, state, params,
                                       update_shardings, param_shardings,
                                       **extra_args)
  return (in_layout(apply_updates(moved, updates), param_shardings), updates,
          new_state)


def _updated(tx, grads, state, params, update_shardings, param_shardings,
             **extra_args):
  """(updates and the params, both in the update layout, and the new state)
  of ``update_in_layout``."""
  mesh = mesh_of(update_shardings)
  grads = in_layout(grads, update_shardings)
  moved = None if params is None else in_layout(params, update_shardings)
  extra_args = {k: _extra_in_layout(k, v, params, update_shardings,
                                    param_shardings)
                for k, v in extra_args.items()}
  arrays = {k: v for k, v in extra_args.items() if not callable(v)}
  functions = {k: v for k, v in extra_args.items() if callable(v)}
  update = _on_auto_axes(
      lambda g, s, p, a: tx.update(g, s, p, **a, **functions), mesh,
      lambda out: (_specs(update_shardings), _specs_by_path(out[1], state)))
  updates, new_state = update(grads, state, moved, arrays)
  return updates, new_state, moved


def _on_auto_axes(fn, mesh, out_specs_of):
  """``fn`` run with ``mesh``'s Explicit axes Auto (as
  ``jax.sharding.auto_axes`` does), its results typed on them again as the
  specs ``out_specs_of(results)`` give (their Explicit axes: on a mesh of
  both kinds the jitted step's output shardings place the rest); ``fn``
  itself where no axis is Explicit."""
  explicit = _axes_of_type(mesh, AxisType.Explicit)
  if not explicit:
    return fn
  auto = mesh.abstract_mesh.update_axis_types(
      {name: AxisType.Auto for name in explicit})

  def call(*args):
    with jax.sharding.use_abstract_mesh(auto):
      args = jax.sharding.reshard(args, jax.tree.map(lambda _: P(), args))
      out = fn(*args)
    specs = jax.tree.map(lambda spec: _spec_on(spec, explicit),
                         out_specs_of(out), is_leaf=lambda x: isinstance(x, P))
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # the caller's may be none
      return jax.sharding.reshard(out, specs)

  return call


def _specs_by_path(new_state, state):
  """The specs of ``state``'s leaves for ``new_state``'s, matched by path
  (``state_structure.path_names``): a holder of the state (flax's
  ``nnx.Optimizer``) may pass it with containers rebuilt as mappings, which
  ``tx.update`` returns in its own structure. A leaf ``state`` lacks:
  replicated."""
  specs = state_structure.leaves_by_path(_specs(state))
  return jax.tree_util.tree_map_with_path(
      lambda path, _: specs.get(state_structure.path_names(path), P()),
      new_state)


def _specs(tree):
  """Each leaf's ``PartitionSpec``: of a ``NamedSharding``, or of the
  sharding in an array's type."""
  return jax.tree.map(
      lambda x: x.spec if isinstance(x, NamedSharding)
      else jax.typeof(x).sharding.spec, tree)


# The extra arguments that are functions of the params (optax's line-search
# protocol: value_fn; Sophia's obj_fn).
_FUNCTIONS_OF_PARAMS = ("value_fn", "obj_fn")


def _extra_in_layout(name, value, params, update_shardings, param_shardings):
  """An extra argument for ``tx.update``: shaped like the params, in the
  update layout; a function of the params, called with them laid back out
  in their own and typed on the mesh's own axes (the user's loss sees the
  layout it was written for, also where ``tx.update`` runs on Auto axes)."""
  if _params_like(value, params):
    return in_layout(value, update_shardings)
  if name in _FUNCTIONS_OF_PARAMS and callable(value):
    explicit = _axes_of_type(mesh_of(param_shardings), AxisType.Explicit)

    @functools.wraps(value)  # its signature, for the keywords it accepts
    def in_params_layout(p, *args, **kwargs):
      if not _params_like(p, params):
        return value(p, *args, **kwargs)
      call = lambda q: value(q, *args, **kwargs)
      if explicit:
        return jax.sharding.explicit_axes(
            call, axes=explicit,
            in_sharding=(_specs(_only(param_shardings, explicit)),))(p)
      return call(in_layout(p, param_shardings))
    return in_params_layout
  return value
