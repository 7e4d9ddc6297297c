"""keep_params_nonnegative and zero_nans: optax and hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


@pytest.mark.parametrize("jit", [True, False])
def test_keep_params_nonnegative_matches_optax(jit):
  # mixed_tree() has negative params: they are moved to zero, as in optax.
  oracle.assert_matches_optax(
      shardopt.keep_params_nonnegative(), optax.keep_params_nonnegative(),
      jit=jit, with_params=True)


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
def test_zero_nans_matches_optax(jit, with_params):
  oracle.assert_matches_optax(
      shardopt.zero_nans(), optax.zero_nans(), jit=jit, with_params=with_params)


def test_keep_params_nonnegative_seed_scenario():
  """SGD with lr 0.01 on grads +-500/0, from params -1, 1 and 0."""
  grads = tuple(jnp.array([500.0, -500.0, 0.0]) for _ in range(3))
  params = (jnp.full(3, -1.0), jnp.full(3, 1.0), jnp.zeros(3))

  def step(*transforms):
    tx = shardopt.chain(*transforms)
    updates, _ = tx.update(grads, tx.init(params), params)
    return shardopt.apply_updates(params, updates)

  sgd = (shardopt.trace(decay=0.0, nesterov=False), shardopt.scale(-0.01))
  plain = step(*sgd)
  oracle.assert_trees_close(plain, (jnp.array([-6.0, 4.0, -1.0]),
                                    jnp.array([-4.0, 6.0, 1.0]),
                                    jnp.array([-5.0, 5.0, 0.0])))
  kept = step(*sgd, shardopt.keep_params_nonnegative())
  oracle.assert_trees_close(kept, (jnp.array([0.0, 4.0, 0.0]),
                                   jnp.array([0.0, 6.0, 1.0]),
                                   jnp.array([0.0, 5.0, 0.0])))


def test_keep_params_nonnegative_needs_params():
  tx = shardopt.keep_params_nonnegative()
  with pytest.raises(ValueError, match="keep_params_nonnegative needs the"):
    tx.update({"a": jnp.ones(2)}, tx.init({"a": jnp.ones(2)}))


def test_zero_nans_reports_and_zeroes():
  params = {"a": jnp.ones(3), "b": jnp.ones(2)}
  tx = shardopt.zero_nans()
  state = tx.init(params)
  assert jax.tree.map(bool, state.found_nan) == {"a": False, "b": False}
  grads = {"a": jnp.array([1.0, jnp.nan, -2.0]), "b": jnp.array([3.0, 4.0])}
  updates, state = jax.jit(tx.update)(grads, state)
  np.testing.assert_array_equal(updates["a"], [1.0, 0.0, -2.0])
  np.testing.assert_array_equal(updates["b"], [3.0, 4.0])
  assert jax.tree.map(bool, state.found_nan) == {"a": True, "b": False}
  assert type(state).__name__ == "ZeroNansState"
  assert shardopt.NonNegativeParamsState is shardopt.EmptyState
