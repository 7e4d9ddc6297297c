"""scale_by_trust_ratio, scale_by_param_block_norm/rms against optax."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

CASES = [
    ("scale_by_trust_ratio", dict()),
    ("scale_by_trust_ratio", dict(min_norm=0.5, trust_coefficient=0.01,
                                  eps=1e-3)),
    ("scale_by_param_block_norm", dict()),
    ("scale_by_param_block_norm", dict(min_scale=3.0)),
    ("scale_by_param_block_rms", dict()),
    ("scale_by_param_block_rms", dict(min_scale=0.9)),
]


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("name,kwargs", CASES)
def test_matches_optax(name, kwargs, jit):
  oracle.assert_matches_optax(
      getattr(shardopt, name)(**kwargs), getattr(optax, name)(**kwargs),
      jit=jit, with_params=True)


@pytest.mark.parametrize("name", [c[0] for c in CASES[::2]])
def test_needs_params(name):
  tx = getattr(shardopt, name)()
  with pytest.raises(ValueError, match=f"{name} needs the current params"):
    tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))


def test_trust_ratio_hand_computed():
  params = {"w": jnp.array([3.0, 4.0]), "z": jnp.zeros(2)}
  updates = {"w": jnp.array([0.6, 0.8]), "z": jnp.array([1.0, 2.0])}
  tx = shardopt.scale_by_trust_ratio(trust_coefficient=0.5)
  scaled, _ = tx.update(updates, tx.init(params), params)
  # |w| = 5, |u| = 1: ratio 0.5 * 5 / 1; a zero param keeps its update.
  np.testing.assert_allclose(scaled["w"], [1.5, 2.0], rtol=1e-6)
  np.testing.assert_allclose(scaled["z"], [1.0, 2.0])
  assert shardopt.ScaleByTrustRatioState is shardopt.EmptyState
