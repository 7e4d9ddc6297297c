"""Schedule-free learning: interpolation and averaging instead of momentum.

Same names, signatures, defaults, state and numbers as ``optax.contrib``'s
schedule-free transformations (0.2.8). The sequence ``z`` is a copy of the
params, so it is sharded like them; the rest of the state is scalars.
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src import typed_layouts
from shardopt._src.aliases import gradient_descent
from shardopt._src.transforms import rms
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.tree_dtypes_random import tree_dtype
from shardopt._src.wrappers import combine
from shardopt.schedules import warmup_constant_schedule

__all__ = [
    "ScheduleFreeState",
    "schedule_free",
    "schedule_free_adamw",
    "schedule_free_eval_params",
    "schedule_free_sgd",
]


class ScheduleFreeState(NamedTuple):
  """Interpolation weight, averaging weights and the ``z`` sequence."""

  b1: jax.Array
  weight_sum: jax.Array
  step_count: jax.Array  # int32 scalar, starts at 1
  max_lr: jax.Array
  base_optimizer_state: base.OptState
  z: base.Params


def _x_from_y(y, z, b1):
  """The averaged iterate x, recovered from y = b1 x + (1 - b1) z."""
  return jax.tree.map(lambda yi, zi: (yi - (1.0 - b1) * zi) / b1, y, z)


def schedule_free_eval_params(state: base.OptState, params: base.Params):
  """The params to evaluate at (the averaged sequence x) for the state of
  ``schedule_free`` and the current params (the sequence y), each in its
  param's layout where Explicit axes type the params (``z`` may be split
  otherwise, e.g. by ZeRO, and the model expects the params')."""
  b1, z = getattr(state, "b1", None), getattr(state, "z", None)
  if b1 is None or z is None:
    raise ValueError("schedule_free_eval_params needs the ScheduleFreeState "
                     "of schedule_free (it has fields b1 and z); got "
                     f"{type(state).__name__}")
  return jax.tree.map(typed_layouts.laid_out_like, _x_from_y(params, z, b1), params)


def _averaging_weight(lr, state, weight_lr_power):
  """max_lr, the new weight sum and c_k = w_k / sum of weights (NaN-safe)."""
  max_lr = jnp.maximum(state.max_lr, lr)
  weight = max_lr**weight_lr_power
  weight_sum = state.weight_sum + weight
  ck = jnp.where(
      jnp.logical_or(jnp.isnan(weight), jnp.isnan(weight_sum)),
      jnp.full(weight.shape, jnp.nan),
      jnp.nan_to_num(weight / weight_sum, nan=0.0, posinf=jnp.inf))
  return max_lr, weight_sum, ck


def schedule_free(
    base_optimizer: base.GradientTransformation,
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    weight_lr_power: jax.typing.ArrayLike = 2.0,
    state_dtype: Any | None = None,
) -> base.GradientTransformationExtraArgs:
  """Makes ``base_optimizer`` (without momentum) schedule-free.

  With ``y`` the params, ``z`` the base optimizer's iterates and ``x`` their
  weighted average: ``z <- z + base_update(grad at y)``,
  ``x <- (1 - c) x + c z`` with ``c = lr_max^p / sum of lr_max^p``, and the
  params become ``y = b1 x + (1 - b1) z``. Evaluate at
  ``schedule_free_eval_params(state, params)`` (x). ``b1`` must be > 0.

  Args:
    base_optimizer: the optimizer that moves ``z`` (momentum switched off).
    learning_rate: its learning rate, constant after warmup (no decay).
    b1: interpolation between x and z.
    weight_lr_power: the power p of the averaging weights.
    state_dtype: dtype of ``z`` (default: the params').

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ScheduleFreeState``.

  References:
    Defazio et al., "The Road Less Scheduled", NeurIPS 2024
    (https://arxiv.org/abs/2405.15682).
  """
  base_optimizer = base.with_extra_args_support(base_optimizer)

  def init_fn(params):
    dtype = tree_dtype(params, "lowest")
    z = params if state_dtype is None else tree_math.tree_cast(params,
                                                               state_dtype)
    return ScheduleFreeState(
        b1=jnp.asarray(b1, dtype), weight_sum=jnp.zeros([], dtype),
        step_count=jnp.ones([], jnp.int32), max_lr=jnp.zeros([], dtype),
        base_optimizer_state=base_optimizer.init(params),
        z=jax.tree.map(lambda t: t.copy(), z))  # a distinct buffer to donate

  def update_fn(grads, state, params=None, **extra_args):
    lr = learning_rate
    if callable(learning_rate):
      lr = jnp.asarray(learning_rate(state.step_count), state.max_lr.dtype)
    max_lr, weight_sum, ck = _averaging_weight(lr, state, weight_lr_power)
    base_updates, base_state = base_optimizer.update(
        grads, state.base_optimizer_state, params, **extra_args)
    z = tree_math.apply_updates(state.z, base_updates)
    x = jax.tree.map(lambda xi, zi: (1.0 - ck) * xi + ck * zi,
                     _x_from_y(params, state.z, b1), z)
    new_params = jax.tree.map(lambda xi, zi: b1 * xi + (1.0 - b1) * zi, x, z)
    return tree_math.tree_sub(new_params, params), ScheduleFreeState(
        b1=state.b1, weight_sum=weight_sum,
        step_count=numerics.safe_increment(state.step_count), max_lr=max_lr,
        base_optimizer_state=base_state, z=z)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def _with_warmup(learning_rate, warmup_steps):
  if warmup_steps is None:
    return learning_rate
  return warmup_constant_schedule(init_value=0, peak_value=learning_rate,
                                  warmup_steps=warmup_steps)


def schedule_free_sgd(
    learning_rate: jax.typing.ArrayLike = 1.0,
    warmup_steps: int | None = None,
    b1: jax.typing.ArrayLike = 0.9,
    weight_decay: jax.typing.ArrayLike | None = None,
    weight_lr_power: jax.typing.ArrayLike = 2.0,
    state_dtype: Any | None = None,
) -> base.GradientTransformationExtraArgs:
  """Schedule-free SGD (``schedule_free`` of plain SGD).

  Args:
    learning_rate: SGD's learning rate.
    warmup_steps: length of a linear warmup from 0, or None.
    b1: interpolation between the averaged and the SGD iterates (> 0).
    weight_decay: weight decay added to the gradient before SGD, or None.
    weight_lr_power: the power of the averaging weights.
    state_dtype: dtype of the ``z`` sequence.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ScheduleFreeState``.

  References:
    Defazio et al., "The Road Less Scheduled", NeurIPS 2024
    (https://arxiv.org/abs/2405.15682).
  """
  learning_rate = _with_warmup(learning_rate, warmup_steps)
  optimizer = gradient_descent.sgd(learning_rate)
  if weight_decay is not None:
    optimizer = combine.chain(
        weight_decay_lib.add_decayed_weights(weight_decay), optimizer)
  return schedule_free(optimizer, learning_rate=learning_rate, b1=b1,
                       weight_lr_power=weight_lr_power,
                       state_dtype=state_dtype)


def schedule_free_adamw(
    learning_rate: jax.typing.ArrayLike = 0.0025,
    warmup_steps: int | None = None,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_lr_power: jax.typing.ArrayLike = 2.0,
    state_dtype: Any | None = None,
) -> base.GradientTransformationExtraArgs:
  """Schedule-free AdamW: AdamW without its first moment, made schedule-free
  (the debiased RMS scaling with ``eps`` outside the root, as Adam's).

  Args:
    learning_rate: AdamW's learning rate.
    warmup_steps: length of a linear warmup from 0, or None.
    b1: interpolation between the averaged and the AdamW iterates (> 0).
    b2: decay of the second moment.
    eps: added to the root of the second moment.
    weight_decay: decoupled weight decay.
    weight_lr_power: the power of the averaging weights.
    state_dtype: dtype of the ``z`` sequence.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``ScheduleFreeState``.

  References:
    Defazio et al., "The Road Less Scheduled", NeurIPS 2024
    (https://arxiv.org/abs/2405.15682).
  """
  learning_rate = _with_warmup(learning_rate, warmup_steps)
  optimizer = combine.chain(
      rms.scale_by_rms(decay=b2, eps=eps, eps_in_sqrt=False,
                       bias_correction=True),
      weight_decay_lib.add_decayed_weights(weight_decay),
      scaling.scale_by_learning_rate(learning_rate))
  return schedule_free(optimizer, learning_rate=learning_rate, b1=b1,
                       weight_lr_power=weight_lr_power,
                       state_dtype=state_dtype)
