"""trax's Adafactor: factored second moments over the last two dimensions.

Part of the trax-semantics family (``shardopt.trax_adam``, ``trax_momentum``,
``trax_rmsprop``, ``trax_adafactor``, ``trax_sm3``). Its row/column statistics
are means of the param's ``zeros_like``, so they keep the mesh axis of the
dimension they keep; they are float32 at least (as trax keeps its factored
statistics) whatever the params' dtype, and every state leaf keeps its
dtype across steps.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics

__all__ = [
    "TraxAdafactorState",
    "trax_adafactor",
]


@moments.declare_moments(v_row=moments.NONNEGATIVE, v_col=moments.NONNEGATIVE,
                         v=moments.NONNEGATIVE, momentum=moments.SIGNED)
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


def _weight_decay_at(count, rate, n_steps):
  """trax's decay rate at step ``count`` (from 0): ``rate`` when ``n_steps``
  is None or below 1, else ``rate * max(n_steps - count, 0) / n_steps``,
  a linear ramp to 0 over the first ``n_steps`` steps."""
  if n_steps is None:
    return rate
  ramp = rate * jnp.maximum(n_steps - count, 0) / jnp.maximum(n_steps, 1)
  return jnp.where(n_steps < 1, rate, ramp)


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
  ``w <- (1 - wd_t) w - step``, where ``wd_t = wd * max(n - t, 0) / n`` for
  ``n = weight_decay_n_steps`` of at least 1 (``wd`` when ``n`` is below 1 or
  None), as trax.

  Args:
    learning_rate: a scalar or a schedule of the step count (default 0.05).
    factored: whether to factor the second moment of arrays of rank >= 2
      (default True).
    multiply_by_parameter_scale: whether to scale the step by
      ``max(rms(w), epsilon2)`` (default True).
    do_clipping: whether to clip ``y`` to block RMS ``clipping_threshold``
      (default True).
    do_momentum: whether to average the steps with ``beta1`` (default
      False).
    momentum_in_bfloat16: whether the momentum is stored in bfloat16
      (default False).
    beta1: the momentum's decay (default 0.0).
    decay_rate: exponent of the second moment's decay (default 0.8).
    clipping_threshold: the block RMS ``y`` is clipped to (default 1.0).
    weight_decay_rate: the decay rate ``wd`` (default 1e-5).
    weight_decay_n_steps: ramp the decay rate linearly down to 0 over this
      many steps when at least 1; below 1 or ``None`` (default 0), decay at
      the full rate at every step.
    epsilon1: added to the squared gradients (default 1e-16).
    epsilon2: floor of the param RMS in the param scale (default 1e-3).

  Returns:
    A ``GradientTransformation`` whose state is a ``TraxAdafactorState``.

  References:
    Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
    Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235); trax's
    ``trax.optimizers.Adafactor``.
  """
  momentum_dtype = jnp.bfloat16 if momentum_in_bfloat16 else jnp.float32

  def init_fn(params):
    def slot(make, condition):
      return jax.tree.map(lambda p: make(p) if condition(p) else None, params)

    is_factored = lambda p: _is_factored(p, factored)
    zeros = lambda p: jnp.zeros_like(p, jnp.promote_types(p.dtype, jnp.float32))
    return TraxAdafactorState(
        count=jnp.zeros([], jnp.int32),
        v_row=slot(lambda p: zeros(p).mean(axis=-1), is_factored),
        v_col=slot(lambda p: zeros(p).mean(axis=-2), is_factored),
        v=slot(zeros, lambda p: not is_factored(p)),
        momentum=slot(lambda p: jnp.zeros_like(p, momentum_dtype), lambda p: do_momentum),
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
    lr = base.value_at(learning_rate, count)
    decay = _weight_decay_at(count, weight_decay_rate, weight_decay_n_steps)

    def per_param(g, w, v_row, v_col, v, m):
      old = (v_row, v_col, v)
      y, v_row, v_col, v = second_moment_direction(g, v_row, v_col, v, rho)
      v_row, v_col, v = (None if x is None else x.astype(o.dtype)
                         for x, o in zip((v_row, v_col, v), old))
      if do_clipping:
        y = y / jnp.maximum(1.0, jnp.sqrt(jnp.mean(y * y)) / clipping_threshold)
      scale = lr
      if multiply_by_parameter_scale:
        scale = scale * jnp.maximum(jnp.sqrt(jnp.mean(w * w)), epsilon2)
      step = scale * y
      if m is not None:
        step = beta1 * m.astype(step.dtype) + (1.0 - beta1) * step
        m = step.astype(momentum_dtype)
      return (-step - decay * w).astype(g.dtype), v_row, v_col, v, m

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
