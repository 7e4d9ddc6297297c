"""Blocked Shampoo with grafting, its statistics laid out like the param's shards.

For a param of rank ``k >= 2`` cut into blocks (see ``_blocking``), each block
``G`` keeps one statistic per dimension, ``L_i <- w1 L_i + w2 G_(i) G_(i)^T``
(``w1 = b2, w2 = 1 - b2``; both 1 when ``b2 == 1``, the sums of Gupta et
al.), and every ``precondition_frequency`` steps from
``start_preconditioning_step`` on the preconditioners
``P_i = (L_i + eps lambda_max(L_i) I)^(-1/(2k))``. The preconditioned block is
``G x_1 P_1 ... x_k P_k``, rescaled to the norm of the grafting direction of
the same block (Anil et al. 2020). Params of rank < 2, and every param before
``start_preconditioning_step``, follow the grafting direction.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

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

__all__ = ["ShampooState", "scale_by_shampoo", "shampoo"]

GRAFTING_TYPES = ("adagrad", "rmsprop", "sgd", "none")


@moments.declare_moments(graft=moments.NONNEGATIVE, mu=moments.SIGNED)
class ShampooState(NamedTuple):
  """State of ``scale_by_shampoo``; per param, ``()`` where a part is unused."""

  count: jax.Array  # int32 scalar: steps taken
  stats: Any  # per param: one (n_1..n_k, b_i, b_i) statistic per dimension
  preconditioners: Any  # per param: inverse roots of stats, like stats
  graft: Any  # per param: the grafting accumulator (adagrad, rmsprop)
  mu: Any  # per param: momentum of the direction (b1 > 0)


def _check(block_size, grafting, precondition_frequency, start):
  if grafting not in GRAFTING_TYPES:
    raise ValueError(f"grafting={grafting!r}: expected one of {GRAFTING_TYPES}.")
  if block_size < 1 or precondition_frequency < 1 or start < 1:
    raise ValueError(
        f"block_size={block_size}, precondition_frequency="
        f"{precondition_frequency} and start_preconditioning_step={start} "
        "must all be positive integers.")


def _graft_direction(grafting, g, acc, b2, graft_eps, count):
  """(direction, new accumulator) of the grafting optimizer."""
  if grafting == "adagrad":
    acc = acc + numerics.abs_sq(g)
    return g / (jnp.sqrt(acc) + graft_eps), acc
  if grafting == "rmsprop":
    acc = b2 * acc + (1.0 - b2) * numerics.abs_sq(g)
    # A reciprocal: XLA rewrites a division by a scalar in some programs
    # and not in others (1 ulp apart).
    corrected = acc * (1 / (1 - b2 ** count)).astype(g.dtype)
    return g / (jnp.sqrt(corrected) + graft_eps), acc
  return g, acc


def _graft(blocks, graft_blocks):
  """Each block rescaled to the norm of the grafting direction's block."""
  return blockwise(_graft_block, blocks.ndim // 2, blocks, graft_blocks)


def _graft_block(block, graft_block):
  norm = jnp.sqrt(jnp.sum(block * block))
  target = jnp.sqrt(jnp.sum(graft_block * graft_block))
  return block * jnp.where(norm > 0, target / jnp.where(norm > 0, norm, 1.0), 0.0)


# 64: a 64 x 64 eigendecomposition or QR per block and dimension is cheap on
# any backend, the CPU included (128 x 128 ones, Anil et al.'s size, slowed the
# LM demo's step on 8 simulated devices sharing 2 cores by more than an order
# of magnitude); 64 tiles the shards of power-of-two dimensions split up to
# d / 64 ways (LLaMA-7B's d_model over fsdp=64, tests/test_blocked_any_mesh.py);
# the demo's d_model (64) and head dimensions are whole blocks, its 256-long
# ones 4 blocks. Larger blocks precondition more jointly at O(b) more work per
# element and refresh.
DEFAULT_BLOCK_SIZE = 64


def scale_by_shampoo(
    block_size: int = DEFAULT_BLOCK_SIZE,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    grafting: str = "rmsprop",
    graft_eps: float = 1e-8,
    precondition_frequency: int = 10,
    start_preconditioning_step: int = 1,
    inverse_root_method: str = "eigh",
) -> base.GradientTransformation:
  """Rescales updates by blocked Shampoo preconditioners, with grafting.

  Args:
    block_size: the longest block along any dimension: a dimension of length
      ``d`` is cut into ``ceil(d / block_size)`` equal blocks (the last one
      zero-padded where they do not divide ``d``; ``block_layout`` states
      the layout). The layout, the state's shapes and the numbers depend on
      ``block_size`` and the params only, not on the mesh. Where
      ``block_size`` divides the length of a dimension's shards, every block
      lives on one device and the sharded step adds no collective to the
      gradient's; elsewhere the blocks straddling shards are gathered.
      Default 64: cheap eigendecompositions on any backend, and it tiles
      power-of-two dimensions split up to ``d / 64`` ways (the LM demo's
      d_model, 64, is one block).
    b1: decay of the momentum of the direction (0 for none).
    b2: decay of the statistics and of the rmsprop grafting accumulator;
      1.0 sums the statistics (Gupta et al.).
    eps: the damping added to the statistics' diagonal before the inverse
      root, relative to each block's largest eigenvalue (so the same at any
      scale of the gradients).
    grafting: 'adagrad', 'rmsprop' (bias-corrected), 'sgd' (the gradient's
      norm) or 'none' (the raw preconditioned direction).
    graft_eps: added to the grafting denominator.
    precondition_frequency: steps between recomputations of the
      preconditioners.
    start_preconditioning_step: the first step (1-based) that preconditions;
      earlier steps follow the grafting direction.
    inverse_root_method: 'eigh' (one eigendecomposition per block) or
      'newton' (the coupled Newton iteration of Anil et al., matrix products
      only; a block where it does not converge, or gives a non-finite
      result, keeps its previous preconditioner).

  Returns:
    A ``GradientTransformation`` whose state is a ``ShampooState``.

  References:
    Gupta et al., "Shampoo: Preconditioned Stochastic Tensor Optimization",
    ICML 2018 (https://arxiv.org/abs/1802.09568); Anil et al., "Scalable
    Second Order Optimization for Deep Learning", 2020
    (https://arxiv.org/abs/2002.09018).
  """
  _check(block_size, grafting, precondition_frequency,
         start_preconditioning_step)
  roots.check_method(inverse_root_method)
  w1, w2 = (b2, 1.0 - b2) if b2 != 1.0 else (1.0, 1.0)
  keeps_graft = grafting in ("adagrad", "rmsprop")

  def init_param(p):
    zeros = jnp.zeros_like(p)
    graft, mu = (zeros if keeps_graft else ()), (zeros if b1 else ())
    if not blocking.is_blocked(p.shape):
      return (), (), graft, mu
    blocks = blocking.to_blocks(blocking.in_statistics_dtype(p),
                                blocking.block_sizes(p.shape, block_size))
    stats = tuple(jnp.zeros_like(blocking.gram(blocks, i))
                  for i in range(p.ndim))
    return stats, tuple(blocking.eye_like(s) for s in stats), graft, mu

  def init_fn(params):
    per_param = jax.tree.map(init_param, params)
    return ShampooState(jnp.zeros([], jnp.int32),
                        *blocking.unzip(params, per_param, 4))

  def update_param(g, stats, preconditioners, acc, mu, count):
    direction, acc = _graft_direction(grafting, g, acc, b2, graft_eps, count)
    if blocking.is_blocked(g.shape):
      block = tuple(s.shape[-1] for s in stats)
      blocks = blocking.to_blocks(blocking.in_statistics_dtype(g), block)
      stats = tuple(w1 * s + w2 * blocking.gram(blocks, i)
                    for i, s in enumerate(stats))
      preconditioners = jax.lax.cond(
          blocking.refresh_due(count, start_preconditioning_step,
                               precondition_frequency),
          lambda: tuple(roots.inverse_root(s, 2 * g.ndim, eps,
                                           inverse_root_method, previous)
                        for s, previous in zip(stats, preconditioners)),
          lambda: preconditioners)
      for i, pre in enumerate(preconditioners):
        blocks = blocking.apply_along(pre, blocks, i)
      mask = blocking.real_mask(g.shape, block)
      if mask is not None:  # rounding may leak into the padding
        blocks = jnp.where(mask, blocks, 0.0)
      if grafting != "none":
        blocks = _graft(blocks, blocking.to_blocks(direction, block))
      direction = jnp.where(count >= start_preconditioning_step,
                            blocking.from_blocks(blocks, g).astype(g.dtype),
                            direction)
    if b1:
      mu = b1 * mu + (1.0 - b1) * direction
      direction = mu
    return direction, stats, preconditioners, acc, mu

  @state_structure.conforming(init_fn)
  def update_fn(updates, state, params=None):
    del params
    count = numerics.safe_increment(state.count)
    per_param = jax.tree.map(
        lambda g, *rest: update_param(g, *rest, count), updates, state.stats,
        state.preconditioners, state.graft, state.mu)
    direction, *rest = blocking.unzip(updates, per_param, 5)
    return direction, ShampooState(count, *rest)

  return base.GradientTransformation(init_fn, update_fn)


def shampoo(
    learning_rate: base.ScalarOrSchedule,
    block_size: int = DEFAULT_BLOCK_SIZE,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-6,
    weight_decay: base.ScalarOrSchedule = 0.0,
    grafting: str = "rmsprop",
    graft_eps: float = 1e-8,
    precondition_frequency: int = 10,
    start_preconditioning_step: int = 1,
    inverse_root_method: str = "eigh",
) -> base.GradientTransformation:
  """Blocked Shampoo with grafting, decoupled weight decay and a learning rate.

  The update is ``-learning_rate * (d + weight_decay * param)``, ``d`` the
  direction of ``scale_by_shampoo``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    block_size: the longest block along any dimension, default 64 (see
      ``scale_by_shampoo``).
    b1: decay of the momentum of the direction (0 for none).
    b2: decay of the statistics and of the rmsprop grafting accumulator.
    eps: the damping of the inverse root, relative to each block's largest
      eigenvalue.
    weight_decay: decoupled weight decay (a scalar or a schedule).
    grafting: 'adagrad', 'rmsprop', 'sgd' or 'none'.
    graft_eps: added to the grafting denominator.
    precondition_frequency: steps between recomputations of the
      preconditioners.
    start_preconditioning_step: the first step that preconditions.
    inverse_root_method: 'eigh' or 'newton'.

  Returns:
    A ``GradientTransformation`` (a ``chain``).

  References:
    Gupta et al., "Shampoo: Preconditioned Stochastic Tensor Optimization",
    ICML 2018 (https://arxiv.org/abs/1802.09568); Anil et al., "Scalable
    Second Order Optimization for Deep Learning", 2020
    (https://arxiv.org/abs/2002.09018).
  """
  return combine.chain(
      scale_by_shampoo(block_size, b1, b2, eps, grafting, graft_eps,
                       precondition_frequency, start_preconditioning_step,
                       inverse_root_method),
      weight_decay_lib.add_decayed_weights(weight_decay),
      scaling.scale_by_learning_rate(learning_rate))
