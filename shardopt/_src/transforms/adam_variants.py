"""Adam's relatives: Adadelta, Adan, Adamax, AMSGrad, AdaBelief and Yogi.

Each keeps per-coordinate moments built with ``zeros_like``/``full_like`` of
the params, so the state carries the params' shardings.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.adam import ScaleByAdamState
from shardopt._src.transforms.adam import adam_direction
from shardopt._src.transforms.adam import debiased_first_moment
from shardopt._src.transforms.momentum import canonical_dtype

__all__ = [
    "ScaleByAdaDeltaState",
    "ScaleByAdanState",
    "ScaleByAmsgradState",
    "ScaleByBeliefState",
    "scale_by_adadelta",
    "scale_by_adamax",
    "scale_by_adan",
    "scale_by_amsgrad",
    "scale_by_belief",
    "scale_by_yogi",
]


def _counter() -> jax.Array:
  return jnp.zeros([], jnp.int32)


class ScaleByAdaDeltaState(NamedTuple):
  """Running averages of squared gradients ``e_g`` and squared updates ``e_x``."""

  e_g: base.Updates
  e_x: base.Updates


def scale_by_adadelta(
    rho: jax.typing.ArrayLike = 0.9, eps: jax.typing.ArrayLike = 1e-6
) -> base.GradientTransformation:
  """Adadelta: g * sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps).

  Reference: Zeiler, ADADELTA: An Adaptive Learning Rate Method, 2012
  (https://arxiv.org/abs/1212.5701).
  """

  def init_fn(params):
    return ScaleByAdaDeltaState(
        e_g=tree_math.tree_zeros_like(params), e_x=tree_math.tree_zeros_like(params)
    )

  def update_fn(updates, state, params=None):
    del params
    e_g = tree_math.update_moment(updates, state.e_g, rho, 2)
    updates = jax.tree.map(
        lambda g, sq_g, sq_x: jnp.sqrt(sq_x + eps) / jnp.sqrt(sq_g + eps) * g,
        updates,
        e_g,
        state.e_x,
    )
    e_x = tree_math.update_moment(updates, state.e_x, rho, 2)
    return updates, ScaleByAdaDeltaState(e_g=e_g, e_x=e_x)

  return base.GradientTransformation(init_fn, update_fn)


class ScaleByAdanState(NamedTuple):
  """Moments of gradients ``m``, of gradient differences ``v``, of the
  squared corrected gradient ``n``, the previous gradient ``g`` and step ``t``."""

  m: base.Updates
  v: base.Updates
  n: base.Updates
  g: base.Updates
  t: jax.Array  # int32 scalar


def scale_by_adan(
    b1: jax.typing.ArrayLike = 0.98,
    b2: jax.typing.ArrayLike = 0.92,
    b3: jax.typing.ArrayLike = 0.99,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
) -> base.GradientTransformation:
  """Adan: Nesterov-style momentum estimated from gradient differences.

  Reference: Xie et al., Adan: Adaptive Nesterov Momentum Algorithm for Faster
  Optimizing Deep Models, 2022 (https://arxiv.org/abs/2208.06677), Alg. 1.
  """

  def init_fn(params):
    zeros = lambda: tree_math.tree_zeros_like(params)  # noqa: E731
    return ScaleByAdanState(m=zeros(), v=zeros(), n=zeros(), g=zeros(),
                            t=_counter())

  def update_fn(updates, state, params=None):
    del params
    first = state.t == 0
    diff = jax.tree.map(
        lambda g, prev: jnp.where(first, jnp.zeros_like(g), g - prev),
        updates, state.g,
    )
    m = tree_math.update_moment(updates, state.m, b1, 1)
    v = tree_math.update_moment(diff, state.v, b2, 1)
    corrected = jax.tree.map(lambda g, d: g + (1 - b2) * d, updates, diff)
    n = tree_math.update_moment_per_elem_norm(corrected, state.n, b3, 2)
    t = numerics.safe_increment(state.t)
    m_hat = tree_math.bias_correction(m, b1, t)
    v_hat = tree_math.bias_correction(v, b2, t)
    n_hat = tree_math.bias_correction(n, b3, t)
    direction = jax.tree.map(lambda a, b: a + (1 - b2) * b, m_hat, v_hat)
    direction = adam_direction(direction, n_hat, eps, eps_root)
    return direction, ScaleByAdanState(m=m, v=v, n=n, g=updates, t=t)

  return base.GradientTransformation(init_fn, update_fn)


def scale_by_adamax(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
) -> base.GradientTransformation:
  """Adamax: Adam with the infinity norm as second moment (not debiased).

  Reference: Kingma & Ba, Adam: A Method for Stochastic Optimization, 2014
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
  """AMSGrad: Adam dividing by the running maximum of the second moment.

  The bias corrections can be switched off to follow the paper exactly.

  Reference: Reddi et al., On the Convergence of Adam and Beyond, 2018
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
  """AdaBelief: divides by the EMA of (g - mu)^2, the "belief" in the gradient.

  Reference: Zhuang et al., AdaBelief Optimizer: Adapting Stepsizes by the
  Belief in Observed Gradients, 2020 (https://arxiv.org/abs/2010.07468).
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
  """Yogi: an additive (sign-controlled) second-moment update.

  Both moments start at ``initial_accumulator_value``.

  Reference: Zaheer et al., Adaptive Methods for Nonconvex Optimization, 2018
  (https://papers.nips.cc/paper/8186-adaptive-methods-for-nonconvex-optimization).
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
