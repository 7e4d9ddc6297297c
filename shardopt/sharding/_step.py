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
"""

from typing import Any
from typing import Callable
from typing import NamedTuple

import jax

from shardopt._src.tree_math import apply_updates
from shardopt.sharding._derivation import StatePlan
from shardopt.sharding._derivation import plan_state_shardings

__all__ = [
    "ShardedOptimizer",
    "ShardedUpdate",
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
    return self.jitted(params, grads, state, *_split_extra_args(extra_args))

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
    updates, new_state = tx.update(grads, state, params, **arrays, **dict(callables))
    return apply_updates(params, updates), new_state

  return ShardedUpdate(jax.jit(
      step,
      in_shardings=(param_shardings, param_shardings, state_shardings, None),
      out_shardings=(param_shardings, state_shardings),
      static_argnums=(4,),
      donate_argnums=(0, 2) if donate else (),
      keep_unused=True))


class ShardedOptimizer(NamedTuple):
  """A transformation bound to its layouts: ``init(params) -> state`` and
  ``update(grads, state, params) -> (new_params, new_state)``."""

  state_shardings: Any
  plan: StatePlan
  init: Callable
  update: ShardedUpdate


def make_sharded_optimizer(tx, params, param_shardings, *,
                           shard_state_over: str | None = None,
                           donate: bool = True) -> ShardedOptimizer:
  """Derives the state shardings of ``tx`` (see ``plan_state_shardings``;
  ``plan`` is the printable report) and jits init and update with them.

  Warns, like ``state_shardings``, about mirrors ZeRO could not shard.
  """
  plan = plan_state_shardings(tx, params, param_shardings,
                              shard_state_over=shard_state_over)
  plan.warn_zero_skipped(stacklevel=2)
  return ShardedOptimizer(
      plan.shardings, plan,
      sharded_init(tx, param_shardings, plan.shardings),
      sharded_update(tx, param_shardings, plan.shardings, donate=donate))
