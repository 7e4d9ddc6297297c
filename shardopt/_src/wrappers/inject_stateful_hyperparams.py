"""Hyperparameters driven by stateful schedules, kept in the optimizer state.

``inject_stateful_hyperparams`` is ``inject_hyperparams`` for schedules that
keep a state of their own and may read the update's extra arguments (a loss
``value``, say): a stateful schedule has ``init() -> state``,
``update(state, **extra_args) -> state`` and
``__call__(state, **extra_args) -> value``. A plain schedule
(``count -> value``) is wrapped in ``WrappedSchedule``, whose state is its
step count. Schedule states are scalars or small trees, so their derived
shardings replicate.
"""

import functools
from typing import Any
from typing import Callable
from typing import Iterable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src.wrappers import inject_hyperparams as inject_hyperparams_lib

__all__ = [
    "InjectStatefulHyperparamsState",
    "WrappedSchedule",
    "WrappedScheduleState",
    "inject_stateful_hyperparams",
]


class InjectStatefulHyperparamsState(NamedTuple):
  """Step count, current hyperparameters, the schedules' states and the
  inner state."""

  count: jax.Array
  hyperparams: dict[str, jax.Array]
  hyperparams_states: dict[str, Any]
  inner_state: base.OptState


class WrappedScheduleState(NamedTuple):
  """The step count of a wrapped plain schedule."""

  count: jax.Array


class WrappedSchedule:
  """A plain schedule ``count -> value`` as a stateful schedule."""

  def __init__(self, schedule_fn: base.Schedule):
    self.schedule_fn = schedule_fn

  def init(self) -> WrappedScheduleState:
    return WrappedScheduleState(count=jnp.zeros([], jnp.int32))

  def update(self, state: WrappedScheduleState, **extra_args
             ) -> WrappedScheduleState:
    del extra_args
    return WrappedScheduleState(count=numerics.safe_increment(state.count))

  def __call__(self, state: WrappedScheduleState, **extra_args):
    del extra_args
    return self.schedule_fn(state.count)


def inject_stateful_hyperparams(
    inner_factory: Callable[..., base.GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype=None,
) -> Callable[..., base.GradientTransformationExtraArgs]:
  """Wraps ``inner_factory`` so its numeric arguments become state, schedules stateful.

  Like ``inject_hyperparams``, and any numeric argument may also be a
  stateful schedule: an object with ``init()``, ``__call__(state,
  **extra_args)`` giving the value and ``update(state, **extra_args)``
  advancing the state (a plain schedule is wrapped in ``WrappedSchedule``).

  Args:
    inner_factory: builds the inner transformation from hyperparameters,
      e.g. ``shardopt.adam``.
    static_args: names of arguments that are callables but not schedules.
    hyperparam_dtype: dtype of the floating hyperparameters; ``None``
      (default) uses the widest floating dtype of the params.

  Returns:
    A factory with ``inner_factory``'s signature returning a
    ``GradientTransformationExtraArgs`` whose state is an
    ``InjectStatefulHyperparamsState``. Each update evaluates every schedule
    on its current state (and the update's extra arguments), then advances
    that state; constants can be changed by the user between steps in
    ``state.hyperparams``.

  References:
    optax's ``inject_stateful_hyperparams``.
  """
  signature, static_args = inject_hyperparams_lib.factory_signature(inner_factory, static_args)

  @functools.wraps(inner_factory)
  def factory(*args, **kwargs) -> base.GradientTransformationExtraArgs:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    schedules, numbers, others = inject_hyperparams_lib.split_arguments(bound, static_args)
    schedules = {k: f if isinstance(f, base.StatefulSchedule) else WrappedSchedule(f)
                 for k, f in schedules.items()}

    def hyperparams_at(stored, schedule_states, dtype, extra_args):
      values = {k: inject_hyperparams_lib.as_hyperparam(v, dtype) for k, v in stored.items()}
      values.update({
          k: inject_hyperparams_lib.as_hyperparam(f(schedule_states[k], **extra_args), dtype)
          for k, f in schedules.items()})
      return values

    def init_fn(params):
      dtype = hyperparam_dtype or inject_hyperparams_lib.highest_float_dtype(params)
      states = {k: f.init() for k, f in schedules.items()}
      hyperparams = hyperparams_at(numbers, states, dtype, {})
      inner = inner_factory(**others, **hyperparams)
      return InjectStatefulHyperparamsState(
          jnp.zeros([], jnp.int32), hyperparams, states, inner.init(params))

    def update_fn(updates, state, params=None, **extra_args):
      dtype = hyperparam_dtype or inject_hyperparams_lib.highest_float_dtype(params)
      constants = {k: v for k, v in state.hyperparams.items()
                   if k not in schedules}
      hyperparams = hyperparams_at(constants, state.hyperparams_states, dtype,
                                   extra_args)
      inner = base.with_extra_args_support(inner_factory(**others, **hyperparams))
      updates, inner_state = inner.update(updates, state.inner_state, params,
                                          **extra_args)
      states = {k: f.update(state.hyperparams_states[k], **extra_args)
                for k, f in schedules.items()}
      return updates, InjectStatefulHyperparamsState(
          numerics.safe_increment(state.count), hyperparams, states,
          inner_state)

    return base.GradientTransformationExtraArgs(init_fn, update_fn)

  return factory
