"""conditionally_transform / conditionally_mask, apply_if_finite, skip tests."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

NUM_STEPS = 3


def _early(step):
  return step < NUM_STEPS


def test_conditionally_transform_stops_calling_inner():
  tx = shardopt.conditionally_transform(shardopt.scale(2.0), _early)
  update = jax.jit(tx.update)
  state = tx.init(jnp.zeros([]))
  got = []
  for _ in range(NUM_STEPS + 4):
    updates, state = update(jnp.ones([]), state)
    got.append(float(updates))
  # The inner scaling while the condition holds, then the updates unchanged.
  assert got == [2.0] * NUM_STEPS + [1.0] * 4
  assert isinstance(state, shardopt.ConditionallyTransformState)
  assert state.step.dtype == jnp.int32 and int(state.step) == NUM_STEPS + 4


@pytest.mark.parametrize("wrapper", ["conditionally_transform",
                                     "conditionally_mask"])
def test_stateful_inner_state_frozen_when_skipped(wrapper):
  tx = getattr(shardopt, wrapper)(shardopt.trace(1.0), _early)
  update = jax.jit(tx.update)
  state = tx.init(jnp.zeros([]))
  got = []
  for _ in range(NUM_STEPS + 2):
    updates, state = update(jnp.ones([]), state)
    got.append(float(updates))
  # trace(1.0) sums the updates: 1, 2, 3; afterwards it is no longer called.
  passthrough = 1.0 if wrapper == "conditionally_transform" else 0.0
  assert got == [1.0, 2.0, 3.0] + [passthrough] * 2
  assert float(state.inner_state.trace) == 3.0


def test_condition_sees_forwarded_extra_args():
  condition = lambda step, *, enabled: enabled
  plain = lambda step: True
  for wrapper in (shardopt.conditionally_mask, shardopt.conditionally_transform):
    tx = wrapper(shardopt.scale(3.0), condition, forward_extra_args=True)
    state = tx.init(jnp.ones(2))
    on, _ = tx.update(jnp.ones(2), state, enabled=jnp.array(True))
    off, _ = tx.update(jnp.ones(2), state, enabled=jnp.array(False))
    assert float(on[0]) == 3.0 and float(off[0]) in (0.0, 1.0)
    # Without forwarding, the condition gets the step only.
    tx = wrapper(shardopt.scale(3.0), plain)
    on, _ = tx.update(jnp.ones(2), tx.init(jnp.ones(2)), enabled=True)
    assert float(on[0]) == 3.0


def _every_third_skipped(step):
  return step % 3 != 2


# Un-jitted lax.cond retraces every step: one un-jitted case keeps this cheap.
@pytest.mark.parametrize("jit,with_params",
                         [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("wrapper", ["conditionally_transform",
                                     "conditionally_mask"])
def test_matches_optax(wrapper, jit, with_params):
  ours = getattr(shardopt, wrapper)(shardopt.ema(0.9), _every_third_skipped)
  theirs = getattr(optax, wrapper)(optax.ema(0.9), _every_third_skipped)
  oracle.assert_matches_optax(ours, theirs, jit=jit, with_params=with_params)


def _gradient(kind):
  value = {"ok": 1.0, "nan": jnp.nan, "inf": jnp.inf}[kind]
  return {"w": jnp.array([1.0, value]), "b": jnp.ones([])}


@pytest.mark.parametrize("jit", [True, False])
def test_apply_if_finite_counts_and_skips(jit):
  max_errors = 2
  tx = shardopt.apply_if_finite(shardopt.trace(1.0), max_errors)
  reference = optax.apply_if_finite(optax.trace(1.0), max_errors)
  update = jax.jit(tx.update) if jit else tx.update
  params = _gradient("ok")
  state, ref_state = tx.init(params), reference.init(params)
  # (gradient, applied?, consecutive non-finite, total non-finite)
  script = [("ok", True, 0, 0), ("nan", False, 1, 1), ("inf", False, 2, 2),
            ("ok", True, 0, 2), ("nan", False, 1, 3), ("nan", False, 2, 4),
            ("nan", True, 3, 5), ("ok", True, 0, 5)]
  applied_sum = 0.0
  for kind, applied, consecutive, total in script:
    grads = _gradient(kind)
    updates, state = update(grads, state)
    want, ref_state = reference.update(grads, ref_state)
    if applied:  # trace(1.0) returns the running sum of applied gradients
      applied_sum = applied_sum + np.asarray(grads["b"])
      assert float(updates["b"]) == applied_sum
    else:
      assert not np.any(np.asarray(updates["w"]))
      assert not np.any(np.asarray(updates["b"]))
    assert int(state.notfinite_count) == consecutive
    assert bool(state.last_finite) == (kind == "ok")
    assert int(state.total_notfinite) == total
    oracle.assert_trees_close(updates, want, rtol=0, atol=0)
    oracle.assert_trees_close(jax.tree.leaves(state), jax.tree.leaves(ref_state),
                              rtol=0, atol=0)
  assert isinstance(state, shardopt.ApplyIfFiniteState)


@pytest.mark.parametrize("kind", ["ok", "nan", "inf"])
def test_skip_functions_match_optax(kind):
  grads = _gradient(kind)
  for ours, theirs in [
      (shardopt.skip_not_finite, optax.skip_not_finite),
      (functools.partial(shardopt.skip_large_updates, max_squared_norm=2.5),
       functools.partial(optax.skip_large_updates, max_squared_norm=2.5)),
      (functools.partial(shardopt.skip_large_updates, max_squared_norm=1.5),
       functools.partial(optax.skip_large_updates, max_squared_norm=1.5)),
  ]:
    got, want = ours(grads, 0, None), theirs(grads, 0, None)
    assert got[0].dtype == jnp.bool_ and got[0].shape == ()
    assert bool(got[0]) == bool(want[0])
    assert jax.tree.structure(got[1]) == jax.tree.structure(want[1])
    for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1])):
      np.testing.assert_array_equal(g, w)
      assert g.dtype == w.dtype
  # By hand: w = [1, x], b = 1.
  assert int(shardopt.skip_not_finite(grads, 0, None)[1]["num_not_finite"]) == (
      kind != "ok")
