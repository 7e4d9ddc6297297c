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


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_sharded_lookahead_on_the_pair_matches_optax(axis_types):
  """The pair as the sharded optimizer's params (made by ``init_synced`` from
  placed params, donated each step), ``train_step`` on a loss of the pair
  (its gradient's ``slow`` half is zero and not read), ZeRO on: 6 steps
  equal optax's lookahead given the fast gradients alone."""
  import partitioning
  from jax.sharding import PartitionSpec as P

  mesh = partitioning.make_mesh({"data": 2, "model": 4}, axis_types=axis_types)
  specs = {"w": P(None, "model"), "b": P("model")}
  shardings = partitioning.named_shardings(mesh, specs)
  init = {"w": jnp.linspace(-1.0, 1.0, 8 * 16).reshape(8, 16), "b": jnp.zeros(16)}
  x = jnp.linspace(0.0, 1.0, 4 * 8).reshape(4, 8)
  loss = lambda p: jnp.mean((x @ p["w"] + p["b"] - 1.0) ** 2)

  tx = shardopt.lookahead(shardopt.adam(0.1), sync_period=2, slow_step_size=0.5)
  pair_shardings = shardopt.LookaheadParams(fast=shardings, slow=shardings)
  opt = shardopt.make_sharded_optimizer(tx, shardopt.LookaheadParams.init_synced(init),
                                        pair_shardings, shard_state_over="data",
                                        min_shard_bytes=0)
  pair = shardopt.LookaheadParams.init_synced(
      jax.device_put(jax.tree.map(jnp.copy, init), shardings))
  state = opt.init(pair)
  step = opt.train_step(lambda pair, batch: loss(pair.fast))

  want_tx = optax.lookahead(optax.adam(0.1), sync_period=2, slow_step_size=0.5)
  want = optax.LookaheadParams.init_synced(init)
  want_state = want_tx.init(want)
  for _ in range(6):
    pair, state, _ = step(pair, state, jnp.float32(0))
    updates, want_state = want_tx.update(jax.grad(loss)(want.fast), want_state, want)
    want = optax.apply_updates(want, updates)
  for half in ("fast", "slow"):
    oracle.assert_trees_close(jax.device_get(getattr(pair, half)), getattr(want, half))
