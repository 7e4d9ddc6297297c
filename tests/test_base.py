"""The protocol: unpacking, indexing, stateless helpers, extra-args support."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


def test_transformation_unpacks_and_indexes_like_optax():
  tx = shardopt.identity()
  init, update = tx
  assert tx[0] is init and tx[1] is update
  assert init({"a": jnp.ones(2)}) == shardopt.EmptyState()


def test_set_to_zero_and_identity():
  params = oracle.mixed_tree()
  zeros, _ = shardopt.set_to_zero().update(params, shardopt.EmptyState())
  assert all(float(jnp.abs(z).max()) == 0.0 for z in __import__("jax").tree.leaves(zeros))
  same, _ = shardopt.identity().update(params, shardopt.EmptyState())
  oracle.assert_trees_close(same, params)


def test_stateless_with_tree_map_sees_params():
  tx = shardopt.stateless_with_tree_map(lambda g, p: g * p)
  out, _ = tx.update({"a": jnp.array([2.0])}, tx.init(None), {"a": jnp.array([3.0])})
  np.testing.assert_allclose(out["a"], [6.0])


def test_with_extra_args_support_drops_extra_args_for_optax_transforms():
  tx = shardopt.with_extra_args_support(optax.scale(2.0))
  out, _ = tx.update({"a": jnp.array([1.0])}, tx.init(None), None, value=3.0)
  np.testing.assert_allclose(out["a"], [2.0])


def test_apply_updates_keeps_param_dtype():
  params = {"a": jnp.ones(3, jnp.bfloat16)}
  out = shardopt.apply_updates(params, {"a": jnp.full(3, 0.5, jnp.float32)})
  assert out["a"].dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out["a"], np.float32), 1.5)


def test_global_norm_and_safe_increment_match_optax():
  tree = oracle.mixed_tree()
  np.testing.assert_allclose(shardopt.global_norm(tree), optax.tree.norm(tree), rtol=1e-6)
  top = jnp.asarray(jnp.iinfo(jnp.int32).max, jnp.int32)
  assert int(shardopt.safe_increment(top)) == int(top)


@pytest.mark.parametrize("dtype,x64", [
    (jnp.uint8, False), (jnp.uint32, False), (jnp.int8, False), (jnp.float16, False),
    (jnp.uint64, True), (jnp.int64, True)])
def test_safe_increment_matches_optax_on_every_integer_width(dtype, x64):
  with jax.enable_x64(x64):
    top = np.iinfo(dtype).max if jnp.issubdtype(dtype, jnp.integer) else np.finfo(dtype).max
    for value in (3, top):
      count = jnp.asarray(value, dtype)
      got, want = shardopt.safe_increment(count), optax.safe_increment(count)
      assert got.dtype == want.dtype == dtype
      assert got == want
