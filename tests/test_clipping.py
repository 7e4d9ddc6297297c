"""clip, clip_by_block_rms and clip_by_global_norm against optax."""

import jax.numpy as jnp
import numpy as np

import shardopt
from tests import oracle

# mixed_tree() pseudo-gradients have elements of size ~1, leaf RMS ~0.5 and a
# global norm ~6: the thresholds below clip some steps/leaves and not others.
CASES = [
    ("clip", dict(max_delta=0.4)),
    ("clip_by_block_rms", dict(threshold=0.5)),
    ("clip_by_global_norm", dict(max_norm=4.0)),
    ("clip_by_global_norm", dict(max_norm=100.0)),
]


test_matches_optax = oracle.matches_optax_test(CASES)


def test_hand_computed():
  g = {"a": jnp.array([3.0, -4.0]), "b": jnp.array([0.5])}
  clipped, _ = shardopt.clip(1.0).update(g, shardopt.EmptyState())
  np.testing.assert_allclose(clipped["a"], [1.0, -1.0])
  np.testing.assert_allclose(clipped["b"], [0.5])
  # |g| = sqrt(9 + 16 + 0.25): every leaf scaled by 2 / |g|
  tx = shardopt.clip_by_global_norm(2.0)
  scaled, _ = tx.update(g, tx.init(g))
  factor = 2.0 / 25.25**0.5
  np.testing.assert_allclose(scaled["a"], [3.0 * factor, -4.0 * factor],
                             rtol=1e-6)
  np.testing.assert_allclose(scaled["b"], [0.5 * factor], rtol=1e-6)
  # rms of a = sqrt(12.5); clipped to rms 1; b (rms 0.5) kept
  tx = shardopt.clip_by_block_rms(1.0)
  blocked, _ = tx.update(g, tx.init(g))
  np.testing.assert_allclose(blocked["a"], np.array([3.0, -4.0]) / 12.5**0.5,
                             rtol=1e-6)
  np.testing.assert_allclose(blocked["b"], [0.5])


def test_state_aliases():
  assert shardopt.ClipState is shardopt.EmptyState
  assert shardopt.ClipByGlobalNormState is shardopt.EmptyState
