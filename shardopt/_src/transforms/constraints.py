"""Constraining updates: keeping params non-negative, zeroing NaNs."""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base

__all__ = [
    "NonNegativeParamsState",
    "ZeroNansState",
    "keep_params_nonnegative",
    "require_params",
    "zero_nans",
]

NonNegativeParamsState = base.EmptyState


def require_params(params: base.Params, transform: str) -> None:
  """Raises a ValueError telling how to call ``transform`` without params."""
  if params is None:
    raise ValueError(
        f"{transform} needs the current params: call"
        " tx.update(updates, state, params)."
    )


def keep_params_nonnegative() -> base.GradientTransformation:
  """Clamps the updates so that ``params + updates >= 0``; put it last in a chain.

  Where a step would make a param negative the update becomes ``-param``
  (that param lands on zero; a negative param is moved to zero). Needs the
  params.

  Returns:
    A stateless ``GradientTransformation`` (state ``NonNegativeParamsState``,
    empty).

  References:
    Projection onto the non-negative orthant (projected gradient descent);
    optax's ``keep_params_nonnegative``.
  """

  def update_fn(updates, state, params=None):
    require_params(params, "keep_params_nonnegative")
    updates = jax.tree.map(
        lambda p, u: None if p is None else jnp.where(p + u < 0.0, -p, u),
        params,
        updates,
        is_leaf=lambda x: x is None,
    )
    return updates, state

  return base.GradientTransformation(base.init_empty_state, update_fn)


class ZeroNansState(NamedTuple):
  """Per param, whether the last update had a NaN (a boolean scalar each)."""

  found_nan: Any


def zero_nans() -> base.GradientTransformation:
  """Replaces NaNs in the updates with zeros and records where it did.

  Returns:
    A ``GradientTransformation`` whose state is a ``ZeroNansState``: per
    param, a boolean scalar telling whether its last update had a NaN.

  References:
    optax's ``zero_nans``.
  """

  def init_fn(params):
    return ZeroNansState(
        jax.tree.map(lambda _: jnp.zeros([], jnp.bool_), params)
    )

  def update_fn(updates, state, params=None):
    del state, params
    found_nan = jax.tree.map(lambda u: jnp.any(jnp.isnan(u)), updates)
    updates = jax.tree.map(
        lambda u: jnp.where(jnp.isnan(u), jnp.zeros_like(u), u), updates
    )
    return updates, ZeroNansState(found_nan)

  return base.GradientTransformation(init_fn, update_fn)
