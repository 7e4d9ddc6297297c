"""Recording measurements of the updates in the optimizer state (debugging).

The updates pass through unchanged; the measurements (user functions of the
updates, possibly smoothed by an EMA) are kept in the state, where
``optax.tree.get(state, name)``-style lookups find them by name.
"""

from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math
from shardopt._src.transforms.momentum import ema
from shardopt._src.wrappers import combine

__all__ = [
    "Measure",
    "MonitorState",
    "SnapshotState",
    "measure_with_ema",
    "monitor",
    "snapshot",
]

Measure = Callable[[base.Updates], Any]


class SnapshotState(NamedTuple):
  """``{name: measure(last updates)}`` (at init: ``measure(params)``)."""

  measurement: dict[str, Any]


def snapshot(measure_name: str, measure: Measure) -> base.GradientTransformation:
  """Stores ``measure(updates)`` in the state under ``measure_name``.

  Placed inside a chain, it sees the updates as transformed so far; the
  updates pass through unchanged. ``init`` stores ``measure(params)``.

  Args:
    measure_name: the key of the measurement in the state.
    measure: a function of the updates.

  Returns:
    A ``GradientTransformation`` whose state is a ``SnapshotState``.

  References:
    optax's ``snapshot`` (added in 0.2.6).
  """

  def init_fn(params):
    return SnapshotState({measure_name: measure(params)})

  def update_fn(updates, state, params=None):
    del state, params
    return updates, SnapshotState({measure_name: measure(updates)})

  return base.GradientTransformation(init_fn, update_fn)


class MonitorState(NamedTuple):
  """The latest measurements by name, and the measures' own states in order."""

  measurements: dict[str, Any]
  measure_states: tuple[Any, ...]


def _as_transform(measure) -> base.GradientTransformationExtraArgs:
  """A plain function becomes a stateless transform whose "updates" are the
  measurement; a transformation (e.g. :func:`measure_with_ema`) is kept."""
  if callable(measure):
    measure = base.stateless(lambda updates, _, fn=measure: fn(updates))
  return base.with_extra_args_support(measure)


def monitor(
    measures: dict[str, base.GradientTransformation | Measure],
) -> base.GradientTransformationExtraArgs:
  """Records several, possibly stateful, measurements of the updates.

  The measurements hold the values of the latest step; at init (where
  optax's are empty) they are zeros shaped like the measures of zero
  updates, so the state keeps one structure (fixed shardings, donation,
  ``lax.scan``); init calls each measure's update with the params and no
  extra arguments. The updates pass through unchanged.

  Args:
    measures: maps names to functions of the updates or to transformations
      whose output is the measurement (such as ``measure_with_ema``).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``MonitorState``
    (the latest measurements by name and the measures' own states).

  References:
    optax's ``monitor`` (added in 0.2.7).
  """
  names = tuple(measures)
  transforms = tuple(_as_transform(measures[name]) for name in names)

  def measure_all(updates, measure_states, params, extra_args):
    measurements, new_states = {}, []
    for name, tx, tx_state in zip(names, transforms, measure_states):
      measurements[name], tx_state = tx.update(
          updates, tx_state, params, **extra_args
      )
      new_states.append(tx_state)
    return measurements, tuple(new_states)

  def init_fn(params):
    measure_states = tuple(tx.init(params) for tx in transforms)
    first, _ = measure_all(
        tree_math.tree_zeros_like(params), measure_states, params, {})
    return MonitorState(tree_math.tree_zeros_like(first), measure_states)

  def update_fn(updates, state, params=None, **extra_args):
    measurements, measure_states = measure_all(
        updates, state.measure_states, params, extra_args)
    return updates, MonitorState(measurements, measure_states)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def measure_with_ema(
    measure: Measure,
    decay: float,
    debias: bool = True,
    accumulator_dtype: Any | None = None,
) -> base.GradientTransformationExtraArgs:
  """A transformation whose output is an EMA of ``measure(updates)``.

  Meant for ``monitor``; the EMA's accumulator is shaped like
  ``measure(params)``, in the floating dtype that averaging gives it (a
  boolean measure has a float32 average, where optax's starts boolean).

  Args:
    measure: a function of the updates.
    decay: the decay of the EMA.
    debias: whether to divide by ``1 - decay**count`` (default True).
    accumulator_dtype: dtype of the average; ``None`` (default) keeps the
      measure's floating dtype.

  Returns:
    A ``GradientTransformationExtraArgs`` (a ``chain`` of the measure and
    ``ema``) whose updates are the averaged measurement, not the updates.

  References:
    optax's ``measure_with_ema`` (added in 0.2.7).
  """
  average = ema(decay, debias, accumulator_dtype)

  def init_fn(params):
    floating = lambda m: jnp.asarray(m).astype(jnp.result_type(m, 1.0))
    return average.init(jax.tree.map(floating, measure(params)))

  smoother = average._replace(init=init_fn)
  return combine.chain(
      base.stateless(lambda updates, _: measure(updates)), smoother
  )
