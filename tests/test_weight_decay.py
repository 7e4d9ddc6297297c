"""add_decayed_weights against optax, incl. schedules and masks."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


def _schedule(count):
  return 0.1 * 0.8**count


def _no_bias(params):
  mask = {name: True for name in params}
  mask["dense"] = {"kernel": True, "bias": False}
  return mask


CASES = [
    dict(),
    dict(weight_decay=0.05),
    dict(weight_decay=_schedule),
    dict(weight_decay=0.05, mask=_no_bias),
    dict(weight_decay=_schedule, mask={"scalar": False, "vector": True,
                                       "dense": True, "conv": False,
                                       "block": [True]}),
]


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("kwargs", CASES)
def test_matches_optax(kwargs, jit):
  oracle.assert_matches_optax(
      shardopt.add_decayed_weights(**kwargs),
      optax.add_decayed_weights(**kwargs), jit=jit, with_params=True)


def test_hand_computed_with_mask():
  params = {"w": jnp.array([2.0, -4.0]), "b": jnp.array([10.0])}
  grads = {"w": jnp.array([1.0, 1.0]), "b": jnp.array([1.0])}
  tx = shardopt.add_decayed_weights(0.5, mask={"w": True, "b": False})
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["w"], [2.0, -1.0])
  np.testing.assert_allclose(updates["b"], [1.0])


def test_schedule_state():
  params = {"w": jnp.ones(2)}
  tx = shardopt.add_decayed_weights(_schedule)
  state = tx.init(params)
  updates, state = tx.update(params, state, params)  # rate 0.1 at count 0
  np.testing.assert_allclose(updates["w"], [1.1, 1.1], rtol=1e-6)
  assert type(state).__name__ == "WeightDecaySchedule" and int(state.count) == 1
  assert shardopt.AddDecayedWeightsState is shardopt.EmptyState


def test_needs_params():
  tx = shardopt.add_decayed_weights(0.1)
  with pytest.raises(ValueError, match="add_decayed_weights needs the current"):
    tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))
