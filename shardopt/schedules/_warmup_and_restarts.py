"""Schedules: functions of the step count giving a hyperparameter's value.

Same names, signatures and values as ``optax.schedules``. Every schedule is a
pure jnp function of ``count`` (a Python int or a traced int32 scalar).
"""

from typing import Iterable

import jax

from shardopt._src import base
from shardopt.schedules._decay import cosine_decay_schedule
from shardopt.schedules._decay import exponential_decay
from shardopt.schedules._decay import join_schedules
from shardopt.schedules._decay import linear_schedule
from shardopt.schedules._decay import piecewise_interpolate_schedule

__all__ = [
    "cosine_onecycle_schedule",
    "linear_onecycle_schedule",
    "sgdr_schedule",
    "warmup_constant_schedule",
    "warmup_cosine_decay_schedule",
    "warmup_exponential_decay_schedule",
]


def _check_transition_steps(name: str, transition_steps: int) -> None:
  if transition_steps <= 0:
    raise ValueError(
        f"{name} needs transition_steps > 0, got {transition_steps}.")


def linear_onecycle_schedule(
    transition_steps: int,
    peak_value: jax.typing.ArrayLike,
    pct_start: float = 0.3,
    pct_final: float = 0.85,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> base.Schedule:
  """One cycle in three linear phases: up to the peak, back, then down.

  From ``peak_value / div_factor`` up to ``peak_value`` at ``pct_start *
  transition_steps``, back to ``peak_value / div_factor`` at ``pct_final *
  transition_steps``, then down to ``peak_value / (div_factor *
  final_div_factor)`` at ``transition_steps``.

  Args:
    transition_steps: the cycle's length; not positive raises ValueError.
    peak_value: the largest value.
    pct_start: fraction of the cycle spent rising (default 0.3).
    pct_final: fraction of the cycle at which the descent ends (default
      0.85).
    div_factor: ``peak_value / div_factor`` is the starting value (default
      25.0).
    final_div_factor: the final value is the starting value divided by this
      (default 1e4).

  Returns:
    A schedule.

  References:
    Smith & Topin, "Super-Convergence: Very Fast Training of Neural Networks
    Using Large Learning Rates", 2017 (https://arxiv.org/abs/1708.07120).
  """
  _check_transition_steps("linear_onecycle_schedule", transition_steps)
  return piecewise_interpolate_schedule("linear", peak_value / div_factor, {
      int(pct_start * transition_steps): div_factor,
      int(pct_final * transition_steps): 1.0 / div_factor,
      transition_steps: 1.0 / final_div_factor,
  })


def cosine_onecycle_schedule(
    transition_steps: int,
    peak_value: jax.typing.ArrayLike,
    pct_start: float = 0.3,
    div_factor: float = 25.0,
    final_div_factor: float = 1e4,
) -> base.Schedule:
  """One cycle of cosine interpolation: up to the peak, then down.

  From ``peak_value / div_factor`` up to ``peak_value`` at ``pct_start *
  transition_steps``, then down to ``peak_value / (div_factor *
  final_div_factor)`` at ``transition_steps``.

  Args:
    transition_steps: the cycle's length; not positive raises ValueError.
    peak_value: the largest value.
    pct_start: fraction of the cycle spent rising (default 0.3).
    div_factor: ``peak_value / div_factor`` is the starting value (default
      25.0).
    final_div_factor: the final value is the starting value divided by this
      (default 1e4).

  Returns:
    A schedule.

  References:
    Smith & Topin, "Super-Convergence: Very Fast Training of Neural Networks
    Using Large Learning Rates", 2017 (https://arxiv.org/abs/1708.07120).
  """
  _check_transition_steps("cosine_onecycle_schedule", transition_steps)
  return piecewise_interpolate_schedule("cosine", peak_value / div_factor, {
      int(pct_start * transition_steps): div_factor,
      int(transition_steps): 1.0 / (div_factor * final_div_factor),
  })


def warmup_constant_schedule(
    init_value: jax.typing.ArrayLike,
    peak_value: jax.typing.ArrayLike,
    warmup_steps: int,
) -> base.Schedule:
  """Linear warmup to ``peak_value``, then constant.

  Args:
    init_value: the value at step 0.
    peak_value: the value from ``warmup_steps`` on.
    warmup_steps: the warmup's length.

  Returns:
    A schedule.

  References:
    Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1
    Hour", 2017 (https://arxiv.org/abs/1706.02677) (gradual warmup).
  """
  return linear_schedule(init_value, peak_value, warmup_steps)


def warmup_cosine_decay_schedule(
    init_value: jax.typing.ArrayLike,
    peak_value: jax.typing.ArrayLike,
    warmup_steps: int,
    decay_steps: int,
    end_value: jax.typing.ArrayLike = 0.0,
    exponent: jax.typing.ArrayLike = 1.0,
) -> base.Schedule:
  """Linear warmup, then cosine decay to ``end_value``.

  Args:
    init_value: the value at step 0.
    peak_value: the value at the end of the warmup.
    warmup_steps: the warmup's length.
    decay_steps: the total length, warmup included.
    end_value: the value at ``decay_steps`` and after (default 0.0).
    exponent: the power of the cosine factor (default 1.0).

  Returns:
    A schedule.

  References:
    Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm
    Restarts", ICLR 2017 (https://arxiv.org/abs/1608.03983); Goyal et al.,
    "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour", 2017
    (https://arxiv.org/abs/1706.02677) (warmup).
  """
  alpha = 0.0 if peak_value == 0.0 else end_value / peak_value
  return join_schedules([
      linear_schedule(init_value, peak_value, warmup_steps),
      cosine_decay_schedule(
          peak_value, decay_steps - warmup_steps, alpha, exponent),
  ], [warmup_steps])


def warmup_exponential_decay_schedule(
    init_value: jax.typing.ArrayLike,
    peak_value: jax.typing.ArrayLike,
    warmup_steps: int,
    transition_steps: int,
    decay_rate: jax.typing.ArrayLike,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: jax.typing.ArrayLike | None = None,
) -> base.Schedule:
  """Linear warmup, then ``exponential_decay`` from ``peak_value``.

  Args:
    init_value: the value at step 0.
    peak_value: the value at the end of the warmup.
    warmup_steps: the warmup's length.
    transition_steps: steps per factor of ``decay_rate`` (after the
      warmup).
    decay_rate: the decay factor.
    transition_begin: steps after the warmup before the decay starts
      (default 0).
    staircase: whether the value drops in steps (default False).
    end_value: bound of the value; ``None`` (default) for none.

  Returns:
    A schedule.
  """
  return join_schedules([
      linear_schedule(init_value, peak_value, warmup_steps),
      exponential_decay(
          peak_value, transition_steps, decay_rate, transition_begin,
          staircase, end_value),
  ], [warmup_steps])


def sgdr_schedule(
    cosine_kwargs: Iterable[dict[str, jax.typing.ArrayLike]],
) -> base.Schedule:
  """Warm restarts: warmup-cosine cycles, one per dict of keyword arguments.

  Args:
    cosine_kwargs: dicts of ``warmup_cosine_decay_schedule``'s arguments,
      one per cycle; each cycle lasts its ``decay_steps``.

  Returns:
    A schedule joining the cycles.

  References:
    Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm
    Restarts", ICLR 2017 (https://arxiv.org/abs/1608.03983).
  """
  schedules, ends, end = [], [], 0
  for kwargs in cosine_kwargs:
    schedules.append(warmup_cosine_decay_schedule(**kwargs))
    end += kwargs["decay_steps"]
    ends.append(end)
  return join_schedules(schedules, ends[:-1])
