"""Accumulating past updates: momentum traces, exponential moving averages."""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math

__all__ = [
    "EmaState",
    "TraceState",
    "canonical_dtype",
    "ema",
    "trace",
]


def canonical_dtype(dtype) -> Any:
  """The canonical jax dtype of ``dtype`` (None stays None)."""
  return None if dtype is None else jax.dtypes.canonicalize_dtype(dtype)


@moments.declare_moments(trace=moments.SIGNED)
class TraceState(NamedTuple):
  """The decayed sum of past updates."""

  trace: base.Params


def trace(
    decay: jax.typing.ArrayLike,
    nesterov: bool = False,
    accumulator_dtype: Any | None = None,
) -> base.GradientTransformation:
  """Momentum: a decayed sum of past updates.

  ``t = g + decay * t``; the output is the new ``t``, or ``g + decay * t``
  with ``nesterov``.

  Args:
    decay: the decay of the trace.
    nesterov: whether to use Nesterov momentum (default False).
    accumulator_dtype: storage dtype of the trace; ``None`` (default) uses
      the params' dtype.

  Returns:
    A ``GradientTransformation`` whose state is a ``TraceState``.

  References:
    Polyak, "Some methods of speeding up the convergence of iteration
    methods", USSR Comput. Math. Math. Phys. 1964
    (https://doi.org/10.1016/0041-5553(64)90137-5) (heavy ball); Sutskever
    et al., "On the importance of initialization and momentum in deep
    learning", ICML 2013
    (https://proceedings.mlr.press/v28/sutskever13.html).
  """
  accumulator_dtype = canonical_dtype(accumulator_dtype)

  def accumulate(g, t):
    return None if g is None else g + decay * t

  def init_fn(params):
    return TraceState(tree_math.tree_zeros_like(params, dtype=accumulator_dtype))

  def update_fn(updates, state, params=None):
    del params
    new_trace = jax.tree.map(
        accumulate, updates, state.trace, is_leaf=lambda g: g is None
    )
    if nesterov:
      updates = jax.tree.map(accumulate, updates, new_trace)
    else:
      updates = new_trace
    return updates, TraceState(tree_math.tree_cast(new_trace, accumulator_dtype))

  return base.GradientTransformation(init_fn, update_fn)


@moments.declare_moments(ema=moments.SIGNED)
class EmaState(NamedTuple):
  """The step count and the moving average of past updates."""

  count: jax.Array  # int32 scalar
  ema: base.Params


def ema(
    decay: jax.typing.ArrayLike,
    debias: bool = True,
    accumulator_dtype: Any | None = None,
) -> base.GradientTransformation:
  """Exponential moving average of the updates.

  ``ema = (1 - decay) * g + decay * ema``; the output is the new ``ema``,
  divided by ``1 - decay**count`` with ``debias`` so that early steps are not
  biased towards zero.

  Args:
    decay: the decay of the average.
    debias: whether to divide by ``1 - decay**count`` (default True).
    accumulator_dtype: storage dtype of the average; ``None`` (default) uses
      the params' dtype.

  Returns:
    A ``GradientTransformation`` whose state is an ``EmaState`` (count,
    ema).

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980), Sec. 3 (bias correction).
  """
  accumulator_dtype = canonical_dtype(accumulator_dtype)

  def init_fn(params):
    return EmaState(
        count=jnp.zeros([], jnp.int32),
        ema=tree_math.tree_zeros_like(params, dtype=accumulator_dtype),
    )

  def update_fn(updates, state, params=None):
    del params
    new_ema = tree_math.update_moment(updates, state.ema, decay, 1)
    count = numerics.safe_increment(state.count)
    updates = new_ema
    if debias:
      updates = tree_math.bias_correction(new_ema, decay, count)
    return updates, EmaState(count, tree_math.tree_cast(new_ema, accumulator_dtype))

  return base.GradientTransformation(init_fn, update_fn)
