"""Optimizer-state shardings derived from the transformation itself.

No table of rules: ``tx.init`` is traced with ``jax.eval_shape`` on abstract
params that carry their layout as types (``shardopt._src.typed_layouts``:
an abstract copy of the mesh whose axes are Explicit). JAX then carries each
param's spec through ``zeros_like`` and through reductions (a reduced
dimension drops its mesh axis), so Adam's moments get their param's spec,
Adafactor's row/column statistics keep the mesh axis of the dimension they
keep, SM3's covers keep their dimension's axis and counters come out
replicated. The specs are then rebuilt on the user's mesh (Auto or Explicit
axes, or an ``AbstractMesh``). Foreign (optax) transformations are handled
the same way. An init that JAX cannot trace on sharded params (e.g.
``p.T @ p`` over a sharded dimension) gets replicated state, with a warning.

ZeRO (``shard_state_over='data'``, ``_zero``): per param, the dimension its
state is split on; the params are typed in that *update layout* (their spec
plus the ZeRO axis) when ``init`` is traced, so the state built from them
comes out split with them, and the sharded step hands ``tx.update`` the
gradients and params in the same layout (``StatePlan.update_shardings``).
The plan (``_plan``) says, leaf by leaf, what was split and why the rest
could not be; the large leaves left out are listed in ``zero_skipped`` and
warned about.

Which state leaf belongs to which param: by the stand-in trace of
``shardopt._src.ownership`` (a structural prefix match only where that
trace cannot run). A derived leaf with its param's shape *mirrors* it. A
leaf less sharded than its param is reported with a
``ReplicatedStateWarning`` (never silently) where that costs memory
(``_under_sharded`` says which leaves and what keeps them split).
"""

import math
import warnings

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt._src.ownership import state_owners
from shardopt._src.quantization import report as _quantized
from shardopt._src.typed_layouts import eval_shape_typed
from shardopt.sharding._boundary import check_param_shardings
from shardopt.sharding._boundary import first_structure_difference
from shardopt.sharding._plan import LeafPlan
from shardopt.sharding._plan import ReplicatedStateWarning
from shardopt.sharding._plan import StatePlan
from shardopt.sharding._specs import device_bytes as _device_bytes
from shardopt.sharding._specs import full_spec as _full_spec
from shardopt.sharding._specs import spec_axes
from shardopt.sharding._under_sharded import lost_parts
from shardopt.sharding._under_sharded import under_sharded_message
from shardopt.sharding._zero import DEFAULT_MIN_SHARD_BYTES
from shardopt.sharding._zero import ParamZero
from shardopt.sharding._zero import leaf_zero
from shardopt.sharding._zero import param_zero

__all__ = ["plan_state_shardings", "state_shardings"]


def state_shardings(tx, params, param_shardings, *, shard_state_over=None,
                    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES):
  """The ``NamedSharding`` of every leaf of ``tx.init(params)``, the params
  laid out in ``param_shardings`` (ZeRO's axis added).

  That state is what ``make_sharded_optimizer``'s ``init``,
  ``sharded_init`` and ``sharding.with_update_layout(tx, ...).init`` build,
  and ``tx.init`` itself where it sees the layout: on arrays placed in
  ``param_shardings`` or traced on Explicit axes (without ZeRO). Traced in
  a plain ``jit`` on Auto axes, ``init`` cannot see it, and 8- and 4-bit
  moments get blocks fitted to the whole array, whose scales these
  shardings may not fit: trace ``with_update_layout(tx, param_shardings)``'s
  ``init`` there (``checkpoints.create_train_state`` does).

  Args:
    tx: any transformation with an ``init`` (shardopt's or optax's).
    params: the params, as arrays or ``jax.ShapeDtypeStruct``.
    param_shardings: a ``NamedSharding`` per param (same tree structure), all
      on one mesh (Auto or Explicit axes, or an ``AbstractMesh``).
    shard_state_over: a mesh axis over which to additionally shard the
      state of every param of at least ``min_shard_bytes`` or with a state
      leaf of at least that, and every other state leaf of that size (ZeRO);
      ``None`` for none.
    min_shard_bytes: whole-param or whole-leaf bytes; ZeRO leaves the state
      of a param below it whose leaves are all below it as it is, and other
      leaves below it too; default 4 KiB.

  Returns:
    A tree of ``NamedSharding`` with the structure of ``tx.init(params)``.

  Warns (``ReplicatedStateWarning``) about state less sharded than its param,
  about leaves of at least ``min_shard_bytes`` that ZeRO could not shard, and
  once about a ``shard_state_over`` axis of size 1 (which splits nothing);
  see ``plan_state_shardings`` for the full report.
  """
  plan = plan_state_shardings(
      tx, params, param_shardings, shard_state_over=shard_state_over,
      min_shard_bytes=min_shard_bytes)
  plan.warn_zero_skipped(stacklevel=2)
  return plan.shardings


def plan_state_shardings(tx, params, param_shardings, *,
                         shard_state_over=None,
                         min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES
                         ) -> StatePlan:
  """Like ``state_shardings``, returning a ``StatePlan`` (shardings + report).

  Warns about state less sharded than its param and about a
  ``shard_state_over`` axis of size 1; the leaves ZeRO left out are in the
  report (``StatePlan.zero_skipped``, ``warn_zero_skipped``)."""
  if min_shard_bytes < 0:
    raise ValueError(f"min_shard_bytes={min_shard_bytes}: expected bytes >= 0"
                     " (0 lets ZeRO shard every non-scalar leaf).")
  mesh = _common_mesh(param_shardings)
  if shard_state_over is not None and not isinstance(shard_state_over, str):
    raise TypeError(
        f"shard_state_over={shard_state_over!r}: expected one mesh axis name"
        f" (a str, one of {tuple(mesh.shape)}); ZeRO over several axes is not"
        " supported.")
  if shard_state_over is not None and shard_state_over not in mesh.shape:
    raise ValueError(
        f"shard_state_over={shard_state_over!r} is not an axis of the mesh "
        f"(axes: {tuple(mesh.shape)}).")
  param_leaves, params_def = jax.tree.flatten(params)
  spec_leaves = _param_specs(params, param_shardings)
  check_param_shardings(params, param_shardings)
  if shard_state_over is not None and mesh.shape[shard_state_over] == 1:
    warnings.warn(
        f"shard_state_over={shard_state_over!r}: mesh axis {shard_state_over!r} has size 1 "
        f"on this mesh ({dict(mesh.shape)}), so ZeRO splits no state leaf (bytes per device "
        f"as without it): drop shard_state_over, or give {shard_state_over!r} more than one "
        "device.", ReplicatedStateWarning, stacklevel=2)
  if shard_state_over is None:
    zeros, owned = [None] * len(param_leaves), None
  else:
    owned = _owned_state(tx, params)
    zeros = [param_zero(p.shape, p.dtype, spec, shard_state_over,
                        mesh.shape[shard_state_over], min_shard_bytes, largest)
             for p, spec, largest in zip(param_leaves, spec_leaves,
                                         _largest_leaf_bytes(*owned, len(param_leaves)))]
  update_specs = [_update_spec(spec, zero, shard_state_over)
                  for spec, zero in zip(spec_leaves, zeros)]
  state, float_fallbacks = _abstract_state(tx, params, update_specs,
                                           params_def, mesh)
  state_leaves, state_def = jax.tree_util.tree_flatten_with_path(state)
  same_tree = owned is not None and jax.tree.structure(owned[0]) == state_def
  owners = owned[1] if same_tree else state_owners(tx.init, params, state)
  param_paths = [jax.tree_util.keystr(p) for p, _ in
                 jax.tree_util.tree_flatten_with_path(params)[0]]
  plans = [
      _plan_leaf(jax.tree_util.keystr(path), leaf,
                 None if owner is None else param_leaves[owner],
                 None if owner is None else zeros[owner],
                 None if owner is None else param_paths[owner],
                 mesh, shard_state_over, min_shard_bytes)
      for (path, leaf), owner in zip(state_leaves, owners)]
  lost = [(pl, owner, lost_parts(pl, param_leaves[owner], spec_leaves[owner], mesh))
          for pl, owner in zip(plans, owners) if owner is not None]
  lost = [(pl, owner, found) for pl, owner, found in lost if found]
  under = tuple(pl.path for pl, _, _ in lost)
  if lost:
    warnings.warn(under_sharded_message(lost, param_leaves, spec_leaves,
                                        param_paths, mesh),
                  ReplicatedStateWarning, stacklevel=2)
  shardings = jax.tree.unflatten(
      state_def, [NamedSharding(mesh, pl.spec) for pl in plans])
  update_shardings = jax.tree.unflatten(
      params_def, [NamedSharding(mesh, spec) for spec in update_specs])
  return StatePlan(shardings, tuple(plans), shard_state_over, under,
                   min_shard_bytes, update_shardings,
                   None if shard_state_over is None else mesh.shape[shard_state_over],
                   float_fallbacks)


def _owned_state(tx, params):
  """(``tx.init``'s abstract state on the params as they are, the owner of
  each leaf: ``state_owners``)."""
  unsharded = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype),
                           params)
  state = jax.eval_shape(tx.init, unsharded)
  return state, state_owners(tx.init, params, state)


def _largest_leaf_bytes(state, owners, num_params: int) -> list[int]:
  """Per param, the bytes of its largest state leaf (0 for none)."""
  largest = [0] * num_params
  for leaf, owner in zip(jax.tree.leaves(state), owners):
    if owner is not None:
      nbytes = math.prod(leaf.shape) * getattr(leaf.dtype, "itemsize", 0)
      largest[owner] = max(largest[owner], nbytes)
  return largest


def _update_spec(spec: P, zero: ParamZero | None, axis: str | None) -> P:
  """A param's spec with the ZeRO axis on the dimension ZeRO chose."""
  if zero is None or zero.dim is None or spec[zero.dim] is not None:
    return spec
  entries = list(spec)
  entries[zero.dim] = axis
  return P(*entries)


def _common_mesh(param_shardings):
  """The one mesh that every param sharding lives on."""
  leaves = jax.tree_util.tree_flatten_with_path(param_shardings)[0]
  if not leaves:
    raise ValueError("param_shardings has no leaves: there is no mesh to "
                     "lay the optimizer state on.")
  for path, s in leaves:
    if not isinstance(s, NamedSharding):
      raise TypeError(
          f"param_shardings{jax.tree_util.keystr(path)} is {s!r}; expected a "
          "jax.sharding.NamedSharding (mesh + PartitionSpec).")
  mesh = leaves[0][1].mesh
  for path, s in leaves:
    if tuple(s.mesh.shape.items()) != tuple(mesh.shape.items()):
      raise ValueError(
          f"param_shardings{jax.tree_util.keystr(path)} is on mesh "
          f"{dict(s.mesh.shape)}, others on {dict(mesh.shape)}; all params "
          "must share one mesh.")
  return mesh


def _param_specs(params, param_shardings) -> list[P]:
  """Per param leaf, its spec with one entry per dimension."""
  params_def = jax.tree.structure(params)
  if jax.tree.structure(param_shardings) != params_def:
    raise ValueError(
        "param_shardings must have the tree structure of params (one "
        "NamedSharding per param): "
        f"{first_structure_difference(param_shardings, params, 'param_shardings', 'sharding')}.")
  return [_full_spec(s.spec, len(p.shape)) for p, s in
          zip(jax.tree.leaves(params), jax.tree.leaves(param_shardings))]


def _abstract_state(tx, params, spec_leaves, params_def, mesh):
  """``tx.init`` traced on params typed with ``spec_leaves`` (their update
  layout), and the moments a ``quantized_state`` in it keeps in float for
  want of a block that fits (``_quantized.fallbacks``). An init that cannot
  be traced so, but can on untyped params, gets replicated state and a
  warning; one that fails either way raises the untyped trace's error."""
  specs = jax.tree.unflatten(params_def, spec_leaves)
  init = lambda p: tx.init(p)  # a new function: traced, so quantizers report
  with _quantized.collecting_reports() as reports:
    try:
      return (eval_shape_typed(init, params, specs, mesh),
              _quantized.fallbacks(reports))
    except Exception as err:  # noqa: BLE001 (the untyped trace decides)
      typed_error = err
    reports.clear()
    unsharded = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype),
                             params)
    state = jax.eval_shape(init, unsharded)
  warnings.warn(
      f"tx.init cannot be traced on the params' shardings ({typed_error}); "
      "its whole state is laid out replicated. Build state with "
      "sharding-preserving ops (zeros_like, reductions of the param) to "
      "have it sharded.", ReplicatedStateWarning, stacklevel=3)
  return state, _quantized.fallbacks(reports)


def _plan_leaf(path, leaf, param, zero, param_path, mesh, axis,
               min_shard_bytes):
  spec = _full_spec(leaf.sharding.spec if leaf.sharding is not None else P(),
                    len(leaf.shape))
  mirrors = param is not None and tuple(leaf.shape) == tuple(param.shape)
  outcome, split, dim = "", False, None
  if axis is not None:
    outcome, dim = leaf_zero(
        leaf.shape, leaf.dtype, spec, None if param is None else param.shape,
        zero, axis, mesh.shape[axis], min_shard_bytes)
    if dim is not None:
      entries = list(spec)
      entries[dim] = axis
      spec = P(*entries)
    split = mesh.shape[axis] > 1 and axis in spec_axes(tuple(spec))
  return LeafPlan(path, tuple(leaf.shape), leaf.dtype, spec, param_path,
                  mirrors, outcome, _device_bytes(leaf, spec, mesh), split,
                  split and (dim is not None
                             or zero is not None and not zero.own_layout))
