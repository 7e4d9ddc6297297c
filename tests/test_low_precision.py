"""low_precision_state: bfloat16 storage, full-precision arithmetic."""

import jax
import jax.numpy as jnp
import optax
import pytest

import shardopt
from shardopt._src import moments
from tests import oracle


def float_state_dtypes(state):
  return {x.dtype for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)}


@pytest.mark.parametrize("make", [lambda: optax.adam(1e-2), lambda: optax.adafactor(1e-2)])
def test_state_is_stored_in_bfloat16_and_counters_stay_int(make):
  tx = shardopt.low_precision_state(make(), jnp.bfloat16)
  params = oracle.mixed_tree()
  state = tx.init(params)
  assert float_state_dtypes(state) == {jnp.dtype(jnp.bfloat16)}
  assert any(x.dtype == jnp.int32 for x in jax.tree.leaves(state))
  updates, state = jax.jit(tx.update)(params, state, params)
  assert float_state_dtypes(state) == {jnp.dtype(jnp.bfloat16)}
  assert all(u.dtype == jnp.float32 for u in jax.tree.leaves(updates))


def test_state_bytes_halve():
  params = oracle.mixed_tree()
  full = optax.adam(1e-2).init(params)
  low = shardopt.low_precision_state(optax.adam(1e-2)).init(params)
  nbytes = lambda s: sum(x.nbytes for x in jax.tree.leaves(s) if x.ndim)
  assert nbytes(low) * 2 == nbytes(full)


def test_updates_follow_the_rounded_state():
  # One step from zero state: the state rounds to bf16, the update does not.
  inner = optax.scale_by_adam()
  tx = shardopt.low_precision_state(inner)
  params = oracle.mixed_tree()
  ours, state = tx.update(params, tx.init(params), params)
  exact, exact_state = inner.update(params, inner.init(params), params)
  oracle.assert_trees_close(ours, exact, rtol=1e-6)
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16), exact_state.mu)
  oracle.assert_trees_close(state.mu, rounded, rtol=0)


def test_hyperparameters_and_scalars_of_no_param_keep_their_dtype():
  """inject_hyperparams' b2 = 0.999 was stored in bfloat16, where it is 1.0: Adam's bias
  correction then divided 0 by 0 and every update was nan. Only leaves that derive from a
  param are stored low; the update equals the float32 state's to bfloat16 rounding."""
  inner = optax.inject_hyperparams(optax.adam)(learning_rate=3e-4, b1=0.9, b2=0.999)
  tx = shardopt.low_precision_state(inner)
  params = oracle.mixed_tree()
  state = tx.init(params)
  assert {k: v.dtype for k, v in state.hyperparams.items()} == {
      k: v.dtype for k, v in inner.init(params).hyperparams.items()}
  assert float(state.hyperparams["b2"]) == pytest.approx(0.999, rel=1e-7)
  assert float_state_dtypes(state.inner_state) == {jnp.dtype(jnp.bfloat16)}
  ours, state = jax.jit(tx.update)(params, state, params)
  exact, _ = inner.update(params, inner.init(params), params)
  oracle.assert_trees_close(ours, exact, rtol=1e-6)
  assert float_state_dtypes(state.inner_state) == {jnp.dtype(jnp.bfloat16)}


def test_schedule_free_keeps_its_scalars_and_its_iterate():
  """``z`` is the iterate the params average, not a moment: stored in
  bfloat16 (the params rounded), the first update differed from the float
  state's though no moment had been rounded yet. Its Adam moments are stored
  low."""
  inner = optax.contrib.schedule_free_adamw(1e-2, b1=0.9, warmup_steps=5)
  tx = shardopt.low_precision_state(inner)
  params = oracle.mixed_tree()
  state = tx.init(params)
  assert state.b1.dtype == state.weight_sum.dtype == jnp.float32
  assert float(state.b1) == pytest.approx(0.9, rel=1e-7)
  assert float_state_dtypes(state.z) == {jnp.dtype(jnp.float32)}
  assert float_state_dtypes(state.base_optimizer_state) == {jnp.dtype(jnp.bfloat16)}
  ours, _ = jax.jit(tx.update)(params, state, params)
  exact, _ = jax.jit(inner.update)(params, inner.init(params), params)
  oracle.assert_trees_close(ours, exact, rtol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: shardopt.contrib.dog(), lambda: shardopt.contrib.prodigy(1.0),
    lambda: shardopt.lbfgs(), lambda: shardopt.contrib.shampoo(1e-2),
], ids=["dog", "prodigy", "lbfgs", "shampoo"])
def test_copies_of_params_memories_and_statistics_keep_their_dtype(make):
  """What is not a declared moment stays as built: DoG's and Prodigy's
  initial params, L-BFGS's memory, Shampoo's statistics and preconditioners;
  Prodigy's declared moments are stored low."""
  inner = make()
  params = oracle.mixed_tree()
  low = jax.eval_shape(shardopt.low_precision_state(inner).init, params)
  full = jax.eval_shape(inner.init, params)
  kinds = moments.leaf_kinds(full, params)
  for x, y, kind in zip(jax.tree.leaves(low), jax.tree.leaves(full), kinds):
    if kind.kind is None:
      assert x.dtype == y.dtype, kind.field
    else:
      assert x.dtype == jnp.bfloat16, kind.field
