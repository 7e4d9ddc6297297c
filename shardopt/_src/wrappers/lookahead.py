"""Lookahead: a fast optimizer explores, a slow copy of the params follows.

The params are a ``LookaheadParams(fast, slow)`` pair. Gradients are taken at
``fast``; every ``sync_period`` steps ``slow`` moves a fraction
``slow_step_size`` of the way towards where ``fast`` arrived, and ``fast`` is
put back onto the new ``slow``. The update is itself a ``LookaheadParams`` of
updates, to be applied unchanged with ``apply_updates``. The state is the
fast optimizer's state (sharded like its params) and a scalar step counter.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base

__all__ = [
    "LookaheadParams",
    "LookaheadState",
    "lookahead",
]


class LookaheadState(NamedTuple):
  """The fast optimizer's state and the fast steps taken since the last sync."""

  fast_state: base.OptState
  steps_since_sync: jax.Array


class LookaheadParams(NamedTuple):
  """The params of a lookahead run: ``fast`` for gradients, ``slow`` for
  evaluation and inference.

  Reference: Zhang et al., "Lookahead Optimizer: k steps forward, 1 step
  back", NeurIPS 2019 (https://arxiv.org/abs/1907.08610).
  """

  fast: base.Params
  slow: base.Params

  @classmethod
  def init_synced(cls, params: base.Params) -> "LookaheadParams":
    """A pair whose fast and slow params both equal ``params``: ``fast`` is
    ``params``, ``slow`` a copy (a step that donates its inputs, such as
    the sharded step, consumes each half)."""
    return cls(fast=params, slow=jax.tree.map(_copy, params))


def _copy(x):
  return x.copy() if hasattr(x, "copy") else x


def _pair_updates(fast_updates, sync, params: LookaheadParams, slow_step_size):
  """The updates of both halves of the pair after one fast step.

  Without a sync the slow params stay and the fast ones take the step. At a
  sync both land on ``slow + slow_step_size * (fast_after_step - slow)``.
  """
  gap = jax.tree.map(lambda f, u, s: f + u - s, params.fast, fast_updates,
                     params.slow)
  slow = jax.tree.map(
      lambda d: jnp.where(sync, slow_step_size * d, jnp.zeros_like(d)), gap)
  fast = jax.tree.map(
      lambda u, d: jnp.where(sync, u - (1 - slow_step_size) * d, u),
      fast_updates, gap)
  return LookaheadParams(fast=fast, slow=slow)


def lookahead(
    fast_optimizer: base.GradientTransformation,
    sync_period: int,
    slow_step_size: jax.typing.ArrayLike,
    reset_state: bool = False,
) -> base.GradientTransformation:
  """Lookahead around ``fast_optimizer``: k fast steps forward, one slow step back.

  ``init`` takes a ``LookaheadParams`` (or the fast params alone);
  ``update`` needs the ``LookaheadParams`` and the gradients at
  ``params.fast``, given alone or as the ``fast`` half of a
  ``LookaheadParams`` (the gradient of a loss of the pair, as the sharded
  step and ``train_step`` take it; its ``slow`` half is not read). Every ``sync_period`` steps the slow params move
  ``slow_step_size`` of the way to the fast ones and the fast params are
  reset to them. Do not change the returned updates before applying them,
  or the pair drifts apart.

  Args:
    fast_optimizer: the optimizer of the fast params (its updates are the
      fast steps).
    sync_period: fast steps between two syncs; below 1 raises ValueError.
    slow_step_size: the fraction of the way from ``slow`` to ``fast`` that
      the slow params move at a sync.
    reset_state: re-initialise the fast optimizer's state at every sync
      (default False).

  Returns:
    A ``GradientTransformation`` whose state is a ``LookaheadState`` and
    whose updates are a ``LookaheadParams`` of fast and slow updates.

  References:
    Zhang et al., "Lookahead Optimizer: k steps forward, 1 step back",
    NeurIPS 2019 (https://arxiv.org/abs/1907.08610).
  """
  if sync_period < 1:
    raise ValueError(f"lookahead: sync_period must be >= 1, got {sync_period}")

  def init_fn(params):
    fast = getattr(params, "fast", params)
    return LookaheadState(fast_state=fast_optimizer.init(fast),
                          steps_since_sync=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None):
    if params is None or not hasattr(params, "fast"):
      raise ValueError(
          "lookahead: update needs params=LookaheadParams(fast=..., slow=...);"
          " build them with LookaheadParams.init_synced(params)")
    fast_grads = updates.fast if isinstance(updates, LookaheadParams) else updates
    fast_updates, fast_state = fast_optimizer.update(
        fast_grads, state.fast_state, params.fast)
    sync = state.steps_since_sync == sync_period - 1
    if reset_state:
      fresh = fast_optimizer.init(params.fast)
      fast_state = jax.tree.map(lambda now, new: jnp.where(sync, new, now),
                                fast_state, fresh)
    steps = (state.steps_since_sync + 1) % sync_period
    return (_pair_updates(fast_updates, sync, params, slow_step_size),
            LookaheadState(fast_state, steps))

  return base.GradientTransformation(init_fn, update_fn)
