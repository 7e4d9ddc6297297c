"""Hyperparameters kept in the optimizer state, so they can change between steps.

``inject_hyperparams(shardopt.adam)(learning_rate=schedule, b1=0.9)`` builds an
optimizer whose numeric hyperparameters live in ``state.hyperparams``: a
schedule is evaluated before every update, and a constant can be overwritten
by the user between steps (``state.hyperparams['b1'] = 0.8``). A schedule is
either plain (``count -> value``, wrapped in ``WrappedSchedule``) or stateful
(``base.StatefulSchedule``: ``init``, ``update(state, **extra_args)``,
``__call__(state, **extra_args)``, e.g. reading the loss ``value``), its state
kept in ``state.hyperparams_states``. As in optax 0.2.8, the state is an
``InjectStatefulHyperparamsState`` and ``inject_stateful_hyperparams`` is a
deprecated alias. Hyperparameters and schedule states are scalars or small
trees, so their derived shardings replicate; they are checkpointed with the
rest of the state.
"""

import functools
import inspect
from typing import Any
from typing import Callable
from typing import Iterable
from typing import NamedTuple
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from shardopt._src import base
from shardopt._src import numerics

__all__ = [
    "InjectHyperparamsState",
    "InjectStatefulHyperparamsState",
    "WrappedSchedule",
    "WrappedScheduleState",
    "inject_hyperparams",
    "inject_stateful_hyperparams",
]


class InjectHyperparamsState(NamedTuple):
  """optax's pre-0.1.9 state (count, hyperparameters, inner state), kept as a
  public name as optax 0.2.8 keeps it; ``inject_hyperparams`` returns an
  ``InjectStatefulHyperparamsState``."""

  count: jax.Array
  hyperparams: dict[str, jax.Array]
  inner_state: base.OptState


class InjectStatefulHyperparamsState(NamedTuple):
  """Step count, current hyperparameters, the schedules' states and the
  inner state."""

  count: jax.Array
  hyperparams: dict[str, Any]
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


def _highest_float_dtype(params: Any):
  """The widest floating dtype among the params (float32 when there is none)."""
  dtypes = [
      jnp.asarray(x).dtype
      for x in jax.tree.leaves(params)
      if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
  ]
  if not dtypes:
    return jnp.dtype(jnp.float32)
  return functools.reduce(jnp.promote_types, dtypes)


def _as_hyperparam(value, dtype):
  """Floats (and weakly typed float arrays) in ``dtype``; everything else
  (strong dtypes, integers, PRNG keys) unchanged."""
  if isinstance(value, jax.Array) and not getattr(value, "weak_type", False):
    return value
  value_dtype = value.dtype if hasattr(value, "dtype") else type(value)
  if jnp.issubdtype(value_dtype, jnp.floating):
    return jnp.asarray(value, dtype)
  return value


def _split_arguments(bound: inspect.BoundArguments, static_args: set[str]):
  """Sorts the factory's arguments into schedules (stateful, or plain ones
  wrapped), numbers (arrays and PRNG keys included) and the rest. A class
  is passed as it is, never called as a schedule: ``mu_dtype=jnp.bfloat16``
  is a dtype (optax 0.2.8 wraps it as a schedule and fails)."""
  schedules, numbers, others = {}, {}, {}
  for name, value in bound.arguments.items():
    if name in static_args or isinstance(value, (bool, type)):
      others[name] = value
    elif isinstance(value, base.StatefulSchedule):
      schedules[name] = value
    elif callable(value):
      schedules[name] = WrappedSchedule(value)
    elif isinstance(value, (int, float, np.ndarray, jax.Array)):
      numbers[name] = value
    else:
      others[name] = value
  return schedules, numbers, others


def _factory_signature(inner_factory, static_args: str | Iterable[str]
                       ) -> tuple[inspect.Signature, set[str]]:
  """``inner_factory``'s signature and the static argument names as a set,
  checked to be parameters of it."""
  static_args = {static_args} if isinstance(static_args, str) else set(static_args)
  signature = inspect.signature(inner_factory)
  unknown = static_args - set(signature.parameters)
  if unknown:
    raise ValueError(
        f"static_args {sorted(unknown)} are not parameters of"
        f" {getattr(inner_factory, '__name__', inner_factory)}; its parameters"
        f" are {list(signature.parameters)}"
    )
  return signature, static_args


def inject_hyperparams(
    inner_factory: Callable[..., base.GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype=None,
) -> Callable[..., base.GradientTransformationExtraArgs]:
  """Wraps ``inner_factory`` so its numeric arguments become state.

  The returned factory builds a transformation whose state holds the
  hyperparameters (``state.hyperparams``): numbers can be changed between
  steps, and any numeric argument may be a schedule instead. Each update
  evaluates every schedule on its current state (and the update's extra
  arguments), then advances that state; a plain schedule sees the step count.

  Args:
    inner_factory: builds the inner transformation from hyperparameters,
      e.g. ``shardopt.adam``.
    static_args: names of arguments that are callables but not schedules (or
      otherwise must stay Python values); a name that is not a parameter of
      ``inner_factory`` raises ValueError.
    hyperparam_dtype: dtype of the floating hyperparameters; ``None``
      (default) uses the widest floating dtype of the params.

  Returns:
    A factory with ``inner_factory``'s signature that accepts a schedule
    (``count -> value``) or a ``StatefulSchedule`` wherever a number is
    expected and returns a ``GradientTransformationExtraArgs`` whose state is
    an ``InjectStatefulHyperparamsState``.

  References:
    optax's ``inject_hyperparams``.
  """
  signature, static_args = _factory_signature(inner_factory, static_args)

  @functools.wraps(inner_factory)
  def factory(*args, **kwargs) -> base.GradientTransformationExtraArgs:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    schedules, numbers, others = _split_arguments(bound, static_args)

    def init_fn(params):
      dtype = hyperparam_dtype or _highest_float_dtype(params)
      hyperparams = {k: jnp.asarray(_as_hyperparam(v, dtype)) for k, v in numbers.items()}
      states = {k: f.init() for k, f in schedules.items()}
      hyperparams.update({k: _as_hyperparam(f(states[k]), dtype) for k, f in schedules.items()})
      inner = inner_factory(**others, **hyperparams)
      return InjectStatefulHyperparamsState(
          jnp.zeros([], jnp.int32), hyperparams, states, inner.init(params))

    def update_fn(updates, state, params=None, **extra_args):
      dtype = hyperparam_dtype or _highest_float_dtype(params)
      hyperparams = {k: _as_hyperparam(v, dtype) for k, v in state.hyperparams.items()}
      hyperparams.update({
          k: _as_hyperparam(f(state.hyperparams_states[k], **extra_args), dtype)
          for k, f in schedules.items()})
      states = {k: f.update(state.hyperparams_states[k], **extra_args)
                for k, f in schedules.items()}
      inner = base.with_extra_args_support(inner_factory(**others, **hyperparams))
      updates, inner_state = inner.update(updates, state.inner_state, params, **extra_args)
      return updates, InjectStatefulHyperparamsState(
          numerics.safe_increment(state.count), hyperparams, states, inner_state)

    return base.GradientTransformationExtraArgs(init_fn, update_fn)

  return factory


def inject_stateful_hyperparams(
    inner_factory: Callable[..., base.GradientTransformation],
    static_args: str | Iterable[str] = (),
    hyperparam_dtype=None,
) -> Callable[..., base.GradientTransformationExtraArgs]:
  """Deprecated (as in optax since 0.1.9): ``inject_hyperparams`` takes
  stateful schedules.

  Args:
    inner_factory: as for ``inject_hyperparams``.
    static_args: as for ``inject_hyperparams``.
    hyperparam_dtype: as for ``inject_hyperparams``.

  Returns:
    ``inject_hyperparams(inner_factory, static_args, hyperparam_dtype)``,
    after a ``DeprecationWarning``.

  References:
    optax's ``inject_stateful_hyperparams``.
  """
  warnings.warn("inject_stateful_hyperparams is deprecated, use inject_hyperparams instead",
                DeprecationWarning, stacklevel=2)
  return inject_hyperparams(inner_factory, static_args, hyperparam_dtype)
