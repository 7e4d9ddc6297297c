"""lookahead against optax's (both halves of the pair of updates) and by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


def _run(lib, reset_state, jit, steps=20):
  tx = lib.lookahead(lib.adam(0.1), sync_period=3, slow_step_size=0.5,
                     reset_state=reset_state)
  params = lib.LookaheadParams.init_synced(oracle.mixed_tree())
  state = (jax.jit(tx.init) if jit else tx.init)(params)
  update = jax.jit(tx.update) if jit else tx.update
  history = []
  for grads in oracle.gradient_stream(params.fast, steps):
    updates, state = update(grads, state, params)
    params = lib.apply_updates(params, updates)
    history.append((updates.fast, updates.slow))
  return history


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("reset_state", [False, True])
def test_matches_optax(reset_state, jit):
  got = _run(shardopt, reset_state, jit)
  want = _run(optax, reset_state, jit)
  for step, (g, w) in enumerate(zip(got, want)):
    try:
      oracle.assert_trees_close(g, w)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


def test_sync_by_hand():
  # sgd(1) steps fast by -g; at the 2nd step slow moves half way to fast.
  tx = shardopt.lookahead(shardopt.sgd(1.0), sync_period=2, slow_step_size=0.5)
  params = shardopt.LookaheadParams.init_synced(jnp.array([1.0]))
  state = tx.init(params)
  seen = []
  for g in (0.2, 0.4, 0.1):
    updates, state = tx.update(jnp.array([g]), state, params)
    params = shardopt.apply_updates(params, updates)
    seen.append((float(params.fast[0]), float(params.slow[0])))
  # fast 0.8; then 0.4 -> slow = 1 + 0.5 * (0.4 - 1) = 0.7 = fast; then 0.6.
  np.testing.assert_allclose(seen, [(0.8, 1.0), (0.7, 0.7), (0.6, 0.7)],
                             rtol=1e-6)
  assert int(state.steps_since_sync) == 1


def test_init_accepts_plain_params():
  tx = shardopt.lookahead(shardopt.adam(0.1), sync_period=2, slow_step_size=0.5)
  params = {"w": jnp.ones(3)}
  plain = tx.init(params)
  paired = tx.init(shardopt.LookaheadParams.init_synced(params))
  oracle.assert_trees_close(plain, paired)


def test_bad_input_is_named():
  with pytest.raises(ValueError, match="sync_period"):
    shardopt.lookahead(shardopt.sgd(0.1), sync_period=0, slow_step_size=0.5)
  tx = shardopt.lookahead(shardopt.sgd(0.1), sync_period=2, slow_step_size=0.5)
  params = jnp.ones(2)
  with pytest.raises(ValueError, match="LookaheadParams"):
    tx.update(jnp.ones(2), tx.init(params), params)
