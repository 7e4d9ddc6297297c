"""Adam's relatives: Adamax, AMSGrad, AdaBelief and Yogi (Adadelta and Adan
are in modules of their own).

Each keeps per-coordinate moments built with ``zeros_like``/``full_like`` of
the params, so the state carries the params' shardings.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.adam import ScaleByAdamState
from shardopt._src.transforms.adam import adam_direction
from shardopt._src.transforms.adam import debiased_first_moment
from shardopt._src.transforms.momentum import canonical_dtype

__all__ = [
    "ScaleByAmsgradState",
    "ScaleByBeliefState",
    "scale_by_adamax",
    "scale_by_amsgrad",
    "scale_by_belief",
    "scale_by_yogi",
]


def _counter() -> jax.Array:
  return jnp.zeros([], jnp.int32)


def scale_by_adamax(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
) -> base.GradientTransformation:
  """Adamax's rescaling: Adam with the infinity norm as second moment.

  ``m = b1 * m + (1 - b1) * g`` and ``u = max(b2 * u, |g| + eps)`` (not
  debiased); the output is ``m / (1 - b1**t) / u``.

  Args:
    b1: decay of the first moment (default 0.9).
    b2: decay of the infinity norm (default 0.999).
    eps: added to ``|g|`` in the infinity norm (default 1e-8).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdamState``
    (``nu`` holds the infinity norm).

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980), Sec. 7.1.
  """

  def init_fn(params):
    return ScaleByAdamState(
        count=_counter(),
        mu=tree_math.tree_zeros_like(params),
        nu=tree_math.tree_zeros_like(params),
    )

  def update_fn(updates, state, params=None):
    del params
    count = numerics.safe_increment(state.count)
    mu = tree_math.update_moment(updates, state.mu, b1, 1)
    nu = tree_math.update_infinity_moment(updates, state.nu, b2, eps)
    mu_hat = tree_math.bias_correction(mu, b1, count)
    updates = jax.tree.map(lambda m, v: m / v, mu_hat, nu)
    return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)


@moments.declare_moments(mu=moments.SIGNED, nu=moments.NONNEGATIVE, nu_max=moments.NONNEGATIVE)
class ScaleByAmsgradState(NamedTuple):
  """Step count, moments ``mu``/``nu`` and the running maximum ``nu_max``."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates
  nu_max: base.Updates


def scale_by_amsgrad(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> base.GradientTransformation:
  """AMSGrad's rescaling: Adam dividing by the running maximum of the second moment.

  ``nu_max = max(nu_max, nu_hat)``; the output is ``m_hat /
  (sqrt(nu_max + eps_root) + eps)``. The bias corrections can be switched
  off to follow the paper exactly.

  Args:
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the maximum (default 1e-8).
    eps_root: added to the maximum inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    bias_correction_mu: whether to debias the first moment (default True).
    bias_correction_nu: whether to debias the second moment before taking
      the maximum (default True).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAmsgradState``.

  References:
    Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018
    (https://openreview.net/forum?id=ryQu7f-RZ).
  """
  mu_dtype = canonical_dtype(mu_dtype)

  def init_fn(params):
    return ScaleByAmsgradState(
        count=_counter(),
        mu=tree_math.tree_zeros_like(params, dtype=mu_dtype),
        nu=tree_math.tree_zeros_like(params),
        nu_max=tree_math.tree_zeros_like(params),
    )

  def update_fn(updates, state, params=None):
    del params
    mu = tree_math.update_moment(updates, state.mu, b1, 1)
    nu = tree_math.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    count = numerics.safe_increment(state.count)
    mu_hat = tree_math.bias_correction(mu, b1, count) if bias_correction_mu else mu
    nu_eff = tree_math.bias_correction(nu, b2, count) if bias_correction_nu else nu
    nu_max = jax.tree.map(jnp.maximum, state.nu_max, nu_eff)
    updates = adam_direction(mu_hat, nu_max, eps, eps_root)
    return updates, ScaleByAmsgradState(
        count=count, mu=tree_math.tree_cast(mu, mu_dtype), nu=nu, nu_max=nu_max
    )

  return base.GradientTransformation(init_fn, update_fn)


@moments.declare_moments(mu=moments.SIGNED, nu=moments.NONNEGATIVE)
class ScaleByBeliefState(NamedTuple):
  """Step count, first moment ``mu`` and the belief (centred) moment ``nu``."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates


def scale_by_belief(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-16,
    eps_root: jax.typing.ArrayLike = 1e-16,
    *,
    nesterov: bool = False,
) -> base.GradientTransformation:
  """AdaBelief's rescaling: divides by the EMA of ``(g - m)**2``.

  ``m = b1 * m + (1 - b1) * g``, ``s = b2 * s + (1 - b2) * (g - m)**2 +
  eps_root``; the output is ``m_hat / (sqrt(s_hat) + eps)`` (both debiased).

  Args:
    b1: decay of the first moment (default 0.9).
    b2: decay of the belief moment (default 0.999).
    eps: added to the root of the belief moment (default 1e-16).
    eps_root: added to the belief moment at every step (default 1e-16).
    nesterov: whether to use Nesterov momentum (default False).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByBeliefState``.

  References:
    Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief in
    Observed Gradients", NeurIPS 2020 (https://arxiv.org/abs/2010.07468).
  """

  def init_fn(params):
    return ScaleByBeliefState(
        count=_counter(),
        mu=tree_math.tree_zeros_like(params),
        nu=tree_math.tree_zeros_like(params),
    )

  def update_fn(updates, state, params=None):
    del params
    mu = tree_math.update_moment(updates, state.mu, b1, 1)
    surprise = tree_math.tree_sub(updates, mu)
    nu = tree_math.update_moment_per_elem_norm(surprise, state.nu, b2, 2)
    nu = jax.tree.map(lambda v: v + eps_root, nu)
    count = numerics.safe_increment(state.count)
    mu_hat = debiased_first_moment(updates, mu, b1, count, nesterov)
    nu_hat = tree_math.bias_correction(nu, b2, count)
    updates = adam_direction(mu_hat, nu_hat, eps, 0.0)
    return updates, ScaleByBeliefState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)


def scale_by_yogi(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-3,
    eps_root: jax.typing.ArrayLike = 0.0,
    initial_accumulator_value: jax.typing.ArrayLike = 1e-6,
) -> base.GradientTransformation:
  """Yogi's rescaling: an additive, sign-controlled second-moment update.

  ``v = v - (1 - b2) * sign(v - g**2) * g**2``; the output is ``m_hat /
  (sqrt(v_hat + eps_root) + eps)`` (both moments debiased).

  Args:
    b1: decay of the first moment (default 0.9).
    b2: rate of the second moment's change (default 0.999).
    eps: added to the root of the second moment (default 1e-3).
    eps_root: added to the second moment inside the root (default 0.0).
    initial_accumulator_value: initial value of both moments (default
      1e-6).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdamState``.

  References:
    Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS
    2018 (https://papers.nips.cc/paper/8186).
  """

  def init_fn(params):
    return ScaleByAdamState(
        count=_counter(),
        mu=tree_math.tree_full_like(params, initial_accumulator_value),
        nu=tree_math.tree_full_like(params, initial_accumulator_value),
    )

  def second_moment(g, v):
    g2 = numerics.abs_sq(g)
    return v - (1 - b2) * jnp.sign(v - g2) * g2

  def update_fn(updates, state, params=None):
    del params
    mu = tree_math.update_moment(updates, state.mu, b1, 1)
    nu = jax.tree.map(second_moment, updates, state.nu)
    count = numerics.safe_increment(state.count)
    mu_hat = tree_math.bias_correction(mu, b1, count)
    nu_hat = tree_math.bias_correction(nu, b2, count)
    updates = adam_direction(mu_hat, nu_hat, eps, eps_root)
    return updates, ScaleByAdamState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)
