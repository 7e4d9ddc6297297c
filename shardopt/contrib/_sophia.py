"""Sophia: clipped, diagonally preconditioned momentum; Hutchinson's estimate.

Same names, signatures, defaults, states and numbers as ``optax.contrib``'s
``sophia`` and ``hutchinson_estimator_diag_hessian`` (0.2.8). Both moments
are ``zeros_like`` the params and the random probe is drawn in each param's
sharding, so a sharded step never gathers a param.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.transforms.momentum import canonical_dtype
from shardopt._src.tree_dtypes_random import tree_dtype
from shardopt._src.tree_dtypes_random import tree_random_like
from shardopt._src.wrappers import combine

__all__ = [
    "HutchinsonState",
    "SophiaState",
    "hutchinson_estimator_diag_hessian",
    "sophia",
]


class HutchinsonState(NamedTuple):
  """The random key of the next probe."""

  key: jax.Array


def _rademacher_like(key, params):
  """+-1 per element, one split key per leaf, in each leaf's sharding."""
  signs = tree_random_like(key, params, jax.random.rademacher, jnp.float32)
  return tree_math.tree_cast(signs, tree_dtype(params, "lowest"))


def hutchinson_estimator_diag_hessian(random_seed: jax.Array | None = None):
  """The Hessian's diagonal, estimated as ``r * (H r)`` for a random sign
  vector ``r`` (unbiased, high variance).

  Its update needs the params and ``obj_fn=`` (params -> scalar loss) and
  returns the estimate in place of the updates.

  Args:
    random_seed: the PRNG key of the first probe (default PRNGKey(0)).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``HutchinsonState``.

  References:
    Hutchinson, "A stochastic estimator of the trace of the influence matrix
    for Laplacian smoothing splines", Commun. Stat. Simul. Comput. 1990;
    Bekas et al., "An estimator for the diagonal of a matrix", Appl. Numer.
    Math. 2007.
  """

  def init_fn(params):
    del params
    return HutchinsonState(key=jax.random.PRNGKey(0) if random_seed is None
                           else random_seed)

  def update_fn(updates, state, params=None, obj_fn=None, **extra_args):
    del updates, extra_args
    if params is None:
      raise ValueError("hutchinson_estimator_diag_hessian needs the params: "
                       "call update(updates, state, params, obj_fn=...)")
    if obj_fn is None:
      raise ValueError("hutchinson_estimator_diag_hessian needs obj_fn= "
                       "(params -> scalar loss) in update")
    key, probe_key = jax.random.split(state.key)
    signs = _rademacher_like(probe_key, params)
    hvp = jax.jvp(jax.grad(obj_fn), (params,), (signs,))[1]
    return jax.tree.map(lambda h, r: h * r, hvp, signs), HutchinsonState(key)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


# sophia's default estimator: one instance, as optax's default argument is.
_HUTCHINSON = hutchinson_estimator_diag_hessian()


@moments.declare_moments(mu=moments.SIGNED, nu=moments.SIGNED)
class SophiaState(NamedTuple):
  """Step count, momentum, EMA of the Hessian diagonal, estimator state."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  nu: base.Updates
  hessian_fn_state: Any


def _scale_by_sophia(b1, b2, eps, gamma, clip_threshold, update_interval,
                     hessian_diagonal_fn, mu_dtype, verbose,
                     print_win_rate_every_n_steps):
  """Sophia's direction clip(mu_hat / max(gamma h, eps)); h refreshed every
  ``update_interval`` steps from ``hessian_diagonal_fn``."""
  mu_dtype = canonical_dtype(mu_dtype)
  hessian_diagonal_fn = base.with_extra_args_support(hessian_diagonal_fn)

  def init_fn(params):
    return SophiaState(
        count=jnp.zeros([], jnp.int32),
        mu=tree_math.tree_zeros_like(params, dtype=mu_dtype),
        nu=tree_math.tree_zeros_like(params),
        hessian_fn_state=hessian_diagonal_fn.init(params))

  def report_win_rate(updates, count):
    unclipped = sum(jnp.sum(jnp.abs(u) < clip_threshold)
                    for u in jax.tree.leaves(updates))
    size = sum(u.size for u in jax.tree.leaves(updates))
    jax.lax.cond(count % print_win_rate_every_n_steps == 0,
                 lambda: jax.debug.print("Sophia optimizer win rate: {}",
                                         unclipped / size),
                 lambda: None)

  def update_fn(updates, state, params=None, **hessian_fn_kwargs):
    if params is None:
      raise ValueError("sophia needs the params: call "
                       "update(updates, state, params, obj_fn=...)")
    grads = updates
    count = numerics.safe_increment(state.count)
    mu = tree_math.update_moment(grads, state.mu, b1, 1)
    mu_hat = tree_math.bias_correction(mu, b1, count)
    updates = jax.tree.map(lambda m, h: m / jnp.maximum(gamma * h, eps),
                           mu_hat, state.nu)
    if clip_threshold is not None:
      if verbose:
        report_win_rate(updates, count)
      updates = jax.tree.map(
          lambda u: jnp.clip(u, -clip_threshold, clip_threshold), updates)

    def refresh(hessian_state, nu):
      diagonal, hessian_state = hessian_diagonal_fn.update(
          grads, hessian_state, params=params, **hessian_fn_kwargs)
      return hessian_state, tree_math.update_moment(diagonal, nu, b2, 1)

    hessian_state, nu = jax.lax.cond(
        state.count % update_interval == 0, refresh, lambda h, n: (h, n),
        state.hessian_fn_state, state.nu)
    return updates, SophiaState(count=count,
                                mu=tree_math.tree_cast(mu, mu_dtype), nu=nu,
                                hessian_fn_state=hessian_state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def sophia(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.965,
    b2: jax.typing.ArrayLike = 0.99,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 1e-4,
    weight_decay_mask: base.MaskOrFn = None,
    gamma: jax.typing.ArrayLike = 0.01,
    clip_threshold: jax.typing.ArrayLike | None = 1.0,
    update_interval: jax.typing.ArrayLike = 10,
    hessian_diagonal_fn: base.GradientTransformation = _HUTCHINSON,
    mu_dtype: Any | None = None,
    verbose: bool = False,
    print_win_rate_every_n_steps: jax.typing.ArrayLike = 0,
) -> base.GradientTransformationExtraArgs:
  """Sophia: momentum divided by a clipped EMA of the Hessian's diagonal.

  Its update needs the params and whatever ``hessian_diagonal_fn`` needs:
  ``obj_fn=`` (params -> scalar loss) for the default Hutchinson estimator.
  On a mesh the estimate is computed on the sharded params, so it is the
  global (not a per-device) estimate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the momentum.
    b2: decay of the Hessian-diagonal EMA (updated every
      ``update_interval`` steps).
    eps: lower bound of the denominator.
    weight_decay: decoupled weight decay.
    weight_decay_mask: which params decay (tree or function of params).
    gamma: scale of the Hessian diagonal in the denominator.
    clip_threshold: elementwise clip of the direction, or None.
    update_interval: steps between Hessian-diagonal estimates.
    hessian_diagonal_fn: the estimator (a transformation returning the
      diagonal as updates).
    mu_dtype: storage dtype of the momentum.
    verbose: print the fraction of unclipped coordinates.
    print_win_rate_every_n_steps: how often ``verbose`` prints.

  Returns:
    A ``GradientTransformationExtraArgs`` (a chain) whose first state is a
    ``SophiaState``.

  References:
    Liu et al., "Sophia: A Scalable Stochastic Second-order Optimizer for
    Language Model Pre-training", ICLR 2024 (https://arxiv.org/abs/2305.14342).
  """
  return combine.chain(
      _scale_by_sophia(b1, b2, eps, gamma, clip_threshold, update_interval,
                       hessian_diagonal_fn, mu_dtype, verbose,
                       print_win_rate_every_n_steps),
      weight_decay_lib.add_decayed_weights(weight_decay,
                                           mask=weight_decay_mask),
      scaling.scale_by_learning_rate(learning_rate))
