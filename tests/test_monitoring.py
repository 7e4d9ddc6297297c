"""snapshot, monitor and measure_with_ema against optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


def _norm(tree):
  return jnp.sqrt(sum(jnp.sum(x**2) for x in jax.tree.leaves(tree)))


def _clipped(tree):
  return _norm(tree) > 1.5


def _build(lib):
  return lib.chain(
      lib.trace(decay=0.9),
      lib.snapshot("snap", _norm),
      lib.monitor({
          "norm": _norm,
          "clipped_ema": lib.measure_with_ema(_clipped, decay=0.9),
          "norm_ema": lib.measure_with_ema(_norm, decay=0.8, debias=False),
          "leaf_ema": lib.measure_with_ema(lambda u: u["dense"], decay=0.5,
                                           accumulator_dtype=jnp.bfloat16),
      }),
      lib.scale(-0.1),
  )


def _run(tx, jit):
  params = oracle.mixed_tree()
  update = jax.jit(tx.update) if jit else tx.update
  state = tx.init(params)
  history = []
  for grads in oracle.gradient_stream(params, 20):
    updates, state = update(grads, state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    history.append((updates, state[1].measurement, state[2].measurements))
  return history, state


@pytest.mark.parametrize("jit", [True, False])
def test_matches_optax(jit):
  got, ours = _run(_build(shardopt), jit)
  want, theirs = _run(_build(optax), jit)
  for g, w in zip(got, want):
    oracle.assert_trees_close(g, w)
  flips = [float(m["clipped_ema"]) for _, _, m in got]
  assert min(flips) < max(flips)  # the EMA of a boolean really moves
  assert isinstance(ours[1], shardopt.SnapshotState)
  assert isinstance(ours[2], shardopt.MonitorState)
  # Same state content as optax's, leaf for leaf (types differ: ours/theirs).
  oracle.assert_trees_close(jax.tree.leaves(ours), jax.tree.leaves(theirs))


def test_initial_state():
  params = oracle.mixed_tree()
  snap = shardopt.snapshot("n", _norm).init(params)
  np.testing.assert_allclose(snap.measurement["n"], _norm(params))
  tx = shardopt.monitor({"n": _norm, "e": shardopt.measure_with_ema(
      _norm, 0.9), "flag": _clipped, "leaf": lambda u: u["dense"]})
  state = tx.init(params)
  ema_state = state.measure_states[1][1]
  assert ema_state.ema.shape == () and int(ema_state.count) == 0
  # Unlike optax's empty dict, the measurements start as zeros with the
  # structure, shapes and dtypes the first update gives them.
  assert all(not np.any(x) for x in jax.tree.leaves(state.measurements))
  _, after = tx.update(params, state)
  assert jax.tree.structure(after) == jax.tree.structure(state)
  shape_dtype = lambda x: (x.shape, x.dtype)  # noqa: E731
  assert jax.tree.map(shape_dtype, after) == jax.tree.map(shape_dtype, state)


def test_monitor_state_scans():
  """A fixed state structure lets the step be a lax.scan body."""
  tx = _build(shardopt)
  params = oracle.mixed_tree()
  grads = list(oracle.gradient_stream(params, 3))

  def body(state, g):
    updates, state = tx.update(g, state, params)
    return state, updates

  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *grads)
  final, updates = jax.lax.scan(body, tx.init(params), stacked)
  state = tx.init(params)
  for step, g in enumerate(grads):
    want, state = tx.update(g, state, params)
    oracle.assert_trees_close(jax.tree.map(lambda u: u[step], updates), want)
  oracle.assert_trees_close(final, state)
