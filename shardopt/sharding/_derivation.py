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
The plan says, leaf by leaf, what was split and why the rest could not be;
the large leaves left out are listed in ``zero_skipped`` and warned about.

Which state leaf belongs to which param: by the stand-in trace of
``shardopt._src.ownership`` (a structural prefix match only where that
trace cannot run). A derived leaf with its param's shape *mirrors* it. A
leaf that lacks one of its param's mesh axes is reported with a
``ReplicatedStateWarning`` (never silently) where that costs memory: a
mirror (state built from a bare shape), or any leaf holding more elements
per device than its param (Shampoo's block statistics where the block grid
does not divide over an axis, a replicated statistic larger than a shard).
The warning names the leaf, its param, the spec it got, the axes lost and
what keeps it split. Statistics small by design (Adafactor's rows and
columns, per-param scalars) are not reported.
"""

import math
from typing import Any
from typing import NamedTuple
import warnings

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt._src.ownership import state_owners
from shardopt._src.quantization.report import QuantizedLeaf
from shardopt._src.typed_layouts import eval_shape_typed
from shardopt._src.wrappers import quantized_state as _quantized
from shardopt.sharding._boundary import check_param_shardings
from shardopt.sharding._specs import device_bytes as _device_bytes
from shardopt.sharding._specs import entry_size
from shardopt.sharding._specs import full_spec as _full_spec
from shardopt.sharding._specs import spec_axes as _axes
from shardopt.sharding._zero import DEFAULT_MIN_SHARD_BYTES
from shardopt.sharding._zero import ParamZero
from shardopt.sharding._zero import leaf_zero
from shardopt.sharding._zero import param_zero

__all__ = [
    "LeafPlan",
    "ReplicatedStateWarning",
    "StatePlan",
    "plan_state_shardings",
    "state_shardings",
]


class ReplicatedStateWarning(UserWarning):
  """State that should follow its param's sharding but does not."""


class LeafPlan(NamedTuple):
  """How one state leaf is laid out, and why."""

  path: str  # the leaf's path in the state, as ``jax.tree_util.keystr``
  shape: tuple[int, ...]
  dtype: Any
  spec: P  # one entry per dimension
  param: str | None  # path of the param it derives from, if any
  mirrors: bool  # derives from ``param`` and has its shape
  zero: str  # ZeRO outcome: "dim k", a reason it was not sharded, or ""
  device_bytes: int  # bytes of this leaf resident on each device


class StatePlan(NamedTuple):
  """Derived state shardings plus a printable per-leaf report."""

  shardings: Any  # NamedSharding tree with the structure of tx.init(params)
  leaves: tuple[LeafPlan, ...]
  axis: str | None  # the ZeRO axis, if one was asked for
  under_sharded: tuple[str, ...]  # derived leaves less sharded than their param
  min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES  # ZeRO leaves smaller alone
  # Per param (the params' tree): the layout ``tx.update`` sees the param and
  # its gradient in, the param's sharding plus the ZeRO axis on the
  # dimension its state is split on.
  update_shardings: Any = None
  axis_size: int | None = None  # the size of ``axis`` on the mesh
  # Moments a ``quantized_state`` inside the transformation keeps in float
  # because no block fits their shard here (paths in its inner state).
  float_fallbacks: tuple[QuantizedLeaf, ...] = ()

  @property
  def zero_splits_nothing(self) -> bool:
    """ZeRO was asked for over an axis of size 1, which splits nothing."""
    return self.axis is not None and self.axis_size == 1

  @property
  def zero_sharded(self) -> tuple[LeafPlan, ...]:
    """Leaves that ZeRO sharded over ``axis``."""
    return tuple(l for l in self.leaves if l.zero.startswith("dim "))

  @property
  def zero_skipped(self) -> tuple[LeafPlan, ...]:
    """Leaves of at least ``min_shard_bytes`` (scalars aside) that ZeRO did
    not shard over ``axis``; ``zero`` says why."""
    return tuple(
        l for l in self.leaves if self.axis and l.shape
        and not l.zero.startswith("dim ")
        and _nbytes(l) >= self.min_shard_bytes)

  @property
  def bytes_per_device(self) -> int:
    """Bytes of the whole state resident on each device."""
    return sum(l.device_bytes for l in self.leaves)

  def warn_zero_skipped(self, stacklevel: int = 1) -> None:
    """Warns, listing the mirrors ZeRO could not shard and why, if any
    (not where the ZeRO axis has size 1: ``plan_state_shardings`` warned
    about that once)."""
    if self.zero_skipped and not self.zero_splits_nothing:
      warnings.warn(
          f"shard_state_over={self.axis!r} left these state leaves as they were "
          "(not sharded over it by ZeRO): " + "; ".join(f"{l.path} ({l.zero})"
                                  for l in self.zero_skipped),
          ReplicatedStateWarning, stacklevel=stacklevel + 1)

  def __str__(self) -> str:
    head = (f"state sharding plan: {len(self.leaves)} leaves, "
            f"{self.bytes_per_device:,} bytes per device")
    if self.zero_splits_nothing:
      head += (f"; ZeRO over {self.axis!r}: the axis has size 1, so no leaf is split"
               " (bytes per device as without ZeRO)")
    elif self.axis:
      mirrors = sum(l.mirrors for l in self.zero_skipped)
      head += (f"; ZeRO over {self.axis!r}: {len(self.zero_sharded)} sharded,"
               f" {mirrors} mirrors not, {len(self.zero_skipped) - mirrors}"
               f" other leaves >= {self.min_shard_bytes} bytes not")
    width = max([len(l.path) for l in self.leaves] + [4])
    lines = [head]
    for l in self.leaves:
      origin = f" <- params{l.param}" if l.param is not None else ""
      zero = f"  zero: {l.zero}" if l.zero else ""
      lines.append(f"  {l.path:<{width}}  {l.shape!s:<14} {l.dtype!s:<8} "
                   f"{l.spec}{origin}{zero}")
    if self.float_fallbacks:
      lines.append("quantized_state keeps these moments in float (paths in "
                   "its inner state):")
      lines += [f"  {l.path}  {l.shape}  {l.stored}: {l.reason}"
                for l in self.float_fallbacks]
    return "\n".join(lines)


def _nbytes(leaf: LeafPlan) -> int:
  return math.prod(leaf.shape) * getattr(leaf.dtype, "itemsize", 0)


def state_shardings(tx, params, param_shardings, *, shard_state_over=None,
                    min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES):
  """The ``NamedSharding`` of every leaf of ``tx.init(params)``.

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
  lost = [(pl, owner, _lost_parts(pl, param_leaves[owner], spec_leaves[owner], mesh))
          for pl, owner in zip(plans, owners) if owner is not None]
  lost = [(pl, owner, found) for pl, owner, found in lost if found]
  under = tuple(pl.path for pl, _, _ in lost)
  if lost:
    warnings.warn(_under_sharded_message(lost, param_leaves, spec_leaves,
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
        f"NamedSharding per param): got {jax.tree.structure(param_shardings)}"
        f" for params {params_def}.")
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
  outcome = ""
  if axis is not None:
    outcome, dim = leaf_zero(
        leaf.shape, leaf.dtype, spec, None if param is None else param.shape,
        zero, axis, mesh.shape[axis], min_shard_bytes)
    if dim is not None:
      entries = list(spec)
      entries[dim] = axis
      spec = P(*entries)
  return LeafPlan(path, tuple(leaf.shape), leaf.dtype, spec, param_path,
                  mirrors, outcome, _device_bytes(leaf, spec, mesh))


class _Lost(NamedTuple):
  """How much of its param's layout a state leaf lost."""

  axes: tuple[str, ...]  # the param's mesh axes the leaf does not use
  parts: int  # into how many parts the leaf is split
  param_parts: int  # into how many parts its param is split
  elements: int  # the leaf's elements per device
  param_elements: int  # its param's elements per device


def _parts(spec, mesh) -> int:
  return math.prod(mesh.shape[a] for a in _axes(spec))


def _lost_parts(plan: LeafPlan, param, param_spec, mesh) -> _Lost | None:
  """What ``plan``'s leaf lost of its param's layout, where it matters; None
  where it lost nothing or nothing that matters.

  A leaf matters when it lacks one of its param's mesh axes and is a mirror
  (its param's shape), or holds more elements per device than its param
  does (a leaf of at least its param's size split into fewer parts than the
  param, e.g. Shampoo's block statistics whose block grid the param's axes
  do not divide, or a replicated statistic larger than a shard). State that
  is small by design (Adafactor's row/column statistics, SM3's covers,
  per-param scalars) holds fewer elements per device than its param and
  is not reported.
  """
  axes = tuple(sorted(a for a in _axes(param_spec) - _axes(plan.spec) if mesh.shape[a] > 1))
  if not axes:
    return None
  parts, param_parts = _parts(plan.spec, mesh), _parts(param_spec, mesh)
  lost = _Lost(axes, parts, param_parts, -(-math.prod(plan.shape) // parts),
               -(-math.prod(param.shape) // param_parts))
  return lost if plan.mirrors or lost.elements > lost.param_elements else None


def _shard_shape(shape, spec, mesh) -> tuple[int, ...]:
  return tuple(-(-d // entry_size(mesh, e)) for d, e in zip(shape, spec))


def _under_sharded_message(lost, param_leaves, spec_leaves, param_paths,
                           mesh) -> str:
  """One line per leaf (the param, the spec it got, the parts lost) and per
  param what keeps its state split."""
  lines, hints = [], {}
  for pl, owner, l in lost:
    param, spec = param_leaves[owner], spec_leaves[owner]
    axes = ", ".join(f"{a!r}={mesh.shape[a]}" for a in l.axes)
    lines.append(
        f"  {pl.path} {pl.shape} of params{param_paths[owner]} "
        f"{tuple(param.shape)} {spec}: got {pl.spec}, without {axes}: split "
        f"into {l.parts} parts where its param is split into {l.param_parts}, "
        f"{l.elements} elements per device where its param has "
        f"{l.param_elements} ({l.elements / max(l.param_elements, 1):.2g}x)")
    shard = _shard_shape(param.shape, spec, mesh)
    split = [n for n, e in zip(shard, spec) if e is not None]
    block = math.gcd(*split) if split else None
    hints[owner] = (
        f"  params{param_paths[owner]}: each device holds a {shard} shard"
        + (f"; if its state is built in blocks, a block_size dividing its split"
           f" dimensions (e.g. {block}) keeps each block on one device"
           if block and block > 1 else ""))
  return (
      "these optimizer-state leaves are less sharded than the param they "
      "derive from, so each device holds more of them than its share:\n"
      + "\n".join(lines)
      + "\nTo keep them split: state built from a bare shape "
      "(jnp.zeros(p.shape)) loses its param's layout, build it with "
      "jnp.zeros_like(p); state built in blocks (Shampoo's and SOAP's "
      "block_size) is split only where the blocks tile each shard:\n"
      + "\n".join(hints.values()))
