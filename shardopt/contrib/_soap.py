"""SOAP: Adam in the eigenbasis of blocked Shampoo statistics.

For a param of rank ``k >= 2`` cut into blocks (see ``_blocking``), each block
keeps per dimension the statistic ``L_i <- s L_i + (1 - s) G_(i) G_(i)^T``
(``s = shampoo_beta``) and an eigenbasis ``Q_i`` of it, refreshed every
``precondition_frequency`` steps from ``start_preconditioning_step`` on, at
the end of the step (the identity before): a step rotates by the eigenbases of
earlier gradients, as in the authors' code (the eigenbasis of the current
gradient alone would make the rotated gradient diagonal, and the Adam ratio
of its zero off-diagonal entries noise). The first moment ``m`` is kept in
the param's coordinates; the gradient and ``m`` are rotated into the
eigenbasis (``G' = G x_1 Q_1^T ... x_k Q_k^T``), the second moment ``v`` is
kept there, and the Adam step ``m'_hat / (sqrt(v_hat) + eps)`` is rotated
back. This is Algorithm 3 of Vyas et al.: the first refresh decomposes the
statistics (``eigh``); later ones sort the last basis by its estimated
eigenvalues ``diag(Q^T L Q)`` (descending, ``v`` permuted with it) and take
one step of power iteration and a QR decomposition from it. That keeps each
eigenvector near the last one where eigenvalues are close: an ``eigh`` at
every refresh picks such eigenvectors anew from rounding, and ``v``, kept in
the last basis, then scales the wrong directions. Params of rank < 2 take
Adam steps.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import state_structure
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine
from shardopt.contrib import _blocking as blocking
from shardopt.contrib import _matrix_roots as roots
from shardopt.contrib._blockwise import blockwise
from shardopt.contrib._shampoo import DEFAULT_BLOCK_SIZE

__all__ = ["SoapState", "scale_by_soap", "soap"]


# Only nu is declared a moment, and mu kept: quantized_state keeps mu in
# float and says why. mu is rotated into the eigenbasis and divided there by
# sqrt(nu), which its rounding, spread over each block's coordinates, does
# not survive where nu is small: with mu quantized at 8 bits soap's update
# moved 7-35% off float state's in 5 steps (soap(0.1) and soap(0.01),
# default and 16-wide blocks, a (64, 128) param), with nu alone quantized
# 1.2-1.9% at 8 bits and 12-20% at 4 (tests/test_quantized_state.py).
@moments.declare_moments(nu=moments.NONNEGATIVE, kept={
    "mu": "kept in float: rotated into the eigenbasis and divided there by"
          " sqrt(nu), its rounding grows where nu is small"})
class SoapState(NamedTuple):
  """State of ``scale_by_soap``; per param, ``()`` where a part is unused
  (under ``quantized_state``, ``nu`` is quantized and ``mu`` kept in float)."""

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


def _padding_last(stat, shape, block, dim):
  """``stat`` with ``-(trace + tiny)`` on the diagonal at the padding of
  dimension ``dim``: below every eigenvalue of the rest (>= 0), so the
  padding's eigenvectors are unit vectors, sorted last in descending order,
  and the real ones those of the unpadded block."""
  pad = blocking.padding(shape, block, dim)
  if pad is None:
    return stat
  k = len(shape)
  diagonal = pad[:, :, None] * np.eye(block[dim], dtype=bool)  # (n, b, b)
  diagonal = diagonal.reshape([pad.shape[0] if i == dim else 1 for i in range(k)]
                              + [block[dim]] * 2)
  trace = blockwise(_trace, k, stat)  # one block at a time: the same sums anywhere
  return stat - diagonal * (trace + jnp.finfo(stat.dtype).tiny)


def _trace(block):
  return jnp.trace(block).reshape(1, 1)


def _refresh(stats, bases, nu, first):
  """New eigenbases, descending, and ``nu`` in their order (``first``: by
  ``eigh``; later: the old basis sorted by ``diag(Q^T L Q)`` and ``nu`` with
  it, then one power-iteration step and QR, as Vyas et al.)."""
  nu_blocks = blocking.to_blocks(nu, tuple(s.shape[-1] for s in stats))
  new = []
  for i, (stat, basis) in enumerate(zip(stats, bases)):
    def by_eigh(nu_blocks, stat=stat):
      return jnp.flip(roots.eigenbasis(stat), -1), nu_blocks

    def by_power_step(nu_blocks, stat=stat, basis=basis, i=i):
      basis, order = blockwise(_power_step, stat.ndim - 2, stat, basis)
      return basis, blocking.apply_along(order, nu_blocks, i,
                                         transpose=True).astype(nu_blocks.dtype)

    basis, nu_blocks = jax.lax.cond(first, by_eigh, by_power_step, nu_blocks)
    new.append(basis)
  return tuple(new), blocking.from_blocks(nu_blocks, nu)


def _power_step(stat, basis):
  """For one block: (QR of ``L Q S``, ``S``), ``S`` sorting ``Q``'s columns
  by ``diag(Q^T L Q)``, descending (ties by index)."""
  order = _descending(jnp.sum(basis * (stat @ basis), axis=0))
  return roots.orthonormal(stat @ (basis @ order)), order


def _descending(values):
  """The permutation matrix ``S`` (``S[j, r] = 1`` where ``values[j]`` has
  rank ``r``, ties by index) that sorts columns descending: ``X S``."""
  j = jnp.arange(values.shape[0])
  above = values[None, :] > values[:, None]  # [j, l]: v_l > v_j
  tied = (values[None, :] == values[:, None]) & (j[None, :] < j[:, None])
  rank = jnp.sum(above | tied, axis=1)
  return (rank[:, None] == j).astype(values.dtype)


def scale_by_soap(
    block_size: int = DEFAULT_BLOCK_SIZE,
    b1: float = 0.95,
    b2: float = 0.95,
    eps: float = 1e-8,
    shampoo_beta: float | None = None,
    precondition_frequency: int = 10,
    start_preconditioning_step: int = 1,
) -> base.GradientTransformation:
  """Rescales updates by Adam run in the eigenbasis of Shampoo's statistics.

  Args:
    block_size: the longest block along any dimension: a dimension of length
      ``d`` is cut into ``ceil(d / block_size)`` equal blocks (the last one
      zero-padded where they do not divide ``d``; ``block_layout`` states
      the layout), whatever the mesh. Where it divides the length of a
      dimension's shards, the sharded step adds no collective to the
      gradient's. Default 64, as ``scale_by_shampoo``'s (see there).
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

  def init_param(p):
    zeros = jnp.zeros_like(p)
    if not blocking.is_blocked(p.shape):
      return zeros, zeros, (), ()
    blocks = blocking.to_blocks(blocking.in_statistics_dtype(p),
                                blocking.block_sizes(p.shape, block_size))
    stats = tuple(jnp.zeros_like(blocking.gram(blocks, i))
                  for i in range(p.ndim))
    return zeros, zeros, stats, tuple(blocking.eye_like(s) for s in stats)

  def init_fn(params):
    per_param = jax.tree.map(init_param, params)
    return SoapState(jnp.zeros([], jnp.int32),
                     *blocking.unzip(params, per_param, 4))

  def update_param(g, mu, nu, stats, bases, count):
    mu = b1 * mu + (1.0 - b1) * g
    # Debiasing multiplies by reciprocals: XLA rewrites a division by a
    # scalar so in some programs and not others (1 ulp apart).
    corrected_mu = mu * (1 / (1 - b1 ** count)).astype(g.dtype)
    debias_nu = (1 / (1 - b2 ** count)).astype(g.dtype)
    if not blocking.is_blocked(g.shape):
      nu = b2 * nu + (1.0 - b2) * numerics.abs_sq(g)
      return corrected_mu / (jnp.sqrt(nu * debias_nu) + eps), mu, nu, stats, bases
    block = tuple(s.shape[-1] for s in stats)
    blocks = blocking.to_blocks(blocking.in_statistics_dtype(g), block)
    rotated = _rotate(blocks, bases)
    nu = (b2 * nu + (1.0 - b2) * blocking.from_blocks(rotated * rotated, g)
          ).astype(nu.dtype)
    step = (_rotate(blocking.to_blocks(corrected_mu, block), bases)
            / (jnp.sqrt(blocking.to_blocks(nu, block) * debias_nu) + eps))
    mask = blocking.real_mask(g.shape, block)
    if mask is not None:  # padding's eigenvectors come last: drop them
      step = jnp.where(mask, step, 0.0)
    direction = blocking.from_blocks(_rotate(step, bases, back=True),
                                     g).astype(g.dtype)
    stats = tuple(beta * s + (1.0 - beta) * blocking.gram(blocks, i)
                  for i, s in enumerate(stats))
    marked = tuple(_padding_last(s, g.shape, block, i) for i, s in enumerate(stats))
    bases, nu = jax.lax.cond(
        blocking.refresh_due(count, start_preconditioning_step,
                             precondition_frequency),
        lambda: _refresh(marked, bases, nu, count == start_preconditioning_step),
        lambda: (bases, nu))
    return direction, mu, nu, stats, bases

  @state_structure.conforming(init_fn)
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
    block_size: int = DEFAULT_BLOCK_SIZE,
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
    block_size: the longest block along any dimension, default 64 (see
      ``scale_by_soap``).
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
      scale_by_soap(block_size, b1, b2, eps, shampoo_beta,
                    precondition_frequency, start_preconditioning_step),
      weight_decay_lib.add_decayed_weights(weight_decay),
      scaling.scale_by_learning_rate(learning_rate))
