"""flatten: the inner transformation on one flat vector, equal to optax's."""

import jax.numpy as jnp
import optax
import pytest

import shardopt
from tests import oracle


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_adam_matches_optax(jit, with_params):
  oracle.assert_matches_optax(shardopt.flatten(shardopt.adam(0.1)),
                              optax.flatten(optax.adam(0.1)),
                              jit=jit, with_params=with_params)


def test_trust_ratio_reduces_over_the_whole_tree():
  oracle.assert_matches_optax(shardopt.flatten(shardopt.scale_by_trust_ratio()),
                              optax.flatten(optax.scale_by_trust_ratio()))
  params = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([4.0])}
  grads = {"a": jnp.array([1.0, 0.0]), "b": jnp.array([0.0])}
  tx = shardopt.flatten(shardopt.scale_by_trust_ratio())
  updates, _ = tx.update(grads, tx.init(params), params)
  # |all params| = 5, |all grads| = 1: every update is scaled by 5 (per leaf,
  # "b" would have a zero gradient norm and "a" a ratio of 3)
  oracle.assert_trees_close(updates, {"a": jnp.array([5.0, 0.0]),
                                      "b": jnp.array([0.0])})
