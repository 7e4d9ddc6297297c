"""SOAP: Adam in the eigenbasis of blocked Shampoo statistics.

For a param of rank ``k >= 2`` cut into blocks (see ``_blocking``), each block
keeps per dimension the statistic ``L_i <- s L_i + (1 - s) G_(i) G_(i)^T``
(``s = shampoo_beta``) and its eigenvectors ``Q_i``, recomputed every
``precondition_frequency`` steps from ``start_preconditioning_step`` on, at
the end of the step (the identity before): a step rotates by the eigenbases of
earlier gradients, as in the authors' code (the eigenbasis of the current
gradient alone would make the rotated gradient diagonal, and the Adam ratio
of its zero off-diagonal entries noise). The first moment ``m`` is kept in
the param's coordinates;
the gradient and ``m`` are rotated into the eigenbasis
(``G' = G x_1 Q_1^T ... x_k Q_k^T``), the second moment ``v`` is kept there,
and the Adam step ``m'_hat / (sqrt(v_hat) + eps)`` is rotated back. This is
Algorithm 3 of Vyas et al. with an eigendecomposition at each refresh in
place of their one step of power iteration. Params of rank < 2 take Adam
steps. On Auto mesh axes a refresh all-gathers the statistics; on Explicit
axes each device decomposes its own blocks (see _matrix_roots).
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine
from shardopt.contrib import _blocking as blocking
from shardopt.contrib import _matrix_roots as roots

__all__ = ["SoapState", "scale_by_soap", "soap"]


class SoapState(NamedTuple):
  """State of ``scale_by_soap``; per param, ``()`` where a part is unused."""

  count: jax.Array  # int32 scalar: steps taken
  mu: Any  # per param: first moment, in the param's coordinates
  nu: Any  # per param: second moment, in each block's eigenbasis
  stats: Any  # per param: one (n_1..n_k, b_i, b_i) statistic per dimension
  bases: Any  # per param: the statistics' eigenvectors, like stats


def _rotate(blocks, bases, back: bool = False):
  """Into the eigenbasis (``Q^T`` along every dimension), or ``back``."""
  for i, q in enumerate(bases):
    blocks = blocking.apply_along(q, blocks, i, transpose=not back)
  return blocks


def scale_by_soap(
    block_size: int = 128,
    max_shards: int | None = None,
    b1: float = 0.95,
    b2: float = 0.95,
    eps: float = 1e-8,
    shampoo_beta: float | None = None,
    precondition_frequency: int = 10,
    start_preconditioning_step: int = 1,
) -> base.GradientTransformation:
  """Rescales updates by Adam run in the eigenbasis of Shampoo's statistics.

  Args:
    block_size: the longest block along any dimension. Blocks must tile
      the param's shards (``init`` raises, naming the param, when not).
    max_shards: the most devices any dimension is split over (None: all
      devices). Each dimension ``d`` is cut into a multiple of
      ``gcd(d, max_shards)`` blocks, so blocks tile every even split of it
      (see ``block_layout``).
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to the square root of the bias-corrected second moment.
    shampoo_beta: decay of the Shampoo statistics; ``None`` uses ``b2``.
    precondition_frequency: steps between recomputations of the eigenbases.
    start_preconditioning_step: the step (1-based) at whose end the
      eigenbases are first computed; it and earlier steps are Adam steps.

  Returns:
    A ``GradientTransformation`` whose state is a ``SoapState``.

  References:
    Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", 2024
    (https://arxiv.org/abs/2409.11321).
  """
  if block_size < 1 or precondition_frequency < 1 or start_preconditioning_step < 1:
    raise ValueError(
        f"block_size={block_size}, precondition_frequency="
        f"{precondition_frequency} and start_preconditioning_step="
        f"{start_preconditioning_step} must all be positive integers.")
  beta = b2 if shampoo_beta is None else shampoo_beta

  def init_param(path, p):
    zeros = jnp.zeros_like(p)
    if not blocking.is_blocked(p.shape):
      return zeros, zeros, (), ()
    block = blocking.block_sizes(p.shape, block_size, max_shards)
    blocking.check_aligned(jax.tree_util.keystr(path), p, block)
    blocks = blocking.to_blocks(p, block)
    stats = tuple(jnp.zeros_like(blocking.gram(blocks, i))
                  for i in range(p.ndim))
    return zeros, zeros, stats, tuple(blocking.eye_like(s) for s in stats)

  def init_fn(params):
    per_param = jax.tree_util.tree_map_with_path(init_param, params)
    return SoapState(jnp.zeros([], jnp.int32),
                     *blocking.unzip(params, per_param, 4))

  def update_param(g, mu, nu, stats, bases, count):
    mu = b1 * mu + (1.0 - b1) * g
    corrected_mu = mu / (1.0 - b1 ** count.astype(g.dtype))
    bias_nu = 1.0 - b2 ** count.astype(g.dtype)
    if not blocking.is_blocked(g.shape):
      nu = b2 * nu + (1.0 - b2) * numerics.abs_sq(g)
      return corrected_mu / (jnp.sqrt(nu / bias_nu) + eps), mu, nu, stats, bases
    block = tuple(s.shape[-1] for s in stats)
    blocks = blocking.to_blocks(g, block)
    rotated = _rotate(blocks, bases)
    nu = b2 * nu + (1.0 - b2) * blocking.from_blocks(rotated * rotated, g)
    step = (_rotate(blocking.to_blocks(corrected_mu, block), bases)
            / (jnp.sqrt(blocking.to_blocks(nu, block) / bias_nu) + eps))
    direction = blocking.from_blocks(_rotate(step, bases, back=True), g)
    stats = tuple(beta * s + (1.0 - beta) * blocking.gram(blocks, i)
                  for i, s in enumerate(stats))
    bases = jax.lax.cond(
        blocking.refresh_due(count, start_preconditioning_step,
                             precondition_frequency),
        lambda: tuple(roots.eigenbasis(s) for s in stats), lambda: bases)
    return direction, mu, nu, stats, bases

  def update_fn(updates, state, params=None):
    del params
    count = numerics.safe_increment(state.count)
    per_param = jax.tree.map(
        lambda g, *rest: update_param(g, *rest, count), updates, state.mu,
        state.nu, state.stats, state.bases)
    direction, *rest = blocking.unzip(updates, per_param, 5)
    return direction, SoapState(count, *rest)

  return base.GradientTransformation(init_fn, update_fn)


def soap(
    learning_rate: base.ScalarOrSchedule,
    block_size: int = 128,
    max_shards: int | None = None,
    b1: float = 0.95,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: base.ScalarOrSchedule = 0.01,
    shampoo_beta: float | None = None,
    precondition_frequency: int = 10,
    start_preconditioning_step: int = 1,
) -> base.GradientTransformation:
  """SOAP with decoupled weight decay and a learning rate.

  The update is ``-learning_rate * (d + weight_decay * param)``, ``d`` the
  direction of ``scale_by_soap``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    block_size: the longest block along any dimension (see
      ``scale_by_soap``).
    max_shards: the most devices any dimension is split over (None: all).
    b1: decay of the first moment.
    b2: decay of the second moment.
    eps: added to the square root of the bias-corrected second moment.
    weight_decay: decoupled weight decay (a scalar or a schedule).
    shampoo_beta: decay of the Shampoo statistics; ``None`` uses ``b2``.
    precondition_frequency: steps between recomputations of the eigenbases.
    start_preconditioning_step: the step at whose end the eigenbases are
      first computed.

  Returns:
    A ``GradientTransformation`` (a ``chain``).

  References:
    Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", 2024
    (https://arxiv.org/abs/2409.11321).
  """
  return combine.chain(
      scale_by_soap(block_size, max_shards, b1, b2, eps, shampoo_beta,
                    precondition_frequency, start_preconditioning_step),
      weight_decay_lib.add_decayed_weights(weight_decay),
      scaling.scale_by_learning_rate(learning_rate))
