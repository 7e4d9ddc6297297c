"""Schedules: functions of the step count giving a hyperparameter's value.

Same names, signatures and values as ``optax.schedules``. Every schedule is a
pure jnp function of ``count`` (a Python int or a traced int32 scalar).
"""

from typing import Sequence

import jax
import jax.numpy as jnp

from shardopt._src import base

__all__ = [
    "constant_schedule",
    "cosine_decay_schedule",
    "exponential_decay",
    "join_schedules",
    "linear_schedule",
    "piecewise_constant_schedule",
    "piecewise_interpolate_schedule",
    "polynomial_schedule",
]


def constant_schedule(value: jax.typing.ArrayLike) -> base.Schedule:
  """``value`` at every step.

  Args:
    value: the constant.

  Returns:
    A schedule ``count -> value``.
  """
  return lambda count: value


def join_schedules(
    schedules: Sequence[base.Schedule], boundaries: Sequence[int]
) -> base.Schedule:
  """``schedules[i]`` from ``boundaries[i - 1]`` on, counting from there.

  Args:
    schedules: the schedules, in order.
    boundaries: the steps where the next schedule takes over; one entry
      fewer than ``schedules``.

  Returns:
    A schedule; at ``count >= boundaries[i - 1]`` (the last such ``i``) it
    is ``schedules[i](count - boundaries[i - 1])``.
  """

  def schedule(count):
    value = schedules[0](count)
    for boundary, later in zip(boundaries, schedules[1:]):
      value = jnp.where(count < boundary, value, later(count - boundary))
    return value

  return schedule


def polynomial_schedule(
    init_value: jax.typing.ArrayLike,
    end_value: jax.typing.ArrayLike,
    power: jax.typing.ArrayLike,
    transition_steps: int,
    transition_begin: int = 0,
) -> base.Schedule:
  """From ``init_value`` to ``end_value`` along ``(1 - t / T) ** power``.

  Held at ``init_value`` for ``transition_begin`` steps, then moves over
  ``transition_steps`` steps and stays at ``end_value``.

  Args:
    init_value: the value before and at the start of the transition.
    end_value: the value after it.
    power: the polynomial's power.
    transition_steps: ``T``; a non-positive value gives a constant schedule.
    transition_begin: steps before the transition starts (default 0; a
      negative value counts as 0).

  Returns:
    A schedule ``count -> (init_value - end_value) * (1 - t / T) ** power
    + end_value`` with ``t = clip(count - transition_begin, 0, T)``.
  """
  if transition_steps <= 0:
    return constant_schedule(init_value)
  transition_begin = max(transition_begin, 0)

  def schedule(count):
    progress = jnp.clip(count - transition_begin, 0, transition_steps)
    remaining = 1 - progress / transition_steps
    return (init_value - end_value) * (remaining**power) + end_value

  return schedule


def linear_schedule(
    init_value: jax.typing.ArrayLike,
    end_value: jax.typing.ArrayLike,
    transition_steps: int,
    transition_begin: int = 0,
) -> base.Schedule:
  """From ``init_value`` to ``end_value`` linearly: the polynomial schedule of power 1.

  Args:
    init_value: the value before and at the start of the transition.
    end_value: the value after it.
    transition_steps: the transition's length; a non-positive value gives a
      constant schedule.
    transition_begin: steps before the transition starts (default 0).

  Returns:
    A schedule.
  """
  return polynomial_schedule(
      init_value, end_value, 1, transition_steps, transition_begin)


def _check_scales(name: str, scales) -> None:
  negative = [s for s in scales if not s >= 0.0]
  if negative:
    raise ValueError(
        f"{name} expects non-negative scale factors in boundaries_and_scales,"
        f" got {negative}: use scales >= 0 (each multiplies the value)."
    )


def piecewise_constant_schedule(
    init_value: jax.typing.ArrayLike,
    boundaries_and_scales: dict[int, float] | None = None,
) -> base.Schedule:
  """``init_value`` times every scale whose boundary step has been reached.

  Args:
    init_value: the value before the first boundary.
    boundaries_and_scales: maps a step to the factor applied from that step
      on; ``None`` (default) for none. A negative scale raises ValueError.

  Returns:
    A schedule.
  """
  jumps = sorted((boundaries_and_scales or {}).items())
  _check_scales("piecewise_constant_schedule", [s for _, s in jumps])

  def schedule(count):
    value = init_value
    for boundary, scale in jumps:
      # A float step function of the count (1 before the boundary, 0 from
      # it) blends the two values: the value's dtype promotes with the
      # count's floats as optax's does (an int init_value gives floats).
      before = jnp.maximum(0.0, jnp.sign(boundary - count))
      value = value * before + (1 - before) * scale * value
    return value

  return schedule


def exponential_decay(
    init_value: jax.typing.ArrayLike,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: jax.typing.ArrayLike | None = None,
) -> base.Schedule:
  """``init_value * decay_rate ** ((count - transition_begin) / transition_steps)``.

  The value is ``init_value`` until ``transition_begin``.

  Args:
    init_value: the initial value.
    transition_steps: steps per factor of ``decay_rate``; a non-positive
      value gives a constant schedule.
    decay_rate: the factor per ``transition_steps``; 0 gives a constant
      schedule.
    transition_begin: steps before the decay starts (default 0; a negative
      value counts as 0).
    staircase: whether the exponent is floored, so the value drops in steps
      (default False).
    end_value: bound of the value (below when ``decay_rate < 1``, above
      otherwise); ``None`` (default) for none.

  Returns:
    A schedule.
  """
  if transition_steps <= 0 or decay_rate == 0:
    return constant_schedule(init_value)
  transition_begin = max(transition_begin, 0)
  bound = jnp.maximum if decay_rate < 1.0 else jnp.minimum

  def schedule(count):
    elapsed = count - transition_begin
    exponent = elapsed / transition_steps
    if staircase:
      exponent = jnp.floor(exponent)
    value = jnp.where(
        elapsed <= 0, init_value, init_value * jnp.power(decay_rate, exponent))
    return value if end_value is None else bound(value, end_value)

  return schedule


def cosine_decay_schedule(
    init_value: jax.typing.ArrayLike,
    decay_steps: int,
    alpha: jax.typing.ArrayLike = 0.0,
    exponent: jax.typing.ArrayLike = 1.0,
) -> base.Schedule:
  """Half a cosine from ``init_value`` to ``alpha * init_value``.

  The value is ``init_value * ((1 - alpha) * c**exponent + alpha)`` with
  ``c = (1 + cos(pi * min(count, decay_steps) / decay_steps)) / 2``.

  Args:
    init_value: the initial value.
    decay_steps: the decay's length; not positive raises ValueError.
    alpha: the final value as a fraction of ``init_value`` (default 0.0).
    exponent: the power of the cosine factor (default 1.0).

  Returns:
    A schedule.

  References:
    Loshchilov & Hutter, "SGDR: Stochastic Gradient Descent with Warm
    Restarts", ICLR 2017 (https://arxiv.org/abs/1608.03983).
  """
  if not decay_steps > 0:
    raise ValueError(
        f"cosine_decay_schedule needs decay_steps > 0, got {decay_steps}.")
  # Python ints become floats so that large counts cannot overflow int32.
  steps = float(decay_steps) if isinstance(decay_steps, int) else decay_steps

  def schedule(count):
    count = float(count) if isinstance(count, int) else count
    count = jnp.minimum(count, steps)
    cosine = 0.5 * (1 + jnp.cos(jnp.pi * count / steps))
    return init_value * ((1 - alpha) * cosine**exponent + alpha)

  return schedule


def _interpolate_linear(start, end, fraction):
  return (end - start) * fraction + start


def _interpolate_cosine(start, end, fraction):
  return end + (start - end) / 2.0 * (jnp.cos(jnp.pi * fraction) + 1)


def piecewise_interpolate_schedule(
    interpolate_type: str,
    init_value: jax.typing.ArrayLike,
    boundaries_and_scales: dict[int, float] | None = None,
) -> base.Schedule:
  """Interpolates (``"linear"`` or ``"cosine"``) between cumulatively scaled values.

  At boundary ``b_i`` the value is ``init_value`` times the scales of all
  boundaries up to ``b_i``; between boundaries it is interpolated, and after
  the last it stays.

  Args:
    interpolate_type: ``"linear"`` or ``"cosine"``; another value raises
      ValueError.
    init_value: the value at step 0.
    boundaries_and_scales: maps a step to the factor the value reaches
      there; ``None`` (default) for a constant. A negative scale raises
      ValueError.

  Returns:
    A schedule.
  """
  interpolators = {"linear": _interpolate_linear, "cosine": _interpolate_cosine}
  if interpolate_type not in interpolators:
    raise ValueError(
        "piecewise_interpolate_schedule: interpolate_type must be 'linear' or "
        f"'cosine', got {interpolate_type!r}.")
  interpolate = interpolators[interpolate_type]
  jumps = sorted((boundaries_and_scales or {}).items())
  _check_scales("piecewise_interpolate_schedule", [s for _, s in jumps])
  boundaries = tuple(b for b, _ in jumps)
  scales = tuple(s for _, s in jumps)

  def schedule(count):
    starts = jnp.stack((0,) + boundaries)
    values = jnp.cumprod(jnp.stack((init_value,) + scales))
    lengths = jnp.maximum(starts[1:] - starts[:-1], 1)
    inside = (starts[:-1] <= count) & (count < starts[1:])
    fractions = (count - starts[:-1]) / lengths
    pieces = interpolate(values[:-1], values[1:], fractions)
    within = jnp.sum(jnp.where(inside, pieces, 0))
    return within + (starts[-1] <= count) * values[-1]

  return schedule
