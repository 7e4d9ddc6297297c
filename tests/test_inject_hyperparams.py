"""inject_hyperparams: schedules and user-set hyperparameters live in the state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


@pytest.mark.parametrize("jit", [True, False])
def test_scheduled_adam_matches_optax(jit):
  schedule = shardopt.linear_schedule(1e-2, 1e-3, transition_steps=10)
  ours = shardopt.inject_hyperparams(shardopt.adam)(learning_rate=schedule, b1=0.8)
  theirs = optax.inject_hyperparams(optax.adam)(
      learning_rate=optax.linear_schedule(1e-2, 1e-3, transition_steps=10), b1=0.8)
  oracle.assert_matches_optax(ours, theirs, steps=20, jit=jit)


def test_hyperparams_are_state_the_user_can_change():
  tx = shardopt.inject_hyperparams(shardopt.sgd)(learning_rate=0.1)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)
  state.hyperparams["learning_rate"] = jnp.asarray(0.5)
  updates, state = tx.update({"w": jnp.ones(3)}, state, params)
  np.testing.assert_allclose(updates["w"], -0.5)
  assert int(state.count) == 1


def test_schedule_is_evaluated_at_the_step_count():
  tx = shardopt.inject_hyperparams(shardopt.sgd)(learning_rate=lambda count: 0.1 * (count + 1))
  params = jnp.zeros(2)
  state = tx.init(params)
  seen = []
  for _ in range(3):
    updates, state = jax.jit(tx.update)(jnp.ones(2), state, params)
    seen.append(float(updates[0]))
  np.testing.assert_allclose(seen, [-0.1, -0.2, -0.3], rtol=1e-6)


def test_unknown_static_arg_is_named():
  with pytest.raises(ValueError, match="not_an_arg"):
    shardopt.inject_hyperparams(shardopt.sgd, static_args="not_an_arg")
