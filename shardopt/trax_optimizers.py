"""trax's optimizers with trax's semantics, as gradient transformations.

Where trax differs from optax, these keep trax's behaviour under separate
names (``trax_adam``, ``trax_momentum``, ``trax_rmsprop``, ``trax_adafactor``,
``trax_sm3``) and trax's defaults. Each returns *updates* (the negative step):
``apply_updates(params, updates)`` gives trax's new weights. Counters start at
0, so trax's ``step`` is the number of updates applied before this one.

Differences from the optax aliases of the same family:
- weight decay is decoupled and *not* scaled by the learning rate:
  ``w <- (1 - weight_decay_rate) * w - step`` (Adam, Momentum, Adafactor);
- Adafactor factors every array of rank >= 2 over its last two dimensions
  (optax factors the two largest dimensions of arrays whose second-largest is
  at least ``min_dim_size_to_factor``), adds ``epsilon1`` to the squared
  gradient, clips the update RMS only when ``do_clipping``, optionally keeps
  bfloat16 momentum, and can stop weight decay after ``weight_decay_n_steps``;
- RMSProp starts its mean square at one and divides by ``sqrt(v) + eps``;
- SM3 offers EMA, heavy-ball and Nesterov momentum, an averaging factor for the
  second moments (1.0 = AdaGrad-style sums) and weight decay added to the
  preconditioned gradient.

References: Kingma & Ba 2014 (Adam); Sutskever et al. 2013 (momentum);
Shazeer & Stern 2018, https://arxiv.org/abs/1804.04235 (Adafactor);
Anil et al. 2019, https://arxiv.org/abs/1901.11150 (SM3).
"""

import enum
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from shardopt import base
from shardopt import numerics
from shardopt.accumulation import trace
from shardopt.adaptive import scale_by_adam, scale_by_rms
from shardopt.clipping import clip_by_global_norm
from shardopt.combine import chain
from shardopt.scaling import scale_by_learning_rate
from shardopt.weight_decay import add_decayed_weights

__all__ = [
    "MomentumType",
    "TraxAdafactorState",
    "TraxSM3State",
    "trax_adafactor",
    "trax_adam",
    "trax_momentum",
    "trax_rmsprop",
    "trax_sm3",
]


def _optional_clip(clip_grad_norm):
  return [] if clip_grad_norm is None else [clip_by_global_norm(clip_grad_norm)]


def _decoupled_decay(weight_decay_rate):
  """Adds ``-rate * w`` to updates that are already negative steps."""
  return [] if not weight_decay_rate else [add_decayed_weights(-weight_decay_rate)]


def trax_adam(
    learning_rate: base.ScalarOrSchedule = 1e-4,
    weight_decay_rate: float = 1e-5,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-5,
    clip_grad_norm: float | None = None,
) -> base.GradientTransformation:
  """trax's Adam: ``w <- (1 - wd) w - lr * m_hat / (sqrt(v_hat) + eps)``.

  Gradients are first clipped to global norm ``clip_grad_norm`` when given.

  Reference: Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2014
  (https://arxiv.org/abs/1412.6980); decoupled decay as in Loshchilov &
  Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
  (https://arxiv.org/abs/1711.05101).
  """
  return chain(
      *_optional_clip(clip_grad_norm),
      scale_by_adam(b1=b1, b2=b2, eps=eps),
      scale_by_learning_rate(learning_rate),
      *_decoupled_decay(weight_decay_rate),
  )


def trax_momentum(
    learning_rate: base.ScalarOrSchedule = 0.01,
    mass: float = 0.9,
    weight_decay_rate: float = 1e-5,
    nesterov: bool = True,
) -> base.GradientTransformation:
  """trax's momentum SGD, Nesterov by default.

  ``v <- mass * v + g``; the step is ``mass * v + g`` (Nesterov) or ``v``;
  ``w <- (1 - wd) w - lr * step``.

  References: Sutskever et al., "On the importance of initialization and
  momentum in deep learning", ICML 2013
  (https://proceedings.mlr.press/v28/sutskever13.html); Nesterov's form as in
  Bengio et al., "Advances in Optimizing Recurrent Networks", 2012
  (https://arxiv.org/abs/1212.0901).
  """
  return chain(
      trace(decay=mass, nesterov=nesterov),
      scale_by_learning_rate(learning_rate),
      *_decoupled_decay(weight_decay_rate),
  )


def trax_rmsprop(
    learning_rate: base.ScalarOrSchedule = 1e-3,
    gamma: float = 0.9,
    eps: float = 1e-8,
    clip_grad_norm: float | None = None,
) -> base.GradientTransformation:
  """trax's RMSProp: ``v <- gamma v + (1 - gamma) g^2`` from ``v = 1``.

  ``w <- w - lr * g / (sqrt(v) + eps)``.

  Reference: Tieleman & Hinton, "Lecture 6.5 - rmsprop", Coursera: Neural
  Networks for Machine Learning, 2012
  (https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf).
  """
  return chain(
      *_optional_clip(clip_grad_norm),
      scale_by_rms(decay=gamma, eps=eps, initial_scale=1.0, eps_in_sqrt=False),
      scale_by_learning_rate(learning_rate),
  )


def _value_at(hyperparam, count):
  return hyperparam(count) if callable(hyperparam) else hyperparam


class TraxAdafactorState(NamedTuple):
  """Step count, factored (v_row, v_col) or full (v) moments, momentum.

  Per param, the slots it does not use are None.
  """

  count: jax.Array
  v_row: Any
  v_col: Any
  v: Any
  momentum: Any


def _is_factored(param, factored: bool) -> bool:
  return factored and jnp.ndim(param) >= 2


def trax_adafactor(
    learning_rate: base.ScalarOrSchedule = 0.05,
    factored: bool = True,
    multiply_by_parameter_scale: bool = True,
    do_clipping: bool = True,
    do_momentum: bool = False,
    momentum_in_bfloat16: bool = False,
    beta1: float = 0.0,
    decay_rate: float = 0.8,
    clipping_threshold: float = 1.0,
    weight_decay_rate: float = 1e-5,
    weight_decay_n_steps: int | None = 0,
    epsilon1: float = 1e-16,
    epsilon2: float = 1e-3,
) -> base.GradientTransformation:
  """trax's Adafactor: factored second moments, update clipping, param scale.

  At step t (from 0): ``rho = 1 - (t + 1) ** -decay_rate``; the second moment
  of ``g^2 + epsilon1`` is averaged with ``rho``, factored over the last two
  dimensions for arrays of rank >= 2; ``y = g / sqrt(v_hat)``, divided by
  ``max(1, rms(y) / clipping_threshold)`` when ``do_clipping``; the step is
  ``lr * max(rms(w), epsilon2) * y`` (the param scale only when
  ``multiply_by_parameter_scale``), averaged with ``beta1`` when
  ``do_momentum`` (momentum kept in bfloat16 when ``momentum_in_bfloat16``);
  ``w <- (1 - wd) w - step``, with decay only for steps
  ``t < weight_decay_n_steps`` when that is positive (always when 0 or None).

  Reference: Shazeer & Stern, "Adafactor: Adaptive Learning Rates with
  Sublinear Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235).
  """
  momentum_dtype = jnp.bfloat16 if momentum_in_bfloat16 else jnp.float32

  def init_fn(params):
    def slot(make, condition):
      return jax.tree.map(lambda p: make(p) if condition(p) else None, params)

    is_factored = lambda p: _is_factored(p, factored)
    zeros = jnp.zeros_like
    return TraxAdafactorState(
        count=jnp.zeros([], jnp.int32),
        v_row=slot(lambda p: zeros(p).mean(axis=-1), is_factored),
        v_col=slot(lambda p: zeros(p).mean(axis=-2), is_factored),
        v=slot(zeros, lambda p: not is_factored(p)),
        momentum=slot(lambda p: zeros(p, dtype=momentum_dtype), lambda p: do_momentum),
    )

  def second_moment_direction(g, v_row, v_col, v, rho):
    grad_sq = numerics.abs_sq(g) + epsilon1
    if v is None:
      v_row = rho * v_row + (1 - rho) * grad_sq.mean(axis=-1)
      v_col = rho * v_col + (1 - rho) * grad_sq.mean(axis=-2)
      row_factor = jax.lax.rsqrt(v_row / v_row.mean(axis=-1, keepdims=True))
      col_factor = jax.lax.rsqrt(v_col)
      y = g * row_factor[..., None] * col_factor[..., None, :]
      return y, v_row, v_col, None
    v = rho * v + (1 - rho) * grad_sq
    return g * jax.lax.rsqrt(v), None, None, v

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("trax_adafactor needs params: call update(grads, state, params)")
    count = state.count
    t = count.astype(jnp.float32) + 1.0
    rho = 1.0 - t ** (-decay_rate)
    lr = _value_at(learning_rate, count)
    decay = weight_decay_rate
    if weight_decay_n_steps:
      decay = jnp.where(count < weight_decay_n_steps, weight_decay_rate, 0.0)

    def per_param(g, w, v_row, v_col, v, m):
      y, v_row, v_col, v = second_moment_direction(g, v_row, v_col, v, rho)
      if do_clipping:
        y = y / jnp.maximum(1.0, jnp.sqrt(jnp.mean(y * y)) / clipping_threshold)
      scale = lr
      if multiply_by_parameter_scale:
        scale = scale * jnp.maximum(jnp.sqrt(jnp.mean(w * w)), epsilon2)
      step = scale * y
      if m is not None:
        step = beta1 * m.astype(step.dtype) + (1.0 - beta1) * step
        m = step.astype(momentum_dtype)
      return -step - decay * w, v_row, v_col, v, m

    leaves, treedef = jax.tree.flatten(updates)
    slots = [
        treedef.flatten_up_to(tree)
        for tree in (params, state.v_row, state.v_col, state.v, state.momentum)
    ]
    results = [per_param(g, *s) for g, *s in zip(leaves, *slots)]
    unflatten = lambda i: treedef.unflatten([r[i] for r in results])
    new_state = TraxAdafactorState(
        numerics.safe_increment(count), unflatten(1), unflatten(2), unflatten(3),
        unflatten(4),
    )
    return unflatten(0), new_state

  return base.GradientTransformation(init_fn, update_fn)


class MomentumType(enum.IntEnum):
  """trax's SM3 momentum variants."""

  EMA = 1
  HEAVY_BALL = 2
  NESTEROV = 3


class TraxSM3State(NamedTuple):
  """Step count, momentum and, per param, one max-cover per dimension."""

  count: jax.Array
  momentum: Any
  covers: Any


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
  ``1 - beta2``; ``pg = g / sqrt(a)`` (0 where ``a == 0``) ``+ weight_decay w``;
  momentum: EMA ``m <- b m + (1 - b) pg``, step ``m``; heavy ball
  ``m <- b m + pg``, step ``m``; Nesterov ``m <- b m + pg``, step
  ``b m + pg``; ``w <- w - lr * step``; each cover becomes the max of ``a``
  over the other dimensions.

  Reference: Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS
  2019 (https://arxiv.org/abs/1901.11150).
  """
  beta2 = second_moment_averaging
  gain = 1.0 if beta2 == 1.0 else 1.0 - beta2

  def init_fn(params):
    return TraxSM3State(
        count=jnp.zeros([], jnp.int32),
        momentum=jax.tree.map(jnp.zeros_like, params),
        covers=jax.tree.map(_covers_of, params),
    )

  def momentum_step(pg, m):
    if momentum_type == MomentumType.EMA:
      m = momentum * m + (1.0 - momentum) * pg
      return m, m
    m = momentum * m + pg
    if momentum_type == MomentumType.NESTEROV:
      return momentum * m + pg, m
    return m, m

  def update_fn(updates, state, params=None):
    if weight_decay and params is None:
      raise ValueError("trax_sm3 with weight_decay needs params")
    lr = _value_at(learning_rate, state.count)
    leaves, treedef = jax.tree.flatten(updates)
    weights = treedef.flatten_up_to(params) if params is not None else [None] * len(leaves)
    moms = treedef.flatten_up_to(state.momentum)
    covers = treedef.flatten_up_to(state.covers)

    def per_param(g, w, m, cover):
      accumulator = _accumulator_from_covers(cover, g.ndim)
      accumulator = beta2 * accumulator + gain * numerics.abs_sq(g)
      safe = jnp.where(accumulator > 0, accumulator, 1.0)
      pg = jnp.where(accumulator > 0, g * jax.lax.rsqrt(safe), 0.0)
      if weight_decay:
        pg = pg + weight_decay * w
      step, m = momentum_step(pg, m)
      return -lr * step, m, _new_covers(accumulator, g.ndim)

    results = [per_param(*args) for args in zip(leaves, weights, moms, covers)]
    unflatten = lambda i: treedef.unflatten([r[i] for r in results])
    new_state = TraxSM3State(
        numerics.safe_increment(state.count), unflatten(1), unflatten(2)
    )
    return unflatten(0), new_state

  return base.GradientTransformation(init_fn, update_fn)
