"""scale_by_distance_over_gradients (layer-wise DoG) against optax's."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("kwargs", [{}, {"reps_rel": 1e-4,
                                         "global_scale": -1.0}])
def test_matches_optax(kwargs, jit):
  # optax turns the scalar param's update into a (1,) vector; ours stays ().
  oracle.assert_matches_optax(
      shardopt.scale_by_distance_over_gradients(**kwargs),
      oracle.updates_shaped_like_grads(
          optax.scale_by_distance_over_gradients(**kwargs)), jit=jit)


def test_first_steps_by_hand():
  tx = shardopt.scale_by_distance_over_gradients(reps_rel=0.1, eps=0.0)
  params = jnp.array([3.0, 4.0])
  state = tx.init(params)
  # step 1: d = 0.1 * (1 + 5) = 0.6, G = |g|^2 = 4 -> update 0.6 / 2 * g
  updates, state = tx.update(jnp.array([2.0, 0.0]), state, params)
  np.testing.assert_allclose(updates, [0.6, 0.0], rtol=1e-6)
  # step 2 at params moved by (3, 0) (distance 3 > 0.6): G = 4 + 16 = 20
  updates, state = tx.update(jnp.array([0.0, 4.0]), state,
                             params + jnp.array([3.0, 0.0]))
  np.testing.assert_allclose(updates, [0.0, 3.0 / np.sqrt(20.0) * 4.0],
                             rtol=1e-6)


def test_scalar_param_keeps_its_shape_and_params_are_required():
  tx = shardopt.scale_by_distance_over_gradients()
  params = {"s": jnp.array(1.0)}
  updates, _ = tx.update({"s": jnp.array(0.5)}, tx.init(params), params)
  assert updates["s"].shape == ()
  with pytest.raises(ValueError, match="needs params"):
    tx.update(params, tx.init(params))


def test_state_leaves_match_optaxs_shapes_dtypes_and_values():
  params = {"w": jnp.ones((4, 3)), "s": jnp.array(2.0), "h": jnp.ones(5, jnp.bfloat16)}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), params)
  states = []
  for lib in (shardopt, optax):
    tx = lib.scale_by_distance_over_gradients()
    state = tx.init(params)
    _, state = tx.update(grads, state, params)
    states.append(state)
  oracle.assert_trees_close(tuple(states[0]), tuple(states[1]), rtol=1e-6)
