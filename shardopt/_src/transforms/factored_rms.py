"""Adafactor's factored estimate of the gradients' root mean square.

For a param with two dimensions of at least ``min_dim_size_to_factor``, the
second moment is kept as two reductions of the squared gradient: its mean over
the largest dimension (``v_row``) and over the second largest (``v_col``).
Both are built as reductions of the param, so each keeps the mesh axes of the
dimensions it does not reduce. Other params keep a full second moment ``v``.
Unused slots hold shape-(1,) zeros, as in optax, derived from the param too.

Reference: Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
Memory Cost", 2018 (https://arxiv.org/abs/1804.04235).
"""

from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics

__all__ = [
    "FactoredState",
    "scale_by_factored_rms",
]


@moments.declare_moments(v_row=moments.NONNEGATIVE, v_col=moments.NONNEGATIVE,
                         v=moments.NONNEGATIVE)
class FactoredState(NamedTuple):
  """Step count and the per-param second-moment statistics."""

  count: jax.Array  # int32 scalar, updates applied so far
  v_row: base.Updates  # factored params: mean over the largest dimension
  v_col: base.Updates  # factored params: mean over the second largest one
  v: base.Updates  # params not factored: the full second moment


def _decay_rate_pow(step, exponent=0.8) -> jax.Array:
  """Adafactor's decay schedule: 1 - (step + 1) ** -exponent."""
  t = jnp.asarray(step + 1, jnp.float32)
  return 1.0 - t ** (-exponent)


def _factored_dims(shape, factored: bool, min_dim_size: int):
  """(second largest, largest) dimension to factor over, or None.

  Ties keep the lower axis first (a stable sort), like optax.
  """
  if not factored or len(shape) < 2:
    return None
  by_size = sorted(range(len(shape)), key=lambda axis: shape[axis])
  second, largest = by_size[-2], by_size[-1]
  if shape[second] < min_dim_size:
    return None
  return second, largest


def _reduced_zeros(param: jax.Array, axis=None) -> jax.Array:
  """Zeros shaped like ``param`` summed over ``axis`` (sharding kept)."""
  return jnp.zeros_like(param).sum(axis=axis)


def _placeholder(param: jax.Array) -> jax.Array:
  """Shape-(1,) zeros in the param's dtype for an unused statistic."""
  return _reduced_zeros(param).reshape(1)


def _split(like, tuples, n: int) -> tuple:
  """A tree (shaped like ``like``) of n-tuples -> n trees."""
  outer = jax.tree.structure(like)
  if outer.num_leaves == 0:  # e.g. tree_map_params' stand-in for the params
    return (tuples,) * n
  inner = jax.tree.structure((0,) * n)
  return jax.tree.transpose(outer, inner, tuples)


def scale_by_factored_rms(
    factored: bool = True,
    decay_rate: jax.typing.ArrayLike = 0.8,
    step_offset: jax.typing.ArrayLike = 0,
    min_dim_size_to_factor: int = 128,
    epsilon: jax.typing.ArrayLike = 1e-30,
    decay_rate_fn: Callable[
        [jax.typing.ArrayLike, jax.typing.ArrayLike], jax.typing.ArrayLike
    ] = _decay_rate_pow,
) -> base.GradientTransformation:
  """Divides updates by a (factored) estimate of their root mean square.

  With ``decay = decay_rate_fn(count - step_offset, decay_rate)``, a param
  with two dimensions of at least ``min_dim_size_to_factor`` keeps the EMAs
  of ``g**2 + epsilon`` averaged over its largest dimension (``v_row``) and
  its second largest (``v_col``) and divides by ``sqrt`` of their outer
  product over the mean of ``v_row``; other params keep a full EMA ``v`` and
  divide by ``sqrt(v)``. ``params`` are optional in ``update``: shapes come
  from the updates and the statistics keep the dtype they were initialised
  with (the param's).

  Args:
    factored: whether to factor the second moment of matrices and tensors
      (default True).
    decay_rate: argument of ``decay_rate_fn`` (the default's exponent, 0.8).
    step_offset: subtracted from the step count before ``decay_rate_fn``
      (the first step of a fine-tuning phase; default 0).
    min_dim_size_to_factor: factor only when two dimensions are at least
      this large (default 128).
    epsilon: added to the squared gradients (default 1e-30).
    decay_rate_fn: ``(step, decay_rate) -> decay`` of the second moment;
      defaults to ``1 - (step + 1) ** -decay_rate``.

  Returns:
    A ``GradientTransformation`` whose state is a ``FactoredState`` (count,
    v_row, v_col, v).

  References:
    Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
    Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235).
  """

  def dims_of(shape):
    return _factored_dims(shape, factored, min_dim_size_to_factor)

  def init_leaf(param):
    dims = dims_of(param.shape)
    if dims is None:
      return _placeholder(param), _placeholder(param), jnp.zeros_like(param)
    second, largest = dims
    return (
        _reduced_zeros(param, largest),
        _reduced_zeros(param, second),
        _placeholder(param),
    )

  def init_fn(params):
    v_row, v_col, v = _split(params, jax.tree.map(init_leaf, params), 3)
    return FactoredState(jnp.zeros([], jnp.int32), v_row, v_col, v)

  def update_leaf(grad, v_row, v_col, v, decay):
    grad_sq = numerics.abs_sq(grad) + epsilon
    dims = dims_of(grad.shape)
    if dims is None:
      new_v = (decay * v + (1.0 - decay) * grad_sq).astype(v.dtype)
      return grad * new_v ** -0.5, v_row, v_col, new_v
    second, largest = dims
    new_row = decay * v_row + (1.0 - decay) * jnp.mean(grad_sq, axis=largest)
    new_col = decay * v_col + (1.0 - decay) * jnp.mean(grad_sq, axis=second)
    new_row = new_row.astype(v_row.dtype)
    new_col = new_col.astype(v_col.dtype)
    # v_row lost `largest`; where does `second` sit among its axes?
    second_in_row = second - 1 if second > largest else second
    row_mean = jnp.mean(new_row, axis=second_in_row, keepdims=True)
    row_factor = jnp.expand_dims((new_row / row_mean) ** -0.5, largest)
    col_factor = jnp.expand_dims(new_col ** -0.5, second)
    return grad * row_factor * col_factor, new_row, new_col, v

  def update_fn(updates, state, params=None):
    del params
    decay = decay_rate_fn(state.count - step_offset, decay_rate)
    results = jax.tree.map(
        lambda g, *stats: update_leaf(g, *stats, decay),
        updates, state.v_row, state.v_col, state.v,
    )
    new_updates, v_row, v_col, v = _split(updates, results, 4)
    count = numerics.safe_increment(state.count)
    return new_updates, FactoredState(count, v_row, v_col, v)

  return base.GradientTransformation(init_fn, update_fn)
