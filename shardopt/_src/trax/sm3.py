"""trax's SM3: per-dimension max covers with EMA, heavy-ball or Nesterov momentum.

Part of the trax-semantics family (``shardopt.trax_adam``, ``trax_momentum``,
``trax_rmsprop``, ``trax_adafactor``, ``trax_sm3``). Each
cover is a max-reduction of the param's ``zeros_like`` over the other axes,
so it keeps its own dimension's mesh axis.
"""

import enum
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import state_structure

__all__ = [
    "MomentumType",
    "TraxSM3State",
    "trax_sm3",
]


class MomentumType(enum.IntEnum):
  """trax's SM3 momentum variants."""

  EMA = 1
  HEAVY_BALL = 2
  NESTEROV = 3


@moments.declare_moments(momentum=moments.SIGNED, covers=moments.NONNEGATIVE,
                         graft_covers=moments.NONNEGATIVE)
class TraxSM3State(NamedTuple):
  """Step count, momentum and, per param, one max-cover per dimension; with
  ``second_moment_averaging != 1``, AdaGrad's covers too (``graft_covers``,
  else None)."""

  count: jax.Array
  momentum: Any
  covers: Any
  graft_covers: Any = None


def _covers_of(p) -> tuple:
  """Per-dimension covers: reductions of the param over all other axes."""
  if jnp.ndim(p) == 0:
    return (jnp.zeros_like(p),)
  axes = range(jnp.ndim(p))
  return tuple(
      jnp.zeros_like(p).max(axis=tuple(a for a in axes if a != i)) for i in axes
  )


def _accumulator_from_covers(covers, ndim: int) -> jax.Array:
  """The elementwise minimum of the covers broadcast to the param's shape."""
  if ndim == 0:
    return covers[0]
  expanded = [
      jnp.expand_dims(c, tuple(a for a in range(ndim) if a != i))
      for i, c in enumerate(covers)
  ]
  accumulator = expanded[0]
  for cover in expanded[1:]:
    accumulator = jnp.minimum(accumulator, cover)
  return accumulator


def _preconditioned(g, accumulator) -> jax.Array:
  """``g / sqrt(accumulator)``, 0 where the accumulator is 0."""
  safe = jnp.where(accumulator > 0, accumulator, 1.0)
  return jnp.where(accumulator > 0, g * jax.lax.rsqrt(safe), 0.0)


def _new_covers(accumulator, ndim: int) -> tuple:
  if ndim == 0:
    return (accumulator,)
  axes = range(ndim)
  return tuple(
      accumulator.max(axis=tuple(a for a in axes if a != i)) for i in axes
  )


def trax_sm3(
    learning_rate: base.ScalarOrSchedule = 0.01,
    momentum: float = 0.9,
    second_moment_averaging: float = 1.0,
    weight_decay: float = 0.0,
    momentum_type: MomentumType = MomentumType.EMA,
) -> base.GradientTransformation:
  """trax's SM3: cover-based adaptive rates with a choice of momentum.

  Per param: ``a = min_i cover_i`` (broadcast), ``a <- beta2 a + c g^2`` with
  ``beta2 = second_moment_averaging`` and ``c = 1`` when ``beta2 == 1`` else
  ``1 - beta2``; ``pg = g / sqrt(a)`` (0 where ``a == 0``) ``+ weight_decay
  w``; momentum: EMA ``m <- b m + (1 - b) pg``, step ``m``; heavy ball ``m
  <- b m + pg``, step ``m``; Nesterov ``m <- b m + pg``, step ``b m + pg``;
  ``w <- w - lr * step``; each cover becomes the max of ``a`` over the other
  dimensions. With ``beta2 != 1`` trax grafts: before the weight decay,
  ``pg`` is scaled to the norm (over the param) of AdaGrad's ``g / sqrt(s)``,
  ``s = min_i graft_cover_i + g^2`` from plain-sum covers kept alongside.

  Args:
    learning_rate: a scalar or a schedule of the step count (default 0.01).
    momentum: the momentum's decay ``b`` (default 0.9).
    second_moment_averaging: ``beta2`` (default 1.0: a plain sum, as in the
      paper).
    weight_decay: rate of ``weight_decay * w`` added to ``pg`` (default
      0.0).
    momentum_type: ``MomentumType.EMA`` (default), ``HEAVY_BALL`` or
      ``NESTEROV``.

  Returns:
    A ``GradientTransformation`` whose state is a ``TraxSM3State``.

  References:
    Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019
    (https://arxiv.org/abs/1901.11150); trax's ``trax.optimizers.SM3``.
  """
  beta2 = second_moment_averaging
  graft = beta2 != 1.0
  gain = 1.0 - beta2 if graft else 1.0

  def init_fn(params):
    return TraxSM3State(
        count=jnp.zeros([], jnp.int32),
        momentum=jax.tree.map(jnp.zeros_like, params),
        covers=jax.tree.map(_covers_of, params),
        graft_covers=jax.tree.map(_covers_of, params) if graft else None,
    )

  def momentum_step(pg, m):
    if momentum_type == MomentumType.EMA:
      m = momentum * m + (1.0 - momentum) * pg
      return m, m
    m = momentum * m + pg
    if momentum_type == MomentumType.NESTEROV:
      return momentum * m + pg, m
    return m, m

  @state_structure.conforming(init_fn)
  def update_fn(updates, state, params=None):
    if weight_decay and params is None:
      raise ValueError("trax_sm3 with weight_decay needs params")
    lr = base.value_at(learning_rate, state.count)
    leaves, treedef = jax.tree.flatten(updates)
    weights = treedef.flatten_up_to(params) if params is not None else [None] * len(leaves)
    moms = treedef.flatten_up_to(state.momentum)
    covers = treedef.flatten_up_to(state.covers)
    grafts = (treedef.flatten_up_to(state.graft_covers) if graft
              else [None] * len(leaves))

    def per_param(g, w, m, cover, graft_cover):
      accumulator = beta2 * _accumulator_from_covers(cover, g.ndim) + gain * numerics.abs_sq(g)
      pg = _preconditioned(g, accumulator)
      if graft:
        plain = _accumulator_from_covers(graft_cover, g.ndim) + numerics.abs_sq(g)
        norm = jnp.linalg.norm(_preconditioned(g, plain))
        pg = pg * (norm / (jnp.linalg.norm(pg) + 1e-16))
        graft_cover = _new_covers(plain, g.ndim)
      if weight_decay:
        pg = pg + weight_decay * w
      step, m = momentum_step(pg, m)
      return -lr * step, m, _new_covers(accumulator, g.ndim), graft_cover

    results = [per_param(*args) for args in zip(leaves, weights, moms, covers, grafts)]
    unflatten = lambda i: treedef.unflatten([r[i] for r in results])
    new_state = TraxSM3State(
        numerics.safe_increment(state.count), unflatten(1), unflatten(2),
        unflatten(3) if graft else None)
    return unflatten(0), new_state

  return base.GradientTransformation(init_fn, update_fn)
