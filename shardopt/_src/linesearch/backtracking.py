"""Backtracking line search (Armijo), and helpers shared by the line searches.

A line search scales the incoming update direction ``u`` by a learning rate
chosen from evaluations of the objective along ``params + lr * u``. Its
``update`` takes the keyword arguments ``value`` (objective at the params),
``grad`` (its gradient) and ``value_fn`` (the objective), plus any keyword
arguments of ``value_fn`` (e.g. a batch). Everything along the line is
elementwise in the params, so sharded params stay sharded.
"""

import inspect
from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math

__all__ = [
    "BacktrackingLinesearchInfo",
    "ScaleByBacktrackingLinesearchState",
    "along",
    "cast_like",
    "scale_by_backtracking_linesearch",
    "split_fn_kwargs",
    "value_and_grad_from_state",
    "value_dtype",
]


def split_fn_kwargs(caller: str, value_fn: Callable, extra_args: dict) -> dict:
  """The extra keyword arguments meant for ``value_fn``; others are an error."""
  accepted = inspect.signature(value_fn).parameters
  unknown = sorted(k for k in extra_args if k not in accepted)
  if unknown:
    raise TypeError(
        f"Unexpected keyword arguments {unknown} for {caller}.update: value_fn does"
        " not accept them; pass only the objective's own keyword arguments"
    )
  return dict(extra_args)


def along(params: Any, stepsize, updates: Any) -> Any:
  """``params + stepsize * updates``."""
  stepsize = jnp.asarray(stepsize)
  return jax.tree.map(lambda p, u: p + stepsize * u, params, updates)


def cast_like(x: Any, like: Any) -> Any:
  """Casts each leaf of ``x`` to the dtype of its counterpart in ``like``
  (leaves of ``like`` without a dtype, e.g. Python ints, leave it as is)."""
  return jax.tree.map(
      lambda a, b: a.astype(b.dtype) if hasattr(b, "dtype") else a, x, like
  )


def value_dtype(params: Any):
  """The real dtype of the first param (float32 for a tree without leaves):
  the dtype of objective values."""
  leaves = jax.tree.leaves(params)
  if not leaves:
    return jnp.dtype(jnp.float32)
  return jnp.real(jnp.zeros([], leaves[0].dtype)).dtype


class BacktrackingLinesearchInfo(NamedTuple):
  """Steps the last search took, and its final sufficient-decrease error
  (0 when the criterion was met)."""

  num_linesearch_steps: jax.Array  # int
  decrease_error: jax.Array  # float


class ScaleByBacktrackingLinesearchState(NamedTuple):
  """The accepted learning rate, the objective (and, with ``store_grad``, its
  gradient) at the accepted point, and search diagnostics."""

  learning_rate: jax.Array
  value: jax.Array
  grad: Any  # None unless store_grad
  info: BacktrackingLinesearchInfo


class _Search(NamedTuple):
  learning_rate: jax.Array
  new_value: jax.Array
  new_grad: Any
  decrease_error: jax.Array
  iter_num: jax.Array


def scale_by_backtracking_linesearch(
    max_backtracking_steps: int,
    slope_rtol: jax.typing.ArrayLike = 1e-4,
    decrease_factor: jax.typing.ArrayLike = 0.8,
    increase_factor: jax.typing.ArrayLike = 1.5,
    max_learning_rate: jax.typing.ArrayLike = 1.0,
    atol: jax.typing.ArrayLike = 0.0,
    rtol: jax.typing.ArrayLike = 0.0,
    store_grad: bool = False,
    verbose: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Backtracking line search: shrinks the learning rate until Armijo's condition holds.

  The accepted ``lr`` satisfies ``f(w + lr u) <= (1 + rtol) f(w) + lr *
  slope_rtol * <u, grad f(w)> + atol``. Each round starts from
  ``min(increase_factor * previous lr, max_learning_rate)`` and multiplies by
  ``decrease_factor`` at most ``max_backtracking_steps`` times. If even the
  last try gives a non-finite value, the step is zero. ``u`` must be a
  descent direction; ``update`` needs ``value=``, ``grad=`` and
  ``value_fn=`` (extra arguments of the objective are passed on).

  Args:
    max_backtracking_steps: the most shrinking steps per search.
    slope_rtol: weight of the directional derivative in the condition
      (default 1e-4).
    decrease_factor: factor applied to the learning rate on each failure
      (default 0.8).
    increase_factor: factor applied to the previous learning rate to start
      the next search (default 1.5).
    max_learning_rate: upper bound of the starting learning rate (default
      1.0).
    atol: absolute tolerance of the condition (default 0.0).
    rtol: relative tolerance of the condition (default 0.0).
    store_grad: whether to keep the gradient at the accepted point in the
      state, for ``value_and_grad_from_state`` (default False).
    verbose: whether to print the search's progress (default False).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ScaleByBacktrackingLinesearchState`` and whose updates are ``lr * u``.

  References:
    Armijo, "Minimization of functions having Lipschitz continuous first
    partial derivatives", Pacific J. Math. 1966
    (https://doi.org/10.2140/pjm.1966.16.1); Vaswani et al., "Painless
    Stochastic Gradient: Interpolation, Line-Search, and Convergence
    Rates", NeurIPS 2019 (https://arxiv.org/abs/1905.09997).
  """

  def init_fn(params):
    dtype = value_dtype(params)
    return ScaleByBacktrackingLinesearchState(
        learning_rate=jnp.array(1.0, dtype),
        value=jnp.array(jnp.inf, dtype),
        grad=tree_math.tree_zeros_like(params) if store_grad else None,
        info=BacktrackingLinesearchInfo(
            num_linesearch_steps=jnp.asarray(0),
            decrease_error=jnp.array(jnp.inf, dtype),
        ),
    )

  def update_fn(updates, state, params, *, value, grad, value_fn,
                **extra_args):
    fn_kwargs = split_fn_kwargs(
        "scale_by_backtracking_linesearch", value_fn, extra_args)
    objective = lambda p: value_fn(p, **fn_kwargs)  # noqa: E731
    initial_slope = tree_math.tree_vdot(updates, grad)

    def decrease_error(lr, new_value):
      error = new_value - (1.0 + rtol) * value - lr * slope_rtol * initial_slope
      return jnp.maximum(jnp.where(jnp.isnan(error), jnp.inf, error), 0.0)

    def keep_going(search):
      return (~(search.decrease_error <= atol)) & (
          search.iter_num <= max_backtracking_steps)

    def try_next(search):
      lr = jnp.where(search.iter_num > 0, decrease_factor * search.learning_rate,
                     search.learning_rate)
      candidate = along(params, lr, updates)
      new_grad = search.new_grad
      if store_grad:
        new_value, linearized = jax.linearize(objective, candidate)
        error = decrease_error(lr, new_value)
        # The gradient is only needed at the accepted point.
        new_grad = jax.lax.cond(
            (error <= atol) | (search.iter_num == max_backtracking_steps),
            lambda p: jax.linear_transpose(linearized, p)(1.0)[0],
            lambda p: new_grad,
            candidate,
        )
      else:
        new_value = objective(candidate)
        error = decrease_error(lr, new_value)
      return cast_like(
          _Search(lr, new_value, new_grad, error, search.iter_num + 1), search)

    start = _Search(
        learning_rate=jnp.minimum(increase_factor * state.learning_rate,
                                  max_learning_rate),
        new_value=value,
        new_grad=tree_math.tree_zeros_like(params),
        decrease_error=jnp.array(jnp.inf),
        iter_num=0,
    )
    search = jax.lax.while_loop(keep_going, try_next, start)
    failed_to_finite = jnp.isinf(search.decrease_error)
    learning_rate = jnp.where(failed_to_finite, 0.0, search.learning_rate)
    if verbose:
      jax.debug.print(
          "scale_by_backtracking_linesearch: no sufficient decrease: {failed},"
          " stepsize {lr}, decrease error {err}, slope {s}",
          failed=search.decrease_error > atol, lr=learning_rate,
          err=search.decrease_error, s=initial_slope, ordered=True)
    new_state = ScaleByBacktrackingLinesearchState(
        learning_rate=learning_rate,
        value=search.new_value,
        grad=search.new_grad if store_grad else None,
        info=BacktrackingLinesearchInfo(search.iter_num, search.decrease_error),
    )
    scaled = tree_math.tree_scale(learning_rate, updates)
    return scaled, cast_like(new_state, state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def _find_field(state: Any, name: str) -> list:
  """Every value stored under field ``name`` in the (nested) state."""
  found = []
  if hasattr(state, "_fields"):
    for field in state._fields:
      if field == name:
        found.append(getattr(state, field))
      else:
        found.extend(_find_field(getattr(state, field), name))
  elif isinstance(state, (tuple, list)):
    for part in state:
      found.extend(_find_field(part, name))
  elif isinstance(state, dict):
    for key, part in state.items():
      found.extend([part] if key == name else _find_field(part, name))
  return found


def _unique_field(state: Any, name: str):
  """The one field ``name`` of ``state``: KeyError when there are several,
  ValueError when there is none (or it is None), as optax raises them."""
  found = _find_field(state, name)
  if len(found) > 1:
    raise KeyError(
        f"value_and_grad_from_state: expected exactly one {name!r} in the"
        f" optimizer state, found {len(found)}: chain one line search that stores it")
  if not found or found[0] is None:
    raise ValueError(
        f"value_and_grad_from_state: no {name!r} in the optimizer state: use a line"
        " search that stores it (store_grad=True for the backtracking one)"
    )
  return found[0]


def value_and_grad_from_state(
    value_fn: Callable[..., jax.Array],
) -> Callable[..., tuple[jax.Array, Any]]:
  """Like ``jax.value_and_grad(value_fn)``, reusing what a line search stored.

  The returned function takes the params, the objective's extra arguments
  and a keyword ``state`` (the optimizer state holding the line search's):
  when the stored value is finite it returns the stored ``(value, grad)``,
  and evaluates ``value_fn`` otherwise (e.g. at the first step). The stored
  pair comes back in the dtypes of ``value_fn``'s value and gradient at
  ``params`` (a line search inside ``low_precision_params`` stores its
  float32 master's for bfloat16 params).

  Args:
    value_fn: the objective, ``value_fn(params, *args, **kwargs)``.

  Returns:
    ``fn(params, *args, state, **kwargs) -> (value, grad)``.
  """

  def value_and_grad(params, *fn_args, state, **fn_kwargs):
    value = _unique_field(state, "value")
    fresh = lambda p, a, kw: jax.value_and_grad(value_fn)(p, *a, **kw)
    like = jax.eval_shape(fresh, params, fn_args, fn_kwargs)
    stored = jax.tree.map(lambda x, s: x.astype(s.dtype),
                          (value, _unique_field(state, "grad")), like)
    return jax.lax.cond(jnp.isfinite(value), lambda *_: stored, fresh,
                        params, fn_args, fn_kwargs)

  return value_and_grad
