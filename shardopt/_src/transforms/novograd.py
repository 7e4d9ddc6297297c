"""NovoGrad: Adam-like updates with one second moment per param (layer).

The first moment is ``zeros_like`` the params; the second is one scalar per
param (the EMA of its squared gradient norm), replicated.
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
    "ScaleByNovogradState",
    "scale_by_novograd",
]


@moments.declare_moments(mu=moments.SIGNED, nu=moments.NONNEGATIVE)
class ScaleByNovogradState(NamedTuple):
  """Step count, first moment ``mu`` and one second moment ``nu`` per param."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates


def scale_by_novograd(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.25,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    weight_decay: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
) -> base.GradientTransformation:
  """NovoGrad's direction: steps normalised by one second moment per layer.

  ``nu = b2 * nu + (1 - b2) * ||g||**2`` is a scalar per param (replicated);
  the step ``g / (sqrt(nu + eps_root) + eps) + weight_decay * p`` goes into a
  momentum ``mu = b1 * mu + step``, which is the output. The first step
  takes both moments from the gradient, undecayed. ``update`` raises
  ValueError without params.

  Args:
    b1: decay of the momentum (default 0.9).
    b2: decay of the per-param second moment (default 0.25).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    weight_decay: rate of ``weight_decay * params`` added to each step
      (default 0.0).
    mu_dtype: dtype of the momentum; ``None`` (default) uses the params'
      dtype.

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByNovogradState``.

  References:
    Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive
    Moments for Training of Deep Networks", 2019
    (https://arxiv.org/abs/1905.11286).
  """
  mu_dtype = canonical_dtype(mu_dtype)

  def init_fn(params):
    # nu is one scalar per param (a norm), replicated on every device.
    nu = jax.tree.map(lambda p: jnp.zeros([], p.dtype), params)
    return ScaleByNovogradState(
        count=jnp.zeros([], jnp.int32), mu=tree_math.tree_zeros_like(params, dtype=mu_dtype), nu=nu
    )

  def sq_norm(g):
    return jnp.linalg.norm(g) ** 2

  def normalized(g, p, v):
    return g / (jnp.sqrt(v + eps_root) + eps) + weight_decay * p

  def first_nu(grads, nu):
    return jax.tree.map(lambda g, v: sq_norm(g).astype(v.dtype), grads, nu)

  def later_nu(grads, nu):
    return jax.tree.map(lambda g, v: (1 - b2) * sq_norm(g) + b2 * v, grads, nu)

  def first_mu(steps, mu):
    del mu
    return steps

  def later_mu(steps, mu):
    return jax.tree.map(lambda s, m: b1 * m + s, steps, mu)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "scale_by_novograd needs the params: call update(updates, state,"
          " params)"
      )
    count = numerics.safe_increment(state.count)
    first = count == 1
    # The first step takes the moments from the gradient, undecayed. The
    # branches are built once so that eager calls reuse their compilation.
    nu = jax.lax.cond(first, first_nu, later_nu, updates, state.nu)
    steps = jax.tree.map(normalized, updates, params, nu)
    mu = jax.lax.cond(first, first_mu, later_mu, steps, state.mu)
    mu = tree_math.tree_cast(mu, mu_dtype)
    return mu, ScaleByNovogradState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)
