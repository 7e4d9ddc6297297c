"""Sign-based updates: Lion, signSGD and Rprop.

They only look at the sign of (a momentum of) the gradient, elementwise, so
their state is ``zeros_like``/``full_like`` of the params.
"""

from typing import Any
from typing import Literal
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.momentum import canonical_dtype

__all__ = [
    "ScaleByLionState",
    "ScaleByRpropState",
    "scale_by_lion",
    "scale_by_rprop",
    "scale_by_sign",
]

_LION_MODES = ("hard", "smooth", "refined")


@moments.declare_moments(mu=moments.SIGNED)
class ScaleByLionState(NamedTuple):
  """Step count and momentum ``mu``."""

  count: jax.Array  # int32 scalar
  mu: base.Updates


def scale_by_lion(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.99,
    mu_dtype: Any | None = None,
    *,
    mode: Literal["hard", "smooth", "refined"] = "hard",
    smooth_beta: float = 1.0,
) -> base.GradientTransformation:
  """Lion's direction: the sign of an interpolation of gradient and momentum.

  The output is ``sign((1 - b1) * g + b1 * m)``, then ``m = b2 * m + (1 -
  b2) * g``. ``mode`` picks the sign function.

  Args:
    b1: interpolation weight of the momentum in the sign (default 0.9).
    b2: decay of the momentum (default 0.99).
    mu_dtype: dtype of the momentum; ``None`` (default) uses the params'
      dtype.
    mode: ``"hard"`` (default, ``sign``), ``"smooth"`` (``tanh(smooth_beta
      * x)``) or ``"refined"`` (``x`` inside [-1, 1], its sign outside);
      another value raises ValueError.
    smooth_beta: the slope of ``"smooth"`` (default 1.0).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByLionState``.

  References:
    Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS
    2023 (https://arxiv.org/abs/2302.06675).
  """
  if mode not in _LION_MODES:
    raise ValueError(
        f"scale_by_lion: unknown mode {mode!r}; use one of {_LION_MODES}"
    )
  mu_dtype = canonical_dtype(mu_dtype)

  def signed(x):
    if mode == "hard":
      return jnp.sign(x)
    if mode == "smooth":
      return jnp.tanh(smooth_beta * x)
    return jnp.where(jnp.abs(x) < 1.0, x, jnp.sign(x))

  def init_fn(params):
    return ScaleByLionState(
        count=jnp.zeros([], jnp.int32),
        mu=tree_math.tree_zeros_like(params, dtype=mu_dtype),
    )

  def update_fn(updates, state, params=None):
    del params
    directions = jax.tree.map(
        lambda g, m: signed((1.0 - b1) * g + b1 * m), updates, state.mu
    )
    mu = tree_math.tree_cast(tree_math.update_moment(updates, state.mu, b2, 1), mu_dtype)
    count = numerics.safe_increment(state.count)
    return directions, ScaleByLionState(count=count, mu=mu)

  return base.GradientTransformation(init_fn, update_fn)


def scale_by_sign() -> base.GradientTransformation:
  """Replaces every update element by its sign.

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
    Problems", ICML 2018 (https://arxiv.org/abs/1802.04434).
  """
  return base.stateless_with_tree_map(lambda g, _: jnp.sign(g))


class ScaleByRpropState(NamedTuple):
  """Per-coordinate step sizes and the previous (signed, scaled) updates."""

  step_sizes: base.Updates
  prev_updates: base.Updates


def scale_by_rprop(
    learning_rate: jax.typing.ArrayLike,
    eta_minus: jax.typing.ArrayLike = 0.5,
    eta_plus: jax.typing.ArrayLike = 1.2,
    min_step_size: jax.typing.ArrayLike = 1e-6,
    max_step_size: jax.typing.ArrayLike = 50.0,
) -> base.GradientTransformation:
  """Rprop's per-coordinate step sizes, adapted from the gradient's sign changes.

  The step sizes start at ``learning_rate``, grow by ``eta_plus`` while the
  gradient keeps its sign and shrink by ``eta_minus`` when it flips, within
  ``[min_step_size, max_step_size]``; after a sign flip the coordinate does
  not move. The output is ``+step * sign(g)`` of the *previous* step (zero
  at the first), exactly as optax 0.2.8 computes it: negate it (as
  ``shardopt.rprop`` does) to descend.

  Args:
    learning_rate: the initial per-coordinate step size.
    eta_minus: factor applied to a step size on a sign flip (default 0.5).
    eta_plus: factor applied while the sign is kept (default 1.2).
    min_step_size: lower bound of the step sizes (default 1e-6).
    max_step_size: upper bound of the step sizes (default 50.0).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByRpropState``.

  References:
    Riedmiller & Braun, "A Direct Adaptive Method for Faster Backpropagation
    Learning: The RPROP Algorithm", ICNN 1993
    (https://doi.org/10.1109/ICNN.1993.298623).
  """

  def init_fn(params):
    return ScaleByRpropState(
        step_sizes=tree_math.tree_full_like(params, learning_rate),
        prev_updates=tree_math.tree_zeros_like(params),
    )

  def new_step_size(agreement, step_size):
    factor = jnp.where(agreement > 0, eta_plus, eta_minus)
    grown = jnp.clip(step_size * factor, min=min_step_size, max=max_step_size)
    return jnp.where(agreement == 0, step_size, grown)

  def update_fn(updates, state, params=None):
    del params
    agreement = jax.tree.map(lambda g, prev: g * prev, updates,
                             state.prev_updates)
    step_sizes = jax.tree.map(new_step_size, agreement, state.step_sizes)
    moves = jax.tree.map(
        lambda a, g, s: jnp.where(a < 0, jnp.zeros_like(g), s * jnp.sign(g)),
        agreement,
        updates,
        step_sizes,
    )
    # optax 0.2.8 returns the previous step's move (masked where the sign
    # flipped), so the output lags one step behind ``moves``; kept for parity.
    lagged = jax.tree.map(
        lambda a, prev: jnp.where(a < 0, jnp.zeros_like(prev), prev),
        agreement,
        state.prev_updates,
    )
    return lagged, ScaleByRpropState(step_sizes=step_sizes, prev_updates=moves)

  return base.GradientTransformation(init_fn, update_fn)
