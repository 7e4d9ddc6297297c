"""Per-coordinate adaptive scaling: Adam, RAdam, (centred) RMSProp, Adagrad.

Every moment is created with ``zeros_like``/``full_like`` of the params, so it
carries the params' shardings.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math

__all__ = [
    "ScaleByRStdDevState",
    "ScaleByRStdDevWithCountState",
    "ScaleByRmsState",
    "ScaleByRmsWithCountState",
    "ScaleByRssState",
    "scale_by_rms",
    "scale_by_rss",
    "scale_by_stddev",
]


@moments.declare_moments(sum_of_squares=moments.NONNEGATIVE)
class ScaleByRssState(NamedTuple):
  """The running sum of squared updates."""

  sum_of_squares: base.Updates


def scale_by_rss(
    initial_accumulator_value: jax.typing.ArrayLike = 0.1,
    eps: jax.typing.ArrayLike = 1e-7,
) -> base.GradientTransformation:
  """Adagrad's rescaling by the root of the sum of squared updates.

  ``s = s + g**2`` (starting at ``initial_accumulator_value``); the output is
  ``g / sqrt(s + eps)``, zero where ``s`` is zero.

  Args:
    initial_accumulator_value: initial value of the sum (default 0.1).
    eps: added to the sum inside the root (default 1e-7).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByRssState``.

  References:
    Duchi et al., "Adaptive Subgradient Methods for Online Learning and
    Stochastic Optimization", JMLR 2011
    (https://jmlr.org/papers/v12/duchi11a.html).
  """

  def init_fn(params):
    return ScaleByRssState(
        tree_math.tree_full_like(params, initial_accumulator_value)
    )

  def update_fn(updates, state, params=None):
    del params
    sum_of_squares = jax.tree.map(
        lambda g, s: numerics.abs_sq(g) + s, updates, state.sum_of_squares
    )
    updates = jax.tree.map(
        lambda s, g: jnp.where(s > 0, jax.lax.rsqrt(s + eps), 0.0) * g,
        sum_of_squares,
        updates,
    )
    return updates, ScaleByRssState(sum_of_squares)

  return base.GradientTransformation(init_fn, update_fn)


@moments.declare_moments(nu=moments.NONNEGATIVE)
class ScaleByRmsState(NamedTuple):
  """The moving average ``nu`` of squared updates."""

  nu: base.Updates


@moments.declare_moments(nu=moments.NONNEGATIVE)
class ScaleByRmsWithCountState(NamedTuple):
  """``ScaleByRmsState`` plus the step count (with bias correction)."""

  count: jax.Array  # int32 scalar
  nu: base.Updates


@moments.declare_moments(kept={"mu": moments.CENTRED_RMS_KEPT,
                                "nu": moments.CENTRED_RMS_KEPT})
class ScaleByRStdDevState(NamedTuple):
  """Moving averages of the updates (``mu``) and of their squares (``nu``).

  Both declared kept (``quantized_state`` keeps them in float and says
  why): the update divides by ``sqrt(nu - mu**2)``, a difference that
  separately rounded codes make negative wherever the variance is small
  against ``nu`` (centered RMSProp quantized went non-finite at step 11 at
  8 bits and step 2 at 4: ``tests/test_quantized_state.py``).
  """

  mu: base.Updates
  nu: base.Updates


@moments.declare_moments(kept={"mu": moments.CENTRED_RMS_KEPT,
                                "nu": moments.CENTRED_RMS_KEPT})
class ScaleByRStdDevWithCountState(NamedTuple):
  """``ScaleByRStdDevState`` plus the step count (with bias correction); both
  averages declared kept, as there."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates


def _inverse_root(variance, eps, eps_in_sqrt: bool) -> jax.Array:
  if eps_in_sqrt:
    return jax.lax.rsqrt(variance + eps)
  return 1 / (jnp.sqrt(variance) + eps)


def scale_by_rms(
    decay: jax.typing.ArrayLike = 0.9,
    eps: jax.typing.ArrayLike = 1e-8,
    initial_scale: jax.typing.ArrayLike = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> base.GradientTransformation:
  """RMSProp's rescaling by the root of the moving average of squared updates.

  ``nu = decay * nu + (1 - decay) * g**2`` (starting at ``initial_scale``);
  the output is ``g / sqrt(nu + eps)``, or ``g / (sqrt(nu) + eps)`` when not
  ``eps_in_sqrt``; ``nu`` is first divided by ``1 - decay**t`` with
  ``bias_correction``.

  Args:
    decay: decay of the moving average (default 0.9).
    eps: added to the average (inside the root) or to its root (default
      1e-8).
    initial_scale: initial value of ``nu`` (default 0.0).
    eps_in_sqrt: whether ``eps`` goes inside the root (default True).
    bias_correction: whether to debias the average (default False); the
      state then also holds the step count.

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByRmsState`` (or
    ``ScaleByRmsWithCountState`` with ``bias_correction``).

  References:
    Tieleman & Hinton, "Lecture 6.5 - rmsprop", Coursera: Neural Networks for
    Machine Learning, 2012
    (https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf).
  """

  def init_fn(params):
    nu = tree_math.tree_full_like(params, initial_scale)
    if bias_correction:
      return ScaleByRmsWithCountState(count=jnp.zeros([], jnp.int32), nu=nu)
    return ScaleByRmsState(nu=nu)

  def update_fn(updates, state, params=None):
    del params
    nu = tree_math.update_moment_per_elem_norm(updates, state.nu, decay, 2)
    if bias_correction:
      count = numerics.safe_increment(state.count)
      nu_hat = tree_math.bias_correction(nu, decay, count)
      new_state = ScaleByRmsWithCountState(count=count, nu=nu)
    else:
      nu_hat = nu
      new_state = ScaleByRmsState(nu=nu)
    updates = jax.tree.map(
        lambda v, g: _inverse_root(v, eps, eps_in_sqrt) * g, nu_hat, updates
    )
    return updates, new_state

  return base.GradientTransformation(init_fn, update_fn)


def scale_by_stddev(
    decay: jax.typing.ArrayLike = 0.9,
    eps: jax.typing.ArrayLike = 1e-8,
    initial_scale: jax.typing.ArrayLike = 0.0,
    eps_in_sqrt: bool = True,
    bias_correction: bool = False,
) -> base.GradientTransformation:
  """Centred RMSProp's rescaling by the root of the updates' moving variance.

  With moving averages ``mu`` of ``g`` and ``nu`` of ``g**2`` (decay
  ``decay``), the output is ``g / sqrt(nu - mu**2 + eps)`` (or ``g /
  (sqrt(nu - mu**2) + eps)`` when not ``eps_in_sqrt``).

  Args:
    decay: decay of both moving averages (default 0.9).
    eps: added to the variance (inside the root) or to its root (default
      1e-8).
    initial_scale: initial value of ``nu`` (default 0.0).
    eps_in_sqrt: whether ``eps`` goes inside the root (default True).
    bias_correction: whether to debias both averages (default False); the
      state then also holds the step count.

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByRStdDevState``
    (or ``ScaleByRStdDevWithCountState`` with ``bias_correction``).

  References:
    Graves, "Generating Sequences With Recurrent Neural Networks", 2013
    (https://arxiv.org/abs/1308.0850).
  """

  def init_fn(params):
    mu = tree_math.tree_zeros_like(params)
    nu = tree_math.tree_full_like(params, initial_scale)
    if bias_correction:
      return ScaleByRStdDevWithCountState(jnp.zeros([], jnp.int32), mu, nu)
    return ScaleByRStdDevState(mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    del params
    mu = tree_math.update_moment(updates, state.mu, decay, 1)
    nu = tree_math.update_moment_per_elem_norm(updates, state.nu, decay, 2)
    if bias_correction:
      count = numerics.safe_increment(state.count)
      mu_hat = tree_math.bias_correction(mu, decay, count)
      nu_hat = tree_math.bias_correction(nu, decay, count)
      new_state = ScaleByRStdDevWithCountState(count=count, mu=mu, nu=nu)
    else:
      mu_hat, nu_hat = mu, nu
      new_state = ScaleByRStdDevState(mu=mu, nu=nu)
    updates = jax.tree.map(
        lambda m, v, g: _inverse_root(v - numerics.abs_sq(m), eps, eps_in_sqrt)
        * g,
        mu_hat,
        nu_hat,
        updates,
    )
    return updates, new_state

  return base.GradientTransformation(init_fn, update_fn)
