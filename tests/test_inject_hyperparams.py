"""inject_hyperparams against optax 0.2.8: schedules (plain and stateful),
user-set hyperparameters and PRNG keys live in the state, an
InjectStatefulHyperparamsState as optax's."""

from typing import NamedTuple

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


def _same_state(got, want):
  """Same NamedTuple types (by name and fields) all the way down, same values."""
  assert type(got).__name__ == type(want).__name__
  assert getattr(got, "_fields", None) == getattr(want, "_fields", None)
  if isinstance(want, dict):
    assert got.keys() == want.keys()
    for k in want:
      _same_state(got[k], want[k])
  elif isinstance(want, tuple):
    assert len(got) == len(want)
    for g, w in zip(got, want):
      _same_state(g, w)
  elif isinstance(want, jax.Array) and jnp.issubdtype(want.dtype, jax.dtypes.prng_key):
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))
  else:
    assert jnp.asarray(got).dtype == jnp.asarray(want).dtype
    np.testing.assert_array_equal(got, want)


def test_state_is_optax_0_2_8s_stateful_state():
  params = {"w": jnp.ones(3)}

  def state(lib):
    schedule = lib.linear_schedule(0.1, 0.01, 5)
    tx = lib.inject_hyperparams(lib.sgd)(learning_rate=schedule, momentum=0.9)
    s = tx.init(params)
    _, s = tx.update({"w": jnp.full(3, 0.5)}, s, params)
    return s

  ours, theirs = state(shardopt), state(optax)
  assert isinstance(ours, shardopt.InjectStatefulHyperparamsState)
  _same_state(ours, theirs)


def test_a_prng_key_passes_through_jitted_init_and_update_as_in_optax():
  params = {"w": jnp.zeros(4)}

  def run(lib):
    tx = lib.inject_hyperparams(lib.add_noise)(eta=0.5, gamma=0.55, key=jax.random.key(17))
    state = jax.jit(tx.init)(params)
    updates, state = jax.jit(tx.update)(params, state, params)
    return updates, state

  (ours, ours_state), (theirs, theirs_state) = run(shardopt), run(optax)
  _same_state(ours_state, theirs_state)
  np.testing.assert_array_equal(ours["w"], theirs["w"])


class _Total(NamedTuple):
  total: jax.Array


class _Accumulating:
  """A stateful schedule: the sum of the ``addendum`` extra arguments so far."""

  def init(self):
    return _Total(jnp.zeros([], jnp.int32))

  def update(self, state, **extra_args):
    return _Total(state.total + extra_args["addendum"])

  def __call__(self, state, **extra_args):
    del extra_args
    return state.total


def test_takes_a_stateful_schedule_as_optax_does():
  grads = {"w": jnp.ones(2)}

  def run(lib):
    tx = lib.inject_hyperparams(lib.scale)(step_size=_Accumulating())
    state = jax.jit(tx.init)(grads)
    addendum = 0.3 * jnp.ones((), jnp.float32)
    for _ in range(2):
      updates, state = jax.jit(tx.update)(grads, state, grads, addendum=addendum)
    return updates, state

  (ours, ours_state), (theirs, theirs_state) = run(shardopt), run(optax)
  _same_state(ours_state, theirs_state)
  np.testing.assert_array_equal(ours["w"], theirs["w"])
  np.testing.assert_allclose(ours_state.hyperparams["step_size"], 0.3, rtol=1e-6)
  np.testing.assert_allclose(ours_state.hyperparams_states["step_size"].total, 0.6, rtol=1e-6)


def test_a_dtype_class_is_passed_to_the_factory_not_called_as_a_schedule():
  """optax 0.2.8 wraps ``jnp.bfloat16`` (a class, so callable) as a schedule
  and its init fails; a dtype given as a string works in both."""
  params = {"w": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)}
  for dtype in (jnp.bfloat16, "bfloat16"):
    tx = shardopt.inject_hyperparams(shardopt.adamw)(learning_rate=0.1, mu_dtype=dtype)
    assert "mu_dtype" not in tx.init(params).hyperparams
  ours = shardopt.inject_hyperparams(shardopt.adamw)(learning_rate=0.1, mu_dtype=jnp.bfloat16)
  theirs = optax.inject_hyperparams(optax.adamw)(learning_rate=0.1, mu_dtype="bfloat16")
  oracle.assert_matches_optax(ours, theirs, steps=5, jit=True)
  assert ours.init(params).inner_state[0].mu["w"].dtype == jnp.bfloat16


def test_inject_stateful_hyperparams_is_a_deprecated_alias():
  with pytest.warns(DeprecationWarning, match="use inject_hyperparams"):
    factory = shardopt.inject_stateful_hyperparams(shardopt.sgd)
  state = factory(learning_rate=0.1).init({"w": jnp.ones(2)})
  assert isinstance(state, shardopt.InjectStatefulHyperparamsState)
