"""The sharded optimizer step: jitted init and update with explicit layouts.

``sharded_init`` builds the state directly in its shardings (``jit`` without
``out_shardings`` would put the whole state on one device first), tracing
``init`` on the params typed in their update layout, as the derivation did.
``sharded_update`` runs ``(grads, state, params, **extra_args) -> (new_params,
new_state)`` with fixed in/out shardings, donating the state and the params so
that the step updates them in place.

Layouts are applied here, once, for every transformation: ``tx.update``
receives the gradients and the params in their *update layout*
(``StatePlan.update_shardings``: the params' shardings with the ZeRO axis on
the dimension their state is split on), so its state, gradients and params
agree inside every ``cond``, ``select`` or ``scan`` on Auto and on Explicit
axes; the updates are applied to the params in that layout and the new
params go back to the params' own (``_layouts.apply_in_layout``). On
Explicit axes ``tx.update`` itself runs with the axes Auto
(``_layouts.update_in_layout``), so transformations written without sharding
types (optax's own) run on either kind of mesh.

Donation on XLA:CPU is sensitive to order: donated buffers must come back in
the order they were passed, or the step allocates a full-size temporary and
runs several times slower. The jitted function therefore takes
``(params, grads, state)`` and returns ``(params, state)``; ``ShardedUpdate``
presents it in optax's order, ``(grads, state, params)``.

``ShardedOptimizer.train_step(loss_fn)`` (``_train_step``) is the whole
training step as one program: loss, gradients and the update.

At the boundary: grads are checked against params once per compiled
signature (``_boundary``), and a donated array passed back in is refused
with an error that says so (``_liveness``).
"""

from collections.abc import Callable
import dataclasses
from typing import Any
from typing import NamedTuple

import jax

from shardopt._src.base import GradientTransformationExtraArgs
from shardopt._src.base import with_extra_args_support
from shardopt.sharding._boundary import check_grads
from shardopt.sharding._boundary import check_inputs
from shardopt.sharding._boundary import explained_rejection
from shardopt.sharding._derivation import plan_state_shardings
from shardopt.sharding._layouts import mesh_of
from shardopt.sharding._layouts import typed
from shardopt.sharding._layouts import under_mesh
from shardopt.sharding._layouts import apply_in_layout
from shardopt.sharding._layouts import update_in_layout
from shardopt.sharding._liveness import check_live
from shardopt.sharding._memory import in_memory
from shardopt.sharding._memory import to_device
from shardopt.sharding._memory import to_home
from shardopt.sharding._plan import StatePlan
from shardopt.sharding._train_step import TrainStep
from shardopt.sharding._train_step import make_train_step
from shardopt.sharding._zero import DEFAULT_MIN_SHARD_BYTES

__all__ = [
    "ShardedInit",
    "ShardedOptimizer",
    "ShardedUpdate",
    "make_sharded_optimizer",
    "sharded_init",
    "sharded_update",
    "with_update_layout",
]


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedInit:
  """``(params) -> state``, jitted (``jitted``), traced under the params'
  mesh; params of another tree than ``param_shardings``', or of other shapes
  than ``params_like``'s where given, get an error naming where (checked
  before each call: ``jit`` would trace a state for the other shapes).
  ``eval_shape`` gives the state as ``jax.ShapeDtypeStruct``s with their
  shardings (a restore target; ``jax.eval_shape`` drops them)."""

  jitted: Any
  param_shardings: Any
  params_like: Any = None  # the params' shapes (None: not checked)

  def __call__(self, params):
    check_inputs(self.param_shardings, params, params_like=self.params_like)
    with explained_rejection(self.param_shardings, params):
      return self.jitted(params)

  def eval_shape(self, params):
    check_inputs(self.param_shardings, params, params_like=self.params_like)
    with explained_rejection(self.param_shardings, params):
      return self.jitted.eval_shape(params)

  def lower(self, params):
    return self.jitted.lower(params)


def sharded_init(tx, param_shardings, state_shardings, *,
                 update_shardings=None, params=None) -> ShardedInit:
  """``tx.init`` jitted to read params in ``param_shardings`` and write the
  state straight into ``state_shardings``.

  ``init`` is traced on the params typed in ``update_shardings`` (default
  the params' own; pass ``plan.update_shardings`` of a ZeRO plan), so that
  state whose shape depends on its layout (``quantized_state``'s blocks)
  comes out as the plan derived it. ``params`` (arrays or
  ``jax.ShapeDtypeStruct``s), where given: a call with params of other
  shapes gets an error naming the first.
  """
  layout = param_shardings if update_shardings is None else update_shardings
  return ShardedInit(jax.jit(under_mesh(typed(tx.init, layout), mesh_of(layout)),
                             in_shardings=(param_shardings,),
                             out_shardings=state_shardings), param_shardings,
                     _shapes_of(params))


def _shapes_of(params):
  """``params`` as ``jax.ShapeDtypeStruct``s (None: None)."""
  return None if params is None else jax.tree.map(
      lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)


def with_update_layout(tx, param_shardings, update_shardings=None
                       ) -> GradientTransformationExtraArgs:
  """``tx`` for a framework that calls ``init`` and ``update`` inside its own
  ``jit`` (Flax's ``TrainState.apply_gradients``, ``nnx.Optimizer.update``),
  laid out as the sharded step lays it out: ``init`` traced on the params
  typed in ``update_shardings`` (a ZeRO plan's ``update_shardings``; default
  the params' own), ``update`` handed the gradients and params in that layout
  and its updates returned in ``param_shardings``, so the new params keep
  their layout (on Explicit axes the sum of a param and an update laid out
  for ZeRO would not; on Auto axes the partitioner would choose one). The
  trees may be any containers with the params' leaves in order (an
  ``nnx.State``)."""
  tx = with_extra_args_support(tx)
  layout = param_shardings if update_shardings is None else update_shardings

  def update(grads, state, params=None, **extra_args):
    ordered = lambda shardings: jax.tree.unflatten(jax.tree.structure(grads),
                                                   jax.tree.leaves(shardings))
    return update_in_layout(tx, grads, state, params, ordered(layout),
                            ordered(param_shardings), **extra_args)

  return GradientTransformationExtraArgs(typed(tx.init, layout), update)


@dataclasses.dataclass(frozen=True, eq=False)
class ShardedUpdate:
  """``(grads, state, params, **extra_args) -> (new_params, new_state)``, jitted.

  Extra arguments (``value``, ``grad``, ``value_fn`` for line searches and
  L-BFGS) reach ``tx.update``: arrays as traced inputs laid out as given,
  callables as static arguments (a new callable recompiles the step).
  ``jitted`` is the underlying ``jax.jit`` function, with the signature
  ``(params, grads, state, arrays, callables) -> (new_params, new_state)``;
  ``lower`` lowers it from arguments given in optax's order. Params or a
  state of another tree than ``param_shardings`` / ``state_shardings`` get
  an error naming where; with ``donated`` (the params and state consumed),
  so does one array passed at two places of them or of the grads and extra
  arguments. It is traced under the params' mesh
  (``jax.sharding.use_abstract_mesh``), so a ``value_fn`` that names
  ``PartitionSpec``s needs no mesh context of the caller's; it may be called
  inside another ``jit``.
  """

  jitted: Any
  param_shardings: Any
  state_shardings: Any
  donated: bool
  params_like: Any = None  # the params' shapes, for errors (None: not checked)

  def __call__(self, grads, state, params, **extra_args):
    check_live("opt.update", ("params", "state") if self.donated else (),
               params=params, state=state, grads=grads, **extra_args)
    with explained_rejection(self.param_shardings, params,
                             self.state_shardings, state, grads, self.params_like):
      return self.jitted(params, grads, state, *_split_extra_args(extra_args))

  def lower(self, grads, state, params, **extra_args):
    return self.jitted.lower(params, grads, state, *_split_extra_args(extra_args))


def _split_extra_args(extra_args: dict) -> tuple[dict, tuple]:
  """(traced arguments, hashable static callables) of an update's extras."""
  callables = tuple(sorted((k, v) for k, v in extra_args.items() if callable(v)))
  arrays = {k: v for k, v in extra_args.items() if not callable(v)}
  return arrays, callables


def sharded_update(tx, param_shardings, state_shardings, *,
                   donate: bool = True, update_shardings=None,
                   params=None) -> ShardedUpdate:
  """One optimizer step with fixed shardings.

  Grads are read in ``param_shardings`` and handed to ``tx.update``, with
  the params, in ``update_shardings`` (default the params' own; pass
  ``plan.update_shardings`` of a ZeRO plan); the new params and state are
  written in ``param_shardings`` and ``state_shardings``. State whose
  shardings name another memory kind (``make_sharded_optimizer``'s
  ``state_memory_kind``) is moved to device memory and back inside the
  step. With ``donate`` (default) the state and params passed in are
  consumed: reuse only the returned ones. ``params`` (arrays or
  ``jax.ShapeDtypeStruct``s), where given: a call with params of other
  shapes gets an error naming the first.
  """
  layout = param_shardings if update_shardings is None else update_shardings
  params_like = _shapes_of(params)

  def step(params, grads, state, arrays, callables):
    check_grads(grads, params)  # while tracing: once per signature
    new_params, _, new_state = apply_in_layout(
        tx, grads, to_device(state, state_shardings), params, layout,
        param_shardings, **arrays, **dict(callables))
    return new_params, to_home(new_state, state_shardings)

  return ShardedUpdate(jax.jit(
      under_mesh(step, mesh_of(param_shardings)),
      in_shardings=(param_shardings, param_shardings, state_shardings, None),
      out_shardings=(param_shardings, state_shardings),
      static_argnums=(4,),
      donate_argnums=(0, 2) if donate else (),
      keep_unused=True), param_shardings, state_shardings, donate, params_like)


class ShardedOptimizer(NamedTuple):
  """A transformation bound to its layouts: ``init(params) -> state``,
  ``update(grads, state, params) -> (new_params, new_state)``, and
  ``train_step(loss_fn)``."""

  state_shardings: Any
  plan: StatePlan
  init: Callable
  update: ShardedUpdate
  param_shardings: Any
  tx: Any
  donate: bool

  @property
  def update_shardings(self):
    """Per param, the layout ``tx.update`` sees it and its gradient in."""
    return self.plan.update_shardings

  def train_step(self, loss_fn: Callable, **options) -> TrainStep:
    """The training step as one jitted program; see ``make_train_step`` for
    ``loss_fn`` and the options (``has_aux``, ``with_key``,
    ``microbatches``, ``batch_spec``, ``data_axes``, ``extra_args``,
    ``metrics``)."""
    return make_train_step(self, loss_fn, **options)


def make_sharded_optimizer(tx, params, param_shardings, *,
                           shard_state_over: str | None = None,
                           min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
                           donate: bool = True,
                           state_memory_kind: str | None = None
                           ) -> ShardedOptimizer:
  """Derives the state shardings of ``tx`` (see ``plan_state_shardings``;
  ``plan`` is the printable report) and jits init and update with them.

  Args:
    tx: the transformation (shardopt's or optax's).
    params: the params, as arrays or ``jax.ShapeDtypeStruct``.
    param_shardings: a ``NamedSharding`` per param.
    shard_state_over: the ZeRO mesh axis: the state of every param of at
      least ``min_shard_bytes`` or with a state leaf of at least that (and
      every other state leaf of that size) is additionally split over it;
      ``None`` for none.
    min_shard_bytes: the bytes (whole param or whole state leaf) from which
      ZeRO splits a param's state.
    donate: whether ``update`` and ``train_step`` consume the params and
      state passed in (in-place update; reuse only the returned ones).
    state_memory_kind: the memory every state leaf lives in between steps,
      e.g. ``"pinned_host"`` (host offloading: ``init`` writes it there,
      ``update`` and ``train_step`` move it to the device and back inside
      their program); None keeps it in device memory.

  Returns:
    A ``ShardedOptimizer``: ``init``, ``update``, ``train_step(loss_fn)``,
    the state shardings and the plan.

  Warns, like ``state_shardings``, about leaves ZeRO could not shard.
  """
  plan = plan_state_shardings(tx, params, param_shardings,
                              shard_state_over=shard_state_over,
                              min_shard_bytes=min_shard_bytes)
  plan.warn_zero_skipped(stacklevel=2)
  state_shardings = in_memory(plan.shardings, state_memory_kind,
                              param_shardings)
  return ShardedOptimizer(
      state_shardings, plan,
      sharded_init(tx, param_shardings, state_shardings,
                   update_shardings=plan.update_shardings, params=params),
      sharded_update(tx, param_shardings, state_shardings, donate=donate,
                     update_shardings=plan.update_shardings, params=params),
      param_shardings, tx, donate)
