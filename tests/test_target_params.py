"""incremental_update and periodic_update against optax's."""

import jax
import jax.numpy as jnp
import optax
import pytest

import shardopt
from tests import oracle


def test_incremental_update_matches_optax_and_keeps_none():
  new, old = oracle.mixed_tree(0), oracle.mixed_tree(1)
  new["dense"]["bias"] = None
  got = shardopt.incremental_update(new, old, 0.1)
  assert got["dense"]["bias"] is None
  oracle.assert_trees_close(got, optax.incremental_update(new, old, 0.1))


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_periodic_update_matches_optax(jit):
  new, old = oracle.mixed_tree(0), oracle.mixed_tree(1)
  ours = jax.jit(shardopt.periodic_update) if jit else shardopt.periodic_update
  for step in range(5):
    got = ours(new, old, jnp.asarray(step), 3)
    oracle.assert_trees_close(got, optax.periodic_update(new, old, step, 3))
    oracle.assert_trees_close(got, new if step % 3 == 0 else old)
