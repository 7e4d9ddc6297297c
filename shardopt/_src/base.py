"""The gradient-transformation protocol: a pair of pure functions, init and update.

A transformation's ``init(params)`` builds its state from the params, and
``update(updates, state, params=None, **extra_args)`` returns the transformed
updates and the new state. The protocol matches optax's, so a shardopt
transformation works wherever an optax one does (Flax ``TrainState``,
``nnx.Optimizer``) and optax transformations can be chained with ours.

State is always built from the params with shape- and sharding-preserving
operations (``zeros_like``, reductions of a param), so the shardings of the
state can be derived by tracing ``init`` on sharded abstract params.
"""

from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Protocol
from typing import runtime_checkable

import jax
import jax.numpy as jnp

__all__ = [
    "MaskOrFn",
    "EmptyState",
    "GradientTransformation",
    "GradientTransformationExtraArgs",
    "OptState",
    "Params",
    "ScalarOrSchedule",
    "Schedule",
    "StatefulSchedule",
    "TransformInitFn",
    "TransformUpdateExtraArgsFn",
    "TransformUpdateFn",
    "Updates",
    "identity",
    "init_empty_state",
    "set_to_zero",
    "stateless",
    "stateless_with_tree_map",
    "supports_extra_args",
    "value_at",
    "with_extra_args_support",
]

Params = Any


Updates = Any


OptState = Any


Schedule = Callable[[jax.typing.ArrayLike], jax.typing.ArrayLike]


ScalarOrSchedule = float | jax.Array | Schedule


@runtime_checkable
class StatefulSchedule(Protocol):
  """A schedule that keeps a state (e.g. reads the loss through extra args).

  ``inject_hyperparams`` calls ``init()`` once, then each step
  ``__call__(state, **extra_args)`` for the value and
  ``update(state, **extra_args)`` for the next state.
  """

  def init(self) -> Any:
    """The schedule's initial state."""

  def update(self, state: Any, **extra_args) -> Any:
    """The state after one more step."""

  def __call__(self, state: Any, **extra_args) -> jax.typing.ArrayLike:
    """The hyperparameter's value in ``state``."""

# A mask: a tree of bools with the params' structure (or a prefix of it), a
# function of the params returning one, or None for "no mask".
MaskOrFn = Any | Callable[[Params], Any] | None


def value_at(hyperparam: ScalarOrSchedule, count) -> jax.typing.ArrayLike:
  """A scalar-or-schedule hyperparameter's value at step ``count``.

  Args:
    hyperparam: a number/array, or a schedule (a function of the count).
    count: the step count passed to a schedule.

  Returns:
    ``hyperparam(count)`` for a schedule, else ``hyperparam`` itself.
  """
  return hyperparam(count) if callable(hyperparam) else hyperparam


class TransformInitFn(Protocol):
  """Builds the state of a transformation from the params."""

  def __call__(self, params: Params) -> OptState:
    ...


class TransformUpdateFn(Protocol):
  """Transforms updates given the state and, optionally, the params."""

  def __call__(
      self, updates: Updates, state: OptState, params: Params | None = None
  ) -> tuple[Updates, OptState]:
    ...


class TransformUpdateExtraArgsFn(Protocol):
  """An update function that also takes keyword arguments (value, grad, ...)."""

  def __call__(
      self,
      updates: Updates,
      state: OptState,
      params: Params | None = None,
      **extra_args: Any,
  ) -> tuple[Updates, OptState]:
    ...


class GradientTransformation(NamedTuple):
  """A pair of pure functions ``(init, update)``; unpackable and indexable."""

  init: TransformInitFn
  update: TransformUpdateFn


class GradientTransformationExtraArgs(GradientTransformation):
  """A transformation whose ``update`` accepts extra keyword arguments."""

  update: TransformUpdateExtraArgsFn


class EmptyState(NamedTuple):
  """The state of a transformation that keeps none."""


def init_empty_state(params: Params) -> EmptyState:
  """``init`` of a stateless transformation.

  Args:
    params: the params (unused).

  Returns:
    An ``EmptyState``.
  """
  del params
  return EmptyState()


# optax's class of the same contract (optax is not imported at run time).
_FOREIGN_EXTRA_ARGS = "optax._src.base.GradientTransformationExtraArgs"


def supports_extra_args(tx: Any) -> bool:
  """Whether ``tx.update`` accepts extra keyword arguments: shardopt's
  ``GradientTransformationExtraArgs`` or optax's (by its module and class)."""
  cls = type(tx)
  return (isinstance(tx, GradientTransformationExtraArgs)
          or f"{cls.__module__}.{cls.__qualname__}" == _FOREIGN_EXTRA_ARGS)


def with_extra_args_support(
    tx: GradientTransformation,
) -> GradientTransformationExtraArgs:
  """Wraps ``tx`` so that its ``update`` accepts and ignores extra arguments.

  Works for foreign (optax) transformations too: anything with ``init`` and
  ``update``. A transformation that already supports extra arguments keeps
  its own ``update``.

  Args:
    tx: the transformation.

  Returns:
    A ``GradientTransformationExtraArgs`` with ``tx``'s init and state.

  References:
    optax's ``with_extra_args_support``.
  """
  if supports_extra_args(tx):
    return GradientTransformationExtraArgs(tx.init, tx.update)

  def update_fn(updates, state, params=None, **extra_args):
    del extra_args
    return tx.update(updates, state, params)

  return GradientTransformationExtraArgs(tx.init, update_fn)


def stateless(
    f: Callable[[Updates, Params | None], Updates],
) -> GradientTransformation:
  """A stateless transformation from ``f(updates, params) -> updates``.

  Args:
    f: maps the whole updates tree and the params (or None) to the new
      updates.

  Returns:
    A ``GradientTransformation`` whose state is an ``EmptyState``.

  References:
    optax's ``stateless``.
  """

  def update_fn(updates, state, params=None):
    return f(updates, params), state

  return GradientTransformation(init_empty_state, update_fn)


def stateless_with_tree_map(
    f: Callable[[jax.Array, jax.Array | None], jax.Array],
) -> GradientTransformation:
  """A stateless transformation applying ``f(update, param)`` leaf by leaf.

  Args:
    f: maps one update leaf and its param leaf (None when ``update`` gets no
      params) to the new update leaf.

  Returns:
    A ``GradientTransformation`` whose state is an ``EmptyState``.

  References:
    optax's ``stateless_with_tree_map``.
  """

  def tree_f(updates, params):
    if params is None:
      return jax.tree.map(lambda u: f(u, None), updates)
    return jax.tree.map(f, updates, params)

  return stateless(tree_f)


def identity() -> GradientTransformation:
  """Leaves the updates untouched.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    optax's ``identity``.
  """
  return GradientTransformation(
      init_empty_state, lambda updates, state, params=None: (updates, state)
  )


def set_to_zero() -> GradientTransformation:
  """Maps every update to zero (e.g. to freeze params inside a partition).

  Returns:
    A stateless ``GradientTransformation``.

  References:
    optax's ``set_to_zero``.
  """

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(jnp.zeros_like, updates), state

  return GradientTransformation(init_empty_state, update_fn)
