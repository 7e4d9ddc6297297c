"""Per-coordinate adaptive scaling: Adam, RAdam, (centred) RMSProp, Adagrad.

Every moment is created with ``zeros_like``/``full_like`` of the params, so it
carries the params' shardings.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.momentum import canonical_dtype

__all__ = [
    "ScaleByAdamState",
    "adam_direction",
    "debiased_first_moment",
    "scale_by_adam",
    "scale_by_radam",
]


def _is_none(x) -> bool:
  return x is None


@moments.declare_moments(mu=moments.SIGNED, nu=moments.NONNEGATIVE)
class ScaleByAdamState(NamedTuple):
  """Step count, first moment ``mu`` and second moment ``nu``."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates


def _init_adam_state(params, mu_dtype=None, nu_dtype=None) -> ScaleByAdamState:
  return ScaleByAdamState(
      count=jnp.zeros([], jnp.int32),
      mu=tree_math.tree_zeros_like(params, dtype=mu_dtype),
      nu=tree_math.tree_zeros_like(params, dtype=nu_dtype),
  )


def _update_adam_moments(updates, state, b1, b2):
  """The new count, mu and nu, and the debiased second moment nu_hat."""
  mu = tree_math.update_moment(updates, state.mu, b1, 1)
  nu = tree_math.update_moment_per_elem_norm(updates, state.nu, b2, 2)
  count = numerics.safe_increment(state.count)
  return count, mu, nu, tree_math.bias_correction(nu, b2, count)


def debiased_first_moment(updates, mu, b1, count, nesterov):
  """Adam's debiased first moment; with ``nesterov`` it looks one step ahead.

  Dozat, 2016: ``b1 * mu / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)``.
  """
  if not nesterov:
    return tree_math.bias_correction(mu, b1, count)
  return jax.tree.map(
      lambda m, g: b1 * m + (1 - b1) * g,
      tree_math.bias_correction(mu, b1, numerics.safe_increment(count)),
      tree_math.bias_correction(updates, b1, count),
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
  """Adam's rescaling: debiased first moment over the root of the second.

  ``m = b1 * m + (1 - b1) * g``, ``v = b2 * v + (1 - b2) * g**2``; with
  ``m_hat = m / (1 - b1**t)`` and ``v_hat = v / (1 - b2**t)`` the output is
  ``m_hat / (sqrt(v_hat + eps_root) + eps)``. With ``nesterov`` the first
  moment looks one step ahead: ``b1 * m / (1 - b1**(t+1)) + (1 - b1) * g /
  (1 - b1**t)``. Both moments are ``zeros_like`` the params (their
  shardings).

  Args:
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    nesterov: whether to use Nesterov momentum (default False).
    nu_dtype: dtype of the second moment; ``None`` (default) uses the
      params' dtype (a shardopt addition).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdamState``
    (count, mu, nu).

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980); Dozat, "Incorporating Nesterov
    Momentum into Adam", ICLR workshop 2016
    (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ) for
    ``nesterov``.
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
    mu = tree_math.tree_cast(mu, mu_dtype)
    nu = tree_math.tree_cast_like(nu, state.nu)
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
  """Rectified Adam: Adam's step times a variance rectification, once reliable.

  With ``rho_inf = 2 / (1 - b2) - 1`` and ``rho_t = rho_inf - 2 t b2**t /
  (1 - b2**t)``, the output is ``r_t * m_hat / (sqrt(v_hat + eps_root) +
  eps)`` with ``r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf -
  4)(rho_inf - 2) rho_t))`` when ``rho_t >= threshold``, and ``m_hat`` alone
  before.

  Args:
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    threshold: the ``rho_t`` from which the adaptive step is used
      (default 5.0).
    nesterov: whether to use Nesterov momentum (default False).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdamState``.

  References:
    Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond",
    ICLR 2020 (https://arxiv.org/abs/1908.03265).
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
