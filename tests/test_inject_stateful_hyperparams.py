"""inject_stateful_hyperparams against optax's, with plain and stateful
schedules."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

pytestmark = pytest.mark.filterwarnings(
    "ignore:inject_stateful_hyperparams is deprecated:DeprecationWarning")


class _Halving(NamedTuple):
  value: jax.Array


class HalveWhenValueRises:
  """A stateful schedule: starts at ``start``, halves whenever the ``value``
  extra argument is above ``threshold``."""

  def __init__(self, start, threshold):
    self.start, self.threshold = start, threshold

  def init(self):
    return _Halving(jnp.asarray(self.start, jnp.float32))

  def update(self, state, *, value, **extra_args):
    del extra_args
    return _Halving(jnp.where(value > self.threshold, 0.5, 1.0) * state.value)

  def __call__(self, state, **extra_args):
    del extra_args
    return state.value


def _run(lib, jit):
  tx = lib.inject_stateful_hyperparams(lib.adam)(
      learning_rate=HalveWhenValueRises(0.1, 2.0),
      b1=lambda count: 0.9 - 0.01 * count, b2=0.99)
  params = oracle.mixed_tree()
  state = (jax.jit(tx.init) if jit else tx.init)(params)
  update = jax.jit(tx.update) if jit else tx.update
  history = []
  for step, grads in enumerate(oracle.gradient_stream(params, 20)):
    updates, state = update(grads, state, params, value=jnp.asarray(step % 5))
    params = lib.apply_updates(params, updates)
    history.append((updates, state.hyperparams))
  return history


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_matches_optax(jit):
  for step, (got, want) in enumerate(zip(_run(shardopt, jit),
                                         _run(optax, jit))):
    try:
      oracle.assert_trees_close(got, want)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


def test_schedule_states_and_user_set_constants():
  tx = shardopt.inject_stateful_hyperparams(shardopt.sgd)(
      learning_rate=HalveWhenValueRises(1.0, 0.0), momentum=0.0)
  params = jnp.zeros(2)
  state = tx.init(params)
  assert isinstance(state, shardopt.InjectStatefulHyperparamsState)
  state.hyperparams["momentum"] = jnp.asarray(0.5)
  seen = []
  for value in (1.0, 1.0, -1.0):
    updates, state = tx.update(jnp.ones(2), state, params,
                               value=jnp.asarray(value))
    seen.append(float(updates[0]))
  # lr 1, 0.5, 0.25; momentum 0.5: traces 1, 1.5, 1.75
  np.testing.assert_allclose(seen, [-1.0, -0.75, -0.4375], rtol=1e-6)
  assert float(state.hyperparams_states["learning_rate"].value) == 0.25
  assert int(state.count) == 3


def test_wrapped_schedule_counts_steps():
  schedule = shardopt.WrappedSchedule(lambda count: 2.0 * count)
  state = schedule.init()
  for _ in range(3):
    state = schedule.update(state, value=1.0)
  assert float(schedule(state)) == 6.0
