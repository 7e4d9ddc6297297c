"""Sharpness-aware minimisation: adversarial steps, then an outer step.

Same names, signatures, defaults, state and numbers as ``optax.contrib``'s
``sam`` and ``normalize`` (0.2.8). ``SAMState.cache`` holds a copy of the
params (as the outer optimizer's params), so it is sharded like them.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math
from shardopt._src.tree_reductions import tree_norm

__all__ = ["NormalizeState", "SAMState", "normalize", "sam"]

NormalizeState = base.EmptyState


def normalize() -> base.GradientTransformation:
  """Divides the updates by their global L2 norm.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Foret et al., "Sharpness-Aware Minimization for Efficiently Improving
    Generalization", ICLR 2021 (https://arxiv.org/abs/2010.01412), Eq. 2.
  """

  def update_fn(updates, state, params=None):
    del params
    norm = tree_norm(updates)
    return jax.tree.map(lambda g: g / norm, updates), state

  return base.GradientTransformation(lambda params: NormalizeState(),
                                     update_fn)


class SAMState(NamedTuple):
  """Adversarial steps since the last outer step, both optimizers' states
  and the params of the last outer step (None in opaque mode)."""

  steps_since_sync: jax.Array  # int32 scalar
  opt_state: base.OptState
  adv_state: base.OptState
  cache: base.Params | None


def _select(condition, if_true, if_false):
  """``if_true`` where ``condition`` (0/1) else ``if_false``, by arithmetic."""
  return jax.tree.map(lambda t, f: condition * t + (1 - condition) * f,
                      if_true, if_false)


def _negate(tree):
  return jax.tree.map(lambda x: -x, tree)


def _transparent(optimizer, adv_optimizer, sync_period, reset_state):
  """One optimizer per call: sync_period - 1 adversarial calls, then one
  outer call that returns to the cached params and takes the outer step."""

  def update_fn(updates, state, params, *, grad_fn=None):
    del grad_fn
    first = state.steps_since_sync == 0
    last = state.steps_since_sync == sync_period - 1
    adv_updates, adv_state = adv_optimizer.update(updates, state.adv_state,
                                                  params)
    outer, opt_state = optimizer.update(updates, state.opt_state, state.cache)
    outer = jax.tree.map(lambda c, p, u: c - p + u, state.cache, params, outer)
    restart = adv_optimizer.init(params) if reset_state else state.adv_state
    return _select(last, outer, _negate(adv_updates)), SAMState(
        steps_since_sync=(state.steps_since_sync + 1) % sync_period,
        opt_state=_select(last, opt_state, state.opt_state),
        adv_state=_select(last, restart, adv_state),
        cache=_select(first, params, state.cache))

  return update_fn


def _opaque(optimizer, adv_optimizer, sync_period, reset_state,
            batch_axis_name):
  """Every call runs the adversarial steps (with ``grad_fn``) and the outer
  step: the caller only ever sees outer updates."""

  def update_fn(updates, state, params, *, grad_fn=None):
    if grad_fn is None:
      raise ValueError("sam(opaque_mode=True) needs update(..., grad_fn=f) "
                       "with f(params, i) -> gradients at params")
    adv_params, adv_state = params, state.adv_state
    for i in range(sync_period - 1):
      adv_updates, adv_state = adv_optimizer.update(updates, adv_state,
                                                    adv_params)
      adv_params = tree_math.apply_updates(adv_params, _negate(adv_updates))
      updates = grad_fn(adv_params, i)
      if batch_axis_name is not None:
        updates = jax.lax.pmean(updates, axis_name=batch_axis_name)
    if reset_state:
      adv_state = adv_optimizer.init(params)
    updates, opt_state = optimizer.update(updates, state.opt_state, params)
    return updates, SAMState(steps_since_sync=jnp.zeros([], jnp.int32),
                             opt_state=opt_state, adv_state=adv_state,
                             cache=None)

  return update_fn


def sam(
    optimizer: base.GradientTransformation,
    adv_optimizer: base.GradientTransformation,
    sync_period: int = 2,
    reset_state: bool = True,
    opaque_mode: bool = False,
    batch_axis_name: str | None = None,
) -> base.GradientTransformationExtraArgs:
  """SAM: ``sync_period - 1`` ascent steps of ``adv_optimizer``, then one
  step of ``optimizer`` with the gradient at the perturbed params, applied
  to the params from before the ascent.

  The drop-in SAM of the paper is
  ``sam(sgd(lr), chain(normalize(), sgd(rho)), sync_period=2)``.

  Args:
    optimizer: the outer optimizer.
    adv_optimizer: the adversarial (ascent) optimizer.
    sync_period: calls per outer step (>= 1).
    reset_state: whether to restart ``adv_optimizer``'s state after every
      outer step.
    opaque_mode: if True, each ``update`` runs all the adversarial steps
      itself, calling ``update(..., grad_fn=f)``'s ``f(params, i)`` for the
      gradients, and returns only outer updates; if False, each call is one
      step, adversarial ones included.
    batch_axis_name: in opaque mode, a ``pmap`` axis over which to average
      the adversarial gradients.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``SAMState``.

  References:
    Foret et al., "Sharpness-Aware Minimization for Efficiently Improving
    Generalization", ICLR 2021 (https://arxiv.org/abs/2010.01412).
  """
  if sync_period < 1:
    raise ValueError(f"sync_period={sync_period}: must be >= 1")

  def init_fn(params):
    return SAMState(steps_since_sync=jnp.zeros([], jnp.int32),
                    opt_state=optimizer.init(params),
                    adv_state=adv_optimizer.init(params),
                    cache=None if opaque_mode else params)

  update_fn = (
      _opaque(optimizer, adv_optimizer, sync_period, reset_state,
              batch_axis_name) if opaque_mode
      else _transparent(optimizer, adv_optimizer, sync_period, reset_state))
  return base.GradientTransformationExtraArgs(init_fn, update_fn)
