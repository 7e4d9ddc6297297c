"""The sharded optimizer step: jitted init and update with explicit layouts.

``sharded_init`` builds the state directly in its shardings (``jit`` without
``out_shardings`` would put the whole state on one device first).
``sharded_update`` runs ``(grads, state, params, **extra_args) -> (new_params,
new_state)`` with fixed in/out shardings, donating the state and the params so
that the step updates them in place.

Donation on XLA:CPU is sensitive to order: donated buffers must come back in
the order they were passed, or the step allocates a full-size temporary and
runs several times slower. The jitted function therefore takes
``(params, grads, state)`` and returns ``(params, state)``; ``ShardedUpdate``
presents it in optax's order, ``(grads, state, params)``.

``ShardedOptimizer.train_step(loss_fn)`` is the whole training step as one
program, ``(params, state, batch) -> (params, state, loss)``: loss, gradients
and the update compiled together, so XLA can fuse and overlap them and the
gradients never leave the program.

At the boundary (``_boundary``): grads are checked against params once per
compiled signature, and a donated array passed back in is refused with an
error that says so.
"""

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt._src.tree_math import apply_updates
from shardopt.sharding._boundary import check_grads
from shardopt.sharding._boundary import check_live
from shardopt.sharding._derivation import StatePlan
from shardopt.sharding._derivation import plan_state_shardings
from shardopt.sharding._zero import DEFAULT_MIN_SHARD_BYTES

__all__ = [
    "ShardedOptimizer",
    "ShardedUpdate",
    "TrainStep",
    "make_sharded_optimizer",
    "sharded_init",
    "sharded_update",
]


def sharded_init(tx, param_shardings, state_shardings) -> Callable:
  """``tx.init`` jitted to read params in ``param_shardings`` and write the
  state straight into ``state_shardings``."""
  return jax.jit(tx.init, in_shardings=(param_shardings,),
                 out_shardings=state_shardings)


class ShardedUpdate(NamedTuple):
  """``(grads, state, params, **extra_args) -> (new_params, new_state)``, jitted.

  Extra arguments (``value``, ``grad``, ``value_fn`` for line searches and
  L-BFGS) reach ``tx.update``: arrays as traced inputs laid out as given,
  callables as static arguments (a new callable recompiles the step).
  ``jitted`` is the underlying ``jax.jit`` function, with the signature
  ``(params, grads, state, arrays, callables) -> (new_params, new_state)``;
  ``lower`` lowers it from arguments given in optax's order.
  """

  jitted: Any

  def __call__(self, grads, state, params, **extra_args):
    check_live("opt.update", grads=grads, state=state, params=params)
    try:
      return self.jitted(params, grads, state, *_split_extra_args(extra_args))
    except (ValueError, TypeError):  # rejected before tracing: say why
      check_grads(grads, params)
      raise

  def lower(self, grads, state, params, **extra_args):
    return self.jitted.lower(params, grads, state, *_split_extra_args(extra_args))


def _split_extra_args(extra_args: dict) -> tuple[dict, tuple]:
  """(traced arguments, hashable static callables) of an update's extras."""
  callables = tuple(sorted((k, v) for k, v in extra_args.items() if callable(v)))
  arrays = {k: v for k, v in extra_args.items() if not callable(v)}
  return arrays, callables


def sharded_update(tx, param_shardings, state_shardings, *,
                   donate: bool = True) -> ShardedUpdate:
  """One optimizer step with fixed shardings.

  Grads are read in ``param_shardings``; the new params and state are written
  in ``param_shardings`` and ``state_shardings``. With ``donate`` (default)
  the state and params passed in are consumed: reuse only the returned ones.
  """

  def step(params, grads, state, arrays, callables):
    check_grads(grads, params)  # while tracing: once per signature
    updates, new_state = tx.update(grads, state, params, **arrays, **dict(callables))
    return apply_updates(params, updates), new_state

  return ShardedUpdate(jax.jit(
      step,
      in_shardings=(param_shardings, param_shardings, state_shardings, None),
      out_shardings=(param_shardings, state_shardings),
      static_argnums=(4,),
      donate_argnums=(0, 2) if donate else (),
      keep_unused=True))


class TrainStep(NamedTuple):
  """``(params, state, batch) -> (new_params, new_state, loss)``, one jitted
  program; ``jitted`` is the ``jax.jit`` function (same signature)."""

  jitted: Any

  def __call__(self, params, state, batch):
    check_live("train_step", params=params, state=state, batch=batch)
    return self.jitted(params, state, batch)

  def lower(self, params, state, batch):
    return self.jitted.lower(params, state, batch)


def _mesh_of(shardings):
  return jax.tree.leaves(shardings)[0].mesh


def _in_layout(tree, shardings):
  """``tree`` laid out in ``shardings`` inside a jitted function (on
  Explicit axes by ``reshard``, on Auto axes by a sharding constraint)."""
  if AxisType.Explicit in _mesh_of(shardings).axis_types:
    return jax.sharding.reshard(tree, shardings)
  return jax.lax.with_sharding_constraint(tree, shardings)


def _data_axes(mesh, data_axes, zero_axis) -> tuple[str, ...]:
  """The mesh axes the batch's leading dimension is split over."""
  if data_axes is None:
    data_axes = zero_axis or ("data" if "data" in mesh.shape else None)
  if data_axes is None:
    raise ValueError(
        f"train_step: the mesh {dict(mesh.shape)} has no 'data' axis and no "
        "ZeRO axis was given; pass data_axes=<the mesh axes the batch is "
        "split over>.")
  axes = (data_axes,) if isinstance(data_axes, str) else tuple(data_axes)
  unknown = [a for a in axes if a not in mesh.shape]
  if unknown:
    raise ValueError(f"train_step: data_axes {unknown} are not axes of the "
                     f"mesh {dict(mesh.shape)}.")
  return axes


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

  def train_step(self, loss_fn: Callable, *,
                 data_axes: str | tuple[str, ...] | None = None) -> TrainStep:
    """The training step as one jitted program.

    Args:
      loss_fn: ``loss_fn(params, batch) -> scalar loss``.
      data_axes: mesh axes over which every batch leaf's leading dimension
        is split; default the ZeRO axis if one was given, else ``'data'``.

    Returns:
      ``(params, state, batch) -> (new_params, new_state, loss)``: loss,
      gradients and ``tx.update`` in one program, with params and state in
      their planned shardings and, with ``donate`` (default), both donated:
      reuse only the returned ones. The loss comes back replicated and
      on device (no host sync).
    """
    mesh = _mesh_of(self.param_shardings)
    batch_sharding = NamedSharding(
        mesh, P(_data_axes(mesh, data_axes, self.plan.axis)))
    tx, param_shardings = self.tx, self.param_shardings

    def step(params, state, batch):
      loss, grads = jax.value_and_grad(loss_fn)(params, batch)
      # The backward pass keeps the params' layout, as in the two-program
      # step: without this, the state's ZeRO layout propagates into it.
      grads = _in_layout(grads, param_shardings)
      updates, new_state = tx.update(grads, state, params)
      return apply_updates(params, updates), new_state, loss

    return TrainStep(jax.jit(
        step,
        in_shardings=(self.param_shardings, self.state_shardings,
                      batch_sharding),
        out_shardings=(self.param_shardings, self.state_shardings,
                       NamedSharding(mesh, P())),
        donate_argnums=(0, 1) if self.donate else (),
        keep_unused=True))


def make_sharded_optimizer(tx, params, param_shardings, *,
                           shard_state_over: str | None = None,
                           min_shard_bytes: int = DEFAULT_MIN_SHARD_BYTES,
                           donate: bool = True) -> ShardedOptimizer:
  """Derives the state shardings of ``tx`` (see ``plan_state_shardings``;
  ``plan`` is the printable report) and jits init and update with them.

  Args:
    tx: the transformation (shardopt's or optax's).
    params: the params, as arrays or ``jax.ShapeDtypeStruct``.
    param_shardings: a ``NamedSharding`` per param.
    shard_state_over: the ZeRO mesh axis: every state leaf of at least
      ``min_shard_bytes`` is additionally sharded over it; ``None`` for none.
    min_shard_bytes: the smallest state leaf (whole-leaf bytes) ZeRO shards.
    donate: whether ``update`` and ``train_step`` consume the params and
      state passed in (in-place update; reuse only the returned ones).

  Returns:
    A ``ShardedOptimizer``: ``init``, ``update``, ``train_step(loss_fn)``,
    the state shardings and the plan.

  Warns, like ``state_shardings``, about leaves ZeRO could not shard.
  """
  plan = plan_state_shardings(tx, params, param_shardings,
                              shard_state_over=shard_state_over,
                              min_shard_bytes=min_shard_bytes)
  plan.warn_zero_skipped(stacklevel=2)
  return ShardedOptimizer(
      plan.shardings, plan,
      sharded_init(tx, param_shardings, plan.shardings),
      sharded_update(tx, param_shardings, plan.shardings, donate=donate),
      param_shardings, tx, donate)
