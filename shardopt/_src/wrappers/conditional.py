"""Running a transformation only when a condition holds.

The condition is evaluated on device (``lax.cond``), so these wrappers jit and
the skipped branch costs nothing on one device.
"""

import functools
from typing import Any
from typing import NamedTuple
from typing import Protocol

import jax
from jax import lax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math

__all__ = [
    "ApplyIfFiniteState",
    "ConditionFn",
    "ConditionallyMaskState",
    "ConditionallyTransformState",
    "apply_if_finite",
    "conditionally_mask",
    "conditionally_transform",
    "skip_large_updates",
    "skip_not_finite",
]


class ConditionFn(Protocol):
  """``fn(step, **extra_args) -> bool[]``: whether to run the inner update."""

  def __call__(self, step: jax.typing.ArrayLike, **extra_args: Any
               ) -> jax.typing.ArrayLike:
    ...


class ConditionallyTransformState(NamedTuple):
  """The inner state and the number of updates seen so far."""

  inner_state: Any
  step: jax.Array  # int32 scalar


class ConditionallyMaskState(NamedTuple):
  """The number of updates seen so far and the inner state."""

  step: jax.Array  # int32 scalar
  inner_state: base.OptState


def _cond_update(inner, condition, updates, inner_state, params, extra_args,
                 otherwise):
  """The inner update where ``condition``, else ``(otherwise, inner_state)``."""
  return lax.cond(
      condition,
      lambda: inner.update(updates, inner_state, params, **extra_args),
      lambda: (otherwise, inner_state),
  )


def conditionally_transform(
    inner: base.GradientTransformation,
    should_transform_fn: ConditionFn,
    forward_extra_args: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Runs ``inner`` at the steps where ``should_transform_fn(step)`` holds.

  At the other steps the updates and the inner state pass through
  unchanged. ``step`` counts the updates seen so far (0 at the first).

  Args:
    inner: the transformation to run conditionally.
    should_transform_fn: ``(step, **extra_args) -> bool scalar``.
    forward_extra_args: whether the update's extra arguments are passed to
      ``should_transform_fn`` (default False).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ConditionallyTransformState``.

  References:
    optax's ``conditionally_transform``.
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    return ConditionallyTransformState(
        inner_state=inner.init(params), step=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, **extra_args):
    condition = should_transform_fn(
        state.step, **(extra_args if forward_extra_args else {}))
    updates, inner_state = _cond_update(
        inner, condition, updates, state.inner_state, params, extra_args,
        otherwise=updates)
    return updates, ConditionallyTransformState(
        inner_state, numerics.safe_increment(state.step))

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def conditionally_mask(
    inner: base.GradientTransformation,
    should_transform_fn: ConditionFn,
    forward_extra_args: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Runs ``inner`` where ``should_transform_fn(step)`` holds, zeros the updates elsewhere.

  At the other steps the updates are zeroed and the inner state is kept.

  Args:
    inner: the transformation to run conditionally.
    should_transform_fn: ``(step, **extra_args) -> bool scalar``.
    forward_extra_args: whether the update's extra arguments are passed to
      ``should_transform_fn`` (default False).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ConditionallyMaskState``.

  References:
    optax's ``conditionally_mask``.
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    return ConditionallyMaskState(
        step=jnp.zeros([], jnp.int32), inner_state=inner.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    condition = should_transform_fn(
        state.step, **(extra_args if forward_extra_args else {}))
    updates, inner_state = _cond_update(
        inner, condition, updates, state.inner_state, params, extra_args,
        otherwise=tree_math.tree_zeros_like(updates))
    return updates, ConditionallyMaskState(
        step=numerics.safe_increment(state.step), inner_state=inner_state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


class ApplyIfFiniteState(NamedTuple):
  """Counts of non-finite updates and the inner state.

  ``notfinite_count``: consecutive non-finite updates (reset by a finite one);
  ``last_finite``: whether the last update was finite; ``total_notfinite``:
  all non-finite updates so far.
  """

  notfinite_count: jax.Array
  last_finite: jax.Array
  total_notfinite: jax.Array
  inner_state: Any


def _all_finite(updates: Any) -> jax.Array:
  checks = [jnp.all(jnp.isfinite(u)) for u in jax.tree.leaves(updates)]
  return functools.reduce(jnp.logical_and, checks, jnp.array(True))


def apply_if_finite(
    inner: base.GradientTransformation, max_consecutive_errors: int
) -> base.GradientTransformationExtraArgs:
  """Skips (zeros) updates containing NaN or Inf, keeping the inner state.

  A non-finite update leaves the inner state as it was and returns zeros;
  once more than ``max_consecutive_errors`` arrive in a row it gives up and
  applies them.

  Args:
    inner: the transformation to protect.
    max_consecutive_errors: how many non-finite updates in a row are
      skipped.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is an
    ``ApplyIfFiniteState`` (consecutive and total non-finite counts, whether
    the last update was finite, the inner state).

  References:
    The skipped step of dynamic loss scaling, Micikevicius et al., "Mixed
    Precision Training", ICLR 2018 (https://arxiv.org/abs/1710.03740).
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    return ApplyIfFiniteState(
        notfinite_count=jnp.zeros([], jnp.int32),
        last_finite=jnp.array(True),
        total_notfinite=jnp.zeros([], jnp.int32),
        inner_state=inner.init(params))

  def update_fn(updates, state, params=None, **extra_args):
    finite = _all_finite(updates)
    notfinite_count = jnp.where(
        finite, jnp.zeros_like(state.notfinite_count),
        numerics.safe_increment(state.notfinite_count))
    apply = jnp.logical_or(finite, notfinite_count > max_consecutive_errors)
    updates, inner_state = _cond_update(
        inner, apply, updates, state.inner_state, params, extra_args,
        otherwise=tree_math.tree_zeros_like(updates))
    total = jnp.where(finite, state.total_notfinite,
                      numerics.safe_increment(state.total_notfinite))
    return updates, ApplyIfFiniteState(
        notfinite_count=notfinite_count, last_finite=finite,
        total_notfinite=total, inner_state=inner_state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def skip_not_finite(
    updates: base.Updates, gradient_step: jax.typing.ArrayLike,
    params: base.Params | None,
) -> tuple[jax.Array, dict]:
  """A ``MultiSteps`` skip test: skip when any update is NaN or Inf.

  Args:
    updates: the updates of the step.
    gradient_step: the step count (unused).
    params: the params (unused).

  Returns:
    ``(should_skip, {"should_skip": ..., "num_not_finite": ...})``: a bool
    scalar and the number of non-finite elements.
  """
  del gradient_step, params
  counts = [jnp.sum(~jnp.isfinite(u)) for u in jax.tree.leaves(updates)]
  num_not_finite = sum(counts, jnp.zeros([], jnp.int32))
  should_skip = num_not_finite > 0
  return should_skip, {"should_skip": should_skip,
                       "num_not_finite": num_not_finite}


def skip_large_updates(
    updates: base.Updates, gradient_step: jax.typing.ArrayLike,
    params: base.Params | None, max_squared_norm: jax.typing.ArrayLike,
) -> tuple[jax.Array, dict]:
  """A ``MultiSteps`` skip test: skip unless the updates' squared norm is small.

  Skips when the squared global norm is not below ``max_squared_norm`` (a
  NaN norm is skipped too); bind ``max_squared_norm`` with
  ``functools.partial``.

  Args:
    updates: the updates of the step.
    gradient_step: the step count (unused).
    params: the params (unused).
    max_squared_norm: the bound of the squared global norm.

  Returns:
    ``(should_skip, {"should_skip": ..., "norm_squared": ...})``.
  """
  del gradient_step, params
  norm_squared = sum((jnp.sum(numerics.abs_sq(u))
                      for u in jax.tree.leaves(updates)), jnp.zeros([]))
  should_skip = jnp.logical_not(norm_squared < max_squared_norm)
  return should_skip, {"should_skip": should_skip,
                       "norm_squared": norm_squared}
