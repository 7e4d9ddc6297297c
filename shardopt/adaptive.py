"""Per-coordinate adaptive scaling: Adam, RAdam, (centred) RMSProp, Adagrad.

Every moment is created with ``zeros_like``/``full_like`` of the params, so it
carries the params' shardings.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from shardopt import base
from shardopt import numerics
from shardopt import tree
from shardopt.accumulation import canonical_dtype

__all__ = [
    "ScaleByAdamState",
    "ScaleByRStdDevState",
    "ScaleByRStdDevWithCountState",
    "ScaleByRmsState",
    "ScaleByRmsWithCountState",
    "ScaleByRssState",
    "scale_by_adam",
    "scale_by_radam",
    "scale_by_rms",
    "scale_by_rss",
    "scale_by_stddev",
]


def _is_none(x) -> bool:
  return x is None


class ScaleByAdamState(NamedTuple):
  """Step count, first moment ``mu`` and second moment ``nu``."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates


def _init_adam_state(params, mu_dtype=None, nu_dtype=None) -> ScaleByAdamState:
  return ScaleByAdamState(
      count=jnp.zeros([], jnp.int32),
      mu=tree.tree_zeros_like(params, dtype=mu_dtype),
      nu=tree.tree_zeros_like(params, dtype=nu_dtype),
  )


def _update_adam_moments(updates, state, b1, b2):
  """The new count, mu and nu, and the debiased second moment nu_hat."""
  mu = tree.update_moment(updates, state.mu, b1, 1)
  nu = tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
  count = numerics.safe_increment(state.count)
  return count, mu, nu, tree.bias_correction(nu, b2, count)


def debiased_first_moment(updates, mu, b1, count, nesterov):
  """Adam's debiased first moment; with ``nesterov`` it looks one step ahead.

  Dozat, 2016: ``b1 * mu / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)``.
  """
  if not nesterov:
    return tree.bias_correction(mu, b1, count)
  return jax.tree.map(
      lambda m, g: b1 * m + (1 - b1) * g,
      tree.bias_correction(mu, b1, numerics.safe_increment(count)),
      tree.bias_correction(updates, b1, count),
  )


def adam_direction(mu_hat, nu_hat, eps, eps_root):
  """``m / (sqrt(v + eps_root) + eps)`` leaf by leaf (None leaves kept)."""
  return jax.tree.map(
      lambda m, v: None if m is None else m / (jnp.sqrt(v + eps_root) + eps),
      mu_hat,
      nu_hat,
      is_leaf=_is_none,
  )


def scale_by_adam(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
    nu_dtype: Any | None = None,
) -> base.GradientTransformation:
  """Adam's rescaling ``mu_hat / (sqrt(nu_hat + eps_root) + eps)``.

  ``mu_dtype``/``nu_dtype`` set the storage dtypes of the two moments
  (default: the params'); ``nu_dtype`` is a shardopt extension.

  References: Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2014
  (https://arxiv.org/abs/1412.6980); with ``nesterov``, Dozat, "Incorporating
  Nesterov Momentum into Adam", ICLR workshop 2016
  (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ).
  """
  mu_dtype = canonical_dtype(mu_dtype)
  nu_dtype = canonical_dtype(nu_dtype)

  def init_fn(params):
    return _init_adam_state(params, mu_dtype, nu_dtype)

  def update_fn(updates, state, params=None):
    del params
    count, mu, nu, nu_hat = _update_adam_moments(updates, state, b1, b2)
    mu_hat = debiased_first_moment(updates, mu, b1, count, nesterov)
    updates = adam_direction(mu_hat, nu_hat, eps, eps_root)
    mu = tree.tree_cast(mu, mu_dtype)
    nu = tree.tree_cast_like(nu, state.nu)
    return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)


def scale_by_radam(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    threshold: jax.typing.ArrayLike = 5.0,
    *,
    nesterov: bool = False,
) -> base.GradientTransformation:
  """Rectified Adam: Adam's step times the variance rectification ``r``.

  While the approximated SMA length ``rho`` is below ``threshold`` the update
  is the debiased momentum alone.

  Reference: Liu et al., "On the Variance of the Adaptive Learning Rate and
  Beyond", 2019 (https://arxiv.org/abs/1908.03265).
  """
  rho_inf = 2.0 / (1.0 - b2) - 1.0

  def rectified(rho, mu_hat, nu_hat):
    r = jnp.sqrt(
        (rho - 4.0) * (rho - 2.0) * rho_inf
        / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho)
    )
    return jax.tree.map(
        lambda m, v: r.astype(m.dtype) * m / (jnp.sqrt(v + eps_root) + eps),
        mu_hat,
        nu_hat,
    )

  def update_fn(updates, state, params=None):
    del params
    count, mu, nu, nu_hat = _update_adam_moments(updates, state, b1, b2)
    b2_t = b2**count
    rho = rho_inf - 2 * count * b2_t / (1 - b2_t)
    mu_hat = debiased_first_moment(updates, mu, b1, count, nesterov)
    updates = jax.tree.map(
        lambda r, m: jnp.where(rho >= threshold, r, m),
        rectified(rho, mu_hat, nu_hat),
        mu_hat,
    )
    return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(_init_adam_state, update_fn)


class ScaleByRssState(NamedTuple):
  """The running sum of squared updates."""

  sum_of_squares: base.Updates


def scale_by_rss(
    initial_accumulator_value: jax.typing.ArrayLike = 0.1,
    eps: jax.typing.ArrayLike = 1e-7,
) -> base.GradientTransformation:
  """Adagrad's rescaling by ``1 / sqrt(sum of squared updates + eps)``.

  Coordinates whose sum is still zero get a zero update.

  Reference: Duchi et al., "Adaptive Subgradient Methods for Online Learning
  and Stochastic Optimization", JMLR 2011
  (https://jmlr.org/papers/v12/duchi11a.html).
  """

  def init_fn(params):
    return ScaleByRssState(
        tree.tree_full_like(params, initial_accumulator_value)
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


class ScaleByRmsState(NamedTuple):
  """The moving average ``nu`` of squared updates."""

  nu: base.Updates


class ScaleByRmsWithCountState(NamedTuple):
  """``ScaleByRmsState`` plus the step count (with bias correction)."""

  count: jax.Array  # int32 scalar
  nu: base.Updates


class ScaleByRStdDevState(NamedTuple):
  """Moving averages of the updates (``mu``) and of their squares (``nu``)."""

  mu: base.Updates
  nu: base.Updates


class ScaleByRStdDevWithCountState(NamedTuple):
  """``ScaleByRStdDevState`` plus the step count (with bias correction)."""

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
  """RMSProp's rescaling by the root of the moving average of squares.

  ``eps`` goes inside the root unless ``eps_in_sqrt`` is False;
  ``bias_correction`` debiases the average (the state then has a count).

  Reference: Tieleman & Hinton, "Lecture 6.5 - rmsprop", Coursera: Neural
  Networks for Machine Learning, 2012
  (https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf).
  """

  def init_fn(params):
    nu = tree.tree_full_like(params, initial_scale)
    if bias_correction:
      return ScaleByRmsWithCountState(count=jnp.zeros([], jnp.int32), nu=nu)
    return ScaleByRmsState(nu=nu)

  def update_fn(updates, state, params=None):
    del params
    nu = tree.update_moment_per_elem_norm(updates, state.nu, decay, 2)
    if bias_correction:
      count = numerics.safe_increment(state.count)
      nu_hat = tree.bias_correction(nu, decay, count)
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
  """Centred RMSProp: rescales by the root of ``E[g**2] - |E[g]|**2``.

  Options as in ``scale_by_rms``.

  Reference: Graves, "Generating Sequences With Recurrent Neural Networks",
  2013 (https://arxiv.org/abs/1308.0850).
  """

  def init_fn(params):
    mu = tree.tree_zeros_like(params)
    nu = tree.tree_full_like(params, initial_scale)
    if bias_correction:
      return ScaleByRStdDevWithCountState(jnp.zeros([], jnp.int32), mu, nu)
    return ScaleByRStdDevState(mu=mu, nu=nu)

  def update_fn(updates, state, params=None):
    del params
    mu = tree.update_moment(updates, state.mu, decay, 1)
    nu = tree.update_moment_per_elem_norm(updates, state.nu, decay, 2)
    if bias_correction:
      count = numerics.safe_increment(state.count)
      mu_hat = tree.bias_correction(mu, decay, count)
      nu_hat = tree.bias_correction(nu, decay, count)
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
