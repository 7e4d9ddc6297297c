"""Zoom line search: sufficient decrease and small curvature (strong Wolfe).

Phase 1 grows the stepsize until an interval bracketing an acceptable one is
found; phase 2 ("zoom") shrinks the bracket with cubic, quadratic or bisection
steps. A stepsize giving only sufficient decrease is remembered as a fallback.
"""

import functools
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.linesearch import interpolation
from shardopt._src.linesearch.backtracking import along
from shardopt._src.linesearch.backtracking import cast_like
from shardopt._src.linesearch.backtracking import split_fn_kwargs
from shardopt._src.linesearch.backtracking import value_dtype

__all__ = [
    "ScaleByZoomLinesearchState",
    "ZoomLinesearchInfo",
    "scale_by_zoom_linesearch",
]


class ZoomLinesearchInfo(NamedTuple):
  """Steps taken, and the final sufficient-decrease and curvature errors
  (0 when the criterion was met)."""

  num_linesearch_steps: jax.Array  # int
  decrease_error: jax.Array  # float
  curvature_error: jax.Array  # float


class ScaleByZoomLinesearchState(NamedTuple):
  """The accepted learning rate, the objective and gradient at the accepted
  point (reusable with :func:`value_and_grad_from_state`), diagnostics."""

  learning_rate: jax.Array
  value: jax.Array
  grad: Any
  info: ZoomLinesearchInfo


class _Zoom(NamedTuple):
  """The search: current try, bracket [low, high], fallback, flags."""

  count: jax.Array
  stepsize: jax.Array
  value: jax.Array
  grad: Any
  slope: jax.Array
  decrease_error: jax.Array
  curvature_error: jax.Array
  interval_found: jax.Array
  done: jax.Array
  failed: jax.Array
  low: jax.Array
  value_low: jax.Array
  slope_low: jax.Array
  high: jax.Array
  value_high: jax.Array
  slope_high: jax.Array
  cubic_ref: jax.Array
  value_cubic_ref: jax.Array
  safe_stepsize: jax.Array
  safe_value: jax.Array
  safe_grad: Any


class _Context(NamedTuple):
  """What stays fixed during one search: the objective along the line, and
  the value, slope and first stepsize at its start."""

  evaluate: Any
  value: jax.Array
  slope: jax.Array
  guess: jax.Array


def _pick(condition, if_true, if_false):
  return tree_math.tree_where(condition, if_true, if_false)


def scale_by_zoom_linesearch(
    max_linesearch_steps: int,
    max_learning_rate: jax.typing.ArrayLike | None = None,
    tol: jax.typing.ArrayLike = 0.0,
    increase_factor: jax.typing.ArrayLike = 2.0,
    slope_rtol: jax.typing.ArrayLike = 1e-4,
    curv_rtol: jax.typing.ArrayLike = 0.9,
    approx_dec_rtol: jax.typing.ArrayLike | None = 1e-6,
    stepsize_precision: jax.typing.ArrayLike = 1e-5,
    initial_guess_strategy: str = "keep",
    verbose: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Zoom line search: a learning rate meeting the strong Wolfe conditions.

  The accepted ``lr`` satisfies ``f(w + lr u) <= f(w) + slope_rtol * lr *
  <u, g>`` and ``|<grad f(w + lr u), u>| <= curv_rtol * |<u, g>|`` (both up
  to ``tol``). When values get within ``approx_dec_rtol * |f(w)|`` of
  ``f(w)``, Hager and Zhang's approximate decrease criterion on slopes is
  also accepted. A bracket narrower than ``stepsize_precision`` ends the
  search with the best sufficient-decrease stepsize found. ``update`` needs
  ``value=``, ``grad=`` and ``value_fn=``.

  Args:
    max_linesearch_steps: the most evaluations of the objective per search.
    max_learning_rate: upper bound of the learning rate; ``None`` (default)
      for none.
    tol: tolerance of both conditions (default 0.0).
    increase_factor: factor by which the learning rate grows while
      bracketing (default 2.0).
    slope_rtol: weight of the directional derivative in the sufficient
      decrease condition (default 1e-4).
    curv_rtol: bound of the curvature condition (default 0.9).
    approx_dec_rtol: relative tolerance of the approximate decrease
      criterion; ``None`` turns it off (default 1e-6).
    stepsize_precision: the narrowest bracket searched (default 1e-5).
    initial_guess_strategy: ``"keep"`` (default: start from the previous
      learning rate) or ``"one"`` (start from 1, for quasi-Newton
      directions).
    verbose: whether to print the search's progress (default False).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ScaleByZoomLinesearchState`` and whose updates are ``lr * u``.

  References:
    Nocedal & Wright, "Numerical Optimization", 1999, Algorithms 3.5 and
    3.6; Hager & Zhang, "Algorithm 851: CG_DESCENT, a Conjugate Gradient
    Method with Guaranteed Descent", ACM TOMS 2006
    (https://doi.org/10.1145/1132973.1132979).
  """
  if initial_guess_strategy not in ("one", "keep"):
    raise ValueError(
        "scale_by_zoom_linesearch: initial_guess_strategy must be 'one' or"
        f" 'keep', got {initial_guess_strategy!r}"
    )

  def errors(stepsize, value, step_slope, value_init, slope_init):
    """(decrease error, curvature error), each 0 when met and inf for NaN."""
    decrease = value - value_init - slope_rtol * stepsize * slope_init
    if approx_dec_rtol is not None:
      approx = jnp.maximum(
          step_slope - (2 * slope_rtol - 1.0) * slope_init,
          value - value_init - approx_dec_rtol * jnp.abs(value_init),
      )
      decrease = jnp.minimum(approx, decrease)
    decrease = jnp.maximum(decrease, 0.0)
    curvature = jnp.maximum(
        jnp.abs(step_slope) - curv_rtol * jnp.abs(slope_init), 0.0)
    nan_to_inf = lambda e: jnp.where(jnp.isnan(e), jnp.inf, e)  # noqa: E731
    return nan_to_inf(decrease), nan_to_inf(curvature)

  def search_interval(s, ctx):
    """Algorithm 3.5: grow the stepsize until a bracket is found."""
    stepsize = jnp.where(s.count == 0, ctx.guess, increase_factor * s.stepsize)
    if max_learning_rate is not None:
      at_max = stepsize >= max_learning_rate
      stepsize = jnp.minimum(stepsize, max_learning_rate)
    else:
      at_max = jnp.asarray(False)
    value, grad, step_slope = ctx.evaluate(stepsize)
    dec_err, curv_err = errors(stepsize, value, step_slope, ctx.value, ctx.slope)
    error = jnp.maximum(dec_err, curv_err)
    safe = _pick(dec_err <= tol, [stepsize, value, grad],
                 [s.safe_stepsize, s.safe_value, s.safe_grad])
    high_is_new = (dec_err > 0.0) | ((value >= s.value) & (s.count > 0))
    low_is_new = (step_slope >= 0.0) & ~high_is_new
    previous, new = [s.stepsize, s.value, s.slope], [stepsize, value, step_slope]
    low, value_low, slope_low, high, value_high, slope_high = _pick(
        low_is_new, new + previous, previous + new)
    found = high_is_new | low_is_new | (error <= tol)
    done = (error <= tol) | (at_max & ~found)
    return cast_like(s._replace(
        count=numerics.safe_increment(s.count), stepsize=stepsize, value=value,
        grad=grad, slope=step_slope, decrease_error=dec_err,
        curvature_error=curv_err, interval_found=found, done=done,
        failed=(s.count + 1 >= max_linesearch_steps) & ~done,
        low=low, value_low=value_low, slope_low=slope_low, high=high,
        value_high=value_high, slope_high=slope_high, cubic_ref=low,
        value_cubic_ref=value_low, safe_stepsize=safe[0], safe_value=safe[1],
        safe_grad=safe[2]), s)

  def zoom(s, ctx):
    """Algorithm 3.6: shrink the bracket around an acceptable stepsize."""
    width = jnp.abs(s.high - s.low)
    left, right = jnp.minimum(s.high, s.low), jnp.maximum(s.high, s.low)
    cubic = interpolation.cubic_minimizer(
        s.low, s.value_low, s.slope_low, s.high, s.value_high, s.cubic_ref,
        s.value_cubic_ref)
    use_cubic = (cubic > left + 0.2 * width) & (cubic < right - 0.2 * width)
    quad = interpolation.quadratic_minimizer(
        s.low, s.value_low, s.slope_low, s.high, s.value_high)
    use_quad = ~use_cubic & (quad > left + 0.1 * width) & (
        quad < right - 0.1 * width)
    middle = jnp.where(use_cubic, cubic, s.cubic_ref)
    middle = jnp.where(use_quad, quad, middle)
    middle = jnp.where(~use_cubic & ~use_quad, (s.low + s.high) / 2.0, middle)
    value, grad, step_slope = ctx.evaluate(middle)
    dec_err, curv_err = errors(middle, value, step_slope, ctx.value, ctx.slope)
    done = jnp.maximum(dec_err, curv_err) <= tol
    safe = _pick((dec_err <= tol) & (value < s.safe_value),
                 [middle, value, grad],
                 [s.safe_stepsize, s.safe_value, s.safe_grad])
    high_to_middle = (dec_err > 0.0) | (value >= s.value_low)
    high_to_low = (step_slope * (s.high - s.low) >= 0.0) & ~high_to_middle
    point = [middle, value, step_slope]
    high = _pick(high_to_middle, point, [s.high, s.value_high, s.slope_high])
    high = _pick(high_to_low, [s.low, s.value_low, s.slope_low], high)
    low = _pick(~high_to_middle, point, [s.low, s.value_low, s.slope_low])
    cubic_ref = _pick(high_to_middle | high_to_low, [s.high, s.value_high],
                      [s.low, s.value_low])
    too_narrow = width <= stepsize_precision
    failed = ((s.count + 1 >= max_linesearch_steps)
              | (too_narrow & (safe[0] > 0.0))) & ~done
    return cast_like(s._replace(
        count=numerics.safe_increment(s.count), stepsize=middle, value=value,
        grad=grad, slope=step_slope, decrease_error=dec_err,
        curvature_error=curv_err, done=done, failed=failed,
        low=low[0], value_low=low[1], slope_low=low[2], high=high[0],
        value_high=high[1], slope_high=high[2], cubic_ref=cubic_ref[0],
        value_cubic_ref=cubic_ref[1], safe_stepsize=safe[0],
        safe_value=safe[1], safe_grad=safe[2]), s)

  def fall_back(s, ctx):
    """On failure take the sufficient-decrease stepsize if one was found (or
    if the last try was not finite), else keep the last try."""
    use_safe = (s.safe_stepsize > 0.0) | jnp.isinf(s.decrease_error)
    stepsize, value, grad = _pick(use_safe,
                                  [s.safe_stepsize, s.safe_value, s.safe_grad],
                                  [s.stepsize, s.value, s.grad])
    if verbose:
      jax.debug.print(
          "scale_by_zoom_linesearch failed after {n} steps: stepsize {lr},"
          " decrease error {d}, curvature error {c}, slope at 0 {s0}",
          n=s.count, lr=stepsize, d=s.decrease_error, c=s.curvature_error,
          s0=ctx.slope, ordered=True)
    return cast_like(s._replace(stepsize=stepsize, value=value, grad=grad), s)

  def step(s, ctx):
    new = jax.lax.cond(s.interval_found, functools.partial(zoom, ctx=ctx),
                       functools.partial(search_interval, ctx=ctx), s)
    return jax.lax.cond(new.failed, functools.partial(fall_back, ctx=ctx),
                        lambda x: x, new)

  def init_fn(params):
    dtype = value_dtype(params)
    return ScaleByZoomLinesearchState(
        learning_rate=jnp.asarray(1.0, dtype),
        value=jnp.asarray(jnp.inf, dtype),
        grad=tree_math.tree_zeros_like(params),
        info=ZoomLinesearchInfo(
            num_linesearch_steps=jnp.asarray(0),
            decrease_error=jnp.asarray(jnp.inf),
            curvature_error=jnp.asarray(jnp.inf),
        ),
    )

  def update_fn(updates, state, params, *, value, grad, value_fn,
                **extra_args):
    fn_kwargs = split_fn_kwargs("scale_by_zoom_linesearch", value_fn,
                                extra_args)
    value_and_grad = jax.value_and_grad(value_fn)

    def evaluate(stepsize):
      new_value, new_grad = value_and_grad(along(params, stepsize, updates),
                                           **fn_kwargs)
      return new_value, new_grad, tree_math.tree_vdot(updates, new_grad)

    slope_init = tree_math.tree_vdot(updates, grad)
    guess = (jnp.asarray(1.0) if initial_guess_strategy == "one"
             else state.learning_rate)
    ctx = _Context(evaluate, value, slope_init, guess)
    zero, inf = jnp.asarray(0.0), jnp.asarray(jnp.inf)
    start = _Zoom(
        count=jnp.asarray(0), stepsize=jnp.asarray(0.0, value_dtype(params)),
        value=jnp.array(value, value_dtype(params)), grad=grad,
        slope=slope_init, decrease_error=inf, curvature_error=inf,
        interval_found=jnp.asarray(False), done=jnp.asarray(False),
        failed=jnp.asarray(False), low=zero, value_low=value,
        slope_low=slope_init, high=zero, value_high=value,
        slope_high=slope_init, cubic_ref=zero, value_cubic_ref=value,
        safe_stepsize=zero, safe_value=value, safe_grad=grad)
    final = jax.lax.while_loop(lambda s: ~(s.done | s.failed),
                               functools.partial(step, ctx=ctx), start)
    new_state = ScaleByZoomLinesearchState(
        learning_rate=final.stepsize,
        value=final.value,
        grad=final.grad,
        info=ZoomLinesearchInfo(final.count, final.decrease_error,
                                final.curvature_error),
    )
    return (tree_math.tree_scale(final.stepsize, updates),
            cast_like(new_state, state))

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
