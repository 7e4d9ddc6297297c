"""Accumulating gradients over several mini-steps before applying them."""

from typing import Any
from typing import Callable
from typing import NamedTuple
from typing import Protocol

import jax
from jax import lax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math

__all__ = [
    "ApplyEvery",
    "MultiSteps",
    "MultiStepsState",
    "ShouldSkipUpdateFunction",
    "apply_every",
]


class ApplyEvery(NamedTuple):
  """The position in the current window of k steps and the gradient sum."""

  count: jax.Array  # int32 scalar
  grad_acc: base.Updates


def apply_every(k: int = 1) -> base.GradientTransformation:
  """Sums the updates of ``k`` steps and emits the sum on the k-th, zeros before.

  Transformations chained before it still update their state every step;
  use ``MultiSteps`` to hold the whole optimizer between applications.

  Args:
    k: the number of steps summed (default 1).

  Returns:
    A ``GradientTransformation`` whose state is an ``ApplyEvery`` (count and
    the running sum).

  References:
    Gradient accumulation ("delayed updates") as in Ott et al., "Scaling
    Neural Machine Translation", WMT 2018
    (https://arxiv.org/abs/1806.00187).
  """

  def init_fn(params):
    return ApplyEvery(count=jnp.zeros([], jnp.int32),
                      grad_acc=tree_math.tree_zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    position = state.count % k
    keep = position != 0  # the first step of a window drops the old sum
    grad_acc = jax.tree.map(lambda g, acc: keep * acc + g, updates,
                            state.grad_acc)
    emit = position == k - 1
    updates = jax.tree.map(lambda acc: emit * acc, grad_acc)
    count = numerics.safe_increment(state.count) % k
    return updates, ApplyEvery(count=count, grad_acc=grad_acc)

  return base.GradientTransformation(init_fn, update_fn)


class ShouldSkipUpdateFunction(Protocol):
  """``fn(updates, gradient_step, params) -> (should_skip, skip_state)``.

  ``should_skip`` is a bool scalar; ``skip_state`` (any tree, e.g. debugging
  counts) is stored in ``MultiStepsState.skip_state``.
  """

  def __call__(self, updates: base.Updates, gradient_step: jax.typing.ArrayLike,
               params: base.Params | None) -> tuple[jax.Array, Any]:
    ...


class MultiStepsState(NamedTuple):
  """State of ``MultiSteps``.

  ``mini_step``: mini-steps accumulated in the current gradient step;
  ``gradient_step``: inner updates applied so far; ``inner_opt_state``: the
  wrapped optimizer's state; ``acc_grads``: the accumulated gradients;
  ``skip_state``: what ``should_skip_update_fn`` last returned.
  """

  mini_step: jax.Array
  gradient_step: jax.Array
  inner_opt_state: Any
  acc_grads: Any
  skip_state: Any = ()


def _never_skip(updates, gradient_step, params):
  del updates, gradient_step, params
  return jnp.array(False), ()


class MultiSteps:
  """Wraps an optimizer to apply it once every k mini-steps.

  Each ``update`` adds the gradients to an accumulator (their running mean,
  or sum with ``use_grad_mean=False``) and returns zeros; the k-th passes the
  accumulated gradients to the inner optimizer and returns its updates. A
  mini-step for which ``should_skip_update_fn`` returns True (see
  ``skip_not_finite``, ``skip_large_updates``) leaves the state as if it had
  not happened. Use ``MultiSteps(...).gradient_transformation()`` where a
  ``GradientTransformation`` is expected.

  A non-finite gradient reaches only the update its gradient step emits:
  the updates between emits are zeros and each emit starts the accumulator
  again from zeros, where optax multiplies by 0 and keeps the nan (every
  update of optax's after it, the zeros included, is nan).

  Args:
    opt: the inner optimizer.
    every_k_schedule: k, an int or a function of the gradient step (varying
      the effective batch size).
    use_grad_mean: whether the accumulator holds the mean (default True) or
      the sum of the mini-step gradients.
    should_skip_update_fn: ``fn(updates, gradient_step, params) ->
      (should_skip, skip_state)``; ``None`` (default) never skips.
    accumulator_dtype: dtype of the accumulated gradients (default float32;
      ``None`` keeps the gradients' dtype).

  References:
    gradient accumulation ("delayed updates") as in Ott et al., "Scaling
    Neural Machine Translation", WMT 2018
    (https://arxiv.org/abs/1806.00187).
  """

  def __init__(
      self,
      opt: base.GradientTransformation,
      every_k_schedule: int | Callable[[jax.Array], jax.typing.ArrayLike],
      use_grad_mean: bool = True,
      should_skip_update_fn: ShouldSkipUpdateFunction | None = None,
      accumulator_dtype: Any = jnp.float32,
  ):
    self._opt = base.with_extra_args_support(opt)
    if callable(every_k_schedule):
      self._every_k_schedule = every_k_schedule
    else:
      self._every_k_schedule = lambda step: every_k_schedule
    self._use_grad_mean = use_grad_mean
    self._should_skip_update_fn = should_skip_update_fn or _never_skip
    self._accumulator_dtype = (
        None if accumulator_dtype is None
        else jax.dtypes.canonicalize_dtype(accumulator_dtype))

  @property
  def inner_opt(self) -> base.GradientTransformationExtraArgs:
    return self._opt

  def init(self, params: base.Params) -> MultiStepsState:
    gradient_step = jnp.zeros([], jnp.int32)
    _, skip_state = self._should_skip_update_fn(
        tree_math.tree_zeros_like(params), gradient_step, params)
    return MultiStepsState(
        mini_step=jnp.zeros([], jnp.int32),
        gradient_step=gradient_step,
        inner_opt_state=self._opt.init(params),
        acc_grads=tree_math.tree_zeros_like(params, dtype=self._accumulator_dtype),
        skip_state=skip_state)

  def _accumulate(self, grad, acc, count):
    if self._use_grad_mean:  # Welford's running mean
      return acc + (grad - acc) / (count + 1)
    return acc + grad

  def update(self, updates: base.Updates, state: MultiStepsState,
             params: base.Params | None = None, **extra_args: Any
             ) -> tuple[base.Updates, MultiStepsState]:
    """Accumulates ``updates``; every k-th call applies the inner optimizer."""
    k = self._every_k_schedule(state.gradient_step)
    should_skip, skip_state = self._should_skip_update_fn(
        updates, state.gradient_step, params)
    should_skip = jnp.asarray(should_skip)
    if (should_skip.dtype, should_skip.shape) != (jnp.bool_, ()):
      raise ValueError(
          "should_skip_update_fn must return a bool scalar as its first"
          f" output, got dtype {should_skip.dtype} and shape"
          f" {should_skip.shape}")

    def inner_update(grads):
      return self._opt.update(grads, state.inner_opt_state, params,
                              **extra_args)

    acc_grads = jax.tree.map(
        lambda g, acc: self._accumulate(g, acc, state.mini_step),
        updates, state.acc_grads)
    acc_as_updates = tree_math.tree_cast_like(acc_grads, updates)
    # The inner updates' dtypes, to return zeros of them on the other steps.
    out_avals, _ = jax.eval_shape(inner_update, acc_as_updates)
    zeros = jax.tree.map(lambda u, aval: jnp.zeros_like(u, dtype=aval.dtype),
                         updates, out_avals)

    def emit():
      new_updates, inner_state = inner_update(acc_as_updates)
      inner_state = jax.tree.map(lambda new, old: new.astype(old.dtype),
                                 inner_state, state.inner_opt_state)
      return new_updates, MultiStepsState(
          mini_step=jnp.zeros_like(state.mini_step),
          gradient_step=numerics.safe_increment(state.gradient_step),
          inner_opt_state=inner_state,
          acc_grads=tree_math.tree_zeros_like(state.acc_grads),
          skip_state=skip_state)

    def accumulate():
      return zeros, state._replace(
          mini_step=numerics.safe_increment(state.mini_step),
          acc_grads=tree_math.tree_cast_like(acc_grads, state.acc_grads),
          skip_state=skip_state)

    def skip():
      return zeros, state._replace(skip_state=skip_state)

    branch = jnp.where(should_skip, 2,
                       jnp.where(state.mini_step >= k - 1, 0, 1))
    return lax.switch(branch, [emit, accumulate, skip])

  def has_updated(self, state: MultiStepsState | Any) -> jax.Array:
    """Whether the last ``update`` applied the inner optimizer."""
    return jnp.logical_and(state.mini_step == 0, state.gradient_step > 0)

  def gradient_transformation(self) -> base.GradientTransformationExtraArgs:
    """This wrapper as a plain (init, update) transformation."""
    return base.GradientTransformationExtraArgs(self.init, self.update)
