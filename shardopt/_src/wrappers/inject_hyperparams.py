"""Hyperparameters kept in the optimizer state, so they can change between steps.

``inject_hyperparams(shardopt.adam)(learning_rate=schedule, b1=0.9)`` builds an
optimizer whose numeric hyperparameters live in ``state.hyperparams``: a
schedule is evaluated at the step count before every update, and a constant
can be overwritten by the user between steps
(``state.hyperparams['b1'] = 0.8``). The hyperparameters are scalars, so their
derived shardings replicate, and they are checkpointed with the rest of the
state.
"""

import functools
import inspect
from typing import Any
from typing import Callable
from typing import Iterable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from shardopt._src import base
from shardopt._src import numerics

__all__ = [
    "InjectHyperparamsState",
    "as_hyperparam",
    "factory_signature",
    "highest_float_dtype",
    "inject_hyperparams",
    "split_arguments",
]


class InjectHyperparamsState(NamedTuple):
  """Step count, current hyperparameter values and the inner state."""

  count: jax.Array
  hyperparams: dict[str, jax.Array]
  inner_state: base.OptState


def highest_float_dtype(params: Any):
  """The widest floating dtype among the params (float32 when there is none)."""
  dtypes = [
      jnp.asarray(x).dtype
      for x in jax.tree.leaves(params)
      if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
  ]
  if not dtypes:
    return jnp.dtype(jnp.float32)
  return functools.reduce(jnp.promote_types, dtypes)


def as_hyperparam(value, dtype) -> jax.Array:
  """Floats (and weakly typed arrays) in ``dtype``; strong dtypes unchanged."""
  if isinstance(value, jax.Array) and not value.weak_type:
    return value
  if jnp.issubdtype(jnp.asarray(value).dtype, jnp.floating):
    return jnp.asarray(value, dtype)
  return jnp.asarray(value)


def split_arguments(bound: inspect.BoundArguments, static_args: set[str]):
  """Sorts the factory's arguments into schedules, numbers and the rest."""
  schedules, numbers, others = {}, {}, {}
  for name, value in bound.arguments.items():
    if name in static_args or isinstance(value, bool):
      others[name] = value
    elif callable(value):
      schedules[name] = value
    elif isinstance(value, (int, float, np.ndarray, jax.Array)):
      numbers[name] = value
    else:
      others[name] = value
  return schedules, numbers, others


def factory_signature(inner_factory, static_args: str | Iterable[str]
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
  steps, and a schedule given for any numeric argument is evaluated at the
  step count before each update.

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
    (``count -> value``) wherever a number is expected and returns a
    ``GradientTransformationExtraArgs`` whose state is an
    ``InjectHyperparamsState``.

  References:
    optax's ``inject_hyperparams``.
  """
  signature, static_args = factory_signature(inner_factory, static_args)

  @functools.wraps(inner_factory)
  def factory(*args, **kwargs) -> base.GradientTransformationExtraArgs:
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    schedules, numbers, others = split_arguments(bound, static_args)

    def current_hyperparams(stored, count, dtype):
      values = {k: as_hyperparam(v, dtype) for k, v in stored.items()}
      values.update(
          {k: as_hyperparam(f(count), dtype) for k, f in schedules.items()}
      )
      return values

    def init_fn(params):
      count = jnp.zeros([], jnp.int32)
      dtype = hyperparam_dtype or highest_float_dtype(params)
      hyperparams = current_hyperparams(numbers, count, dtype)
      inner = inner_factory(**others, **hyperparams)
      return InjectHyperparamsState(count, hyperparams, inner.init(params))

    def update_fn(updates, state, params=None, **extra_args):
      dtype = hyperparam_dtype or highest_float_dtype(params)
      numeric_now = {k: v for k, v in state.hyperparams.items() if k not in schedules}
      hyperparams = current_hyperparams(numeric_now, state.count, dtype)
      inner = base.with_extra_args_support(inner_factory(**others, **hyperparams))
      updates, inner_state = inner.update(
          updates, state.inner_state, params, **extra_args
      )
      return updates, InjectHyperparamsState(
          numerics.safe_increment(state.count), hyperparams, inner_state
      )

    return base.GradientTransformationExtraArgs(init_fn, update_fn)

  return factory
