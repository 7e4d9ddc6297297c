"""multi_normal against optax's and against scipy's normal density."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.stats

import shardopt


def test_samples_log_probs_and_params_match_optax():
  loc, log_scale = jnp.array([[0.5, -1.0, 2.0]]), jnp.array([0.1, -0.3, 0.7])
  ours, theirs = shardopt.multi_normal(loc, log_scale), optax.multi_normal(loc, log_scale)
  key = jax.random.PRNGKey(3)
  x = ours.sample((4, 2), key)
  assert x.shape == (4, 2, 1, 3)
  np.testing.assert_array_equal(x, theirs.sample((4, 2), key))
  got = ours.log_prob(x)
  assert got.shape == (4, 2)
  np.testing.assert_allclose(got, theirs.log_prob(x), rtol=1e-6)
  want = scipy.stats.norm.logpdf(np.asarray(x, np.float64), np.asarray(loc),
                                 np.exp(np.asarray(log_scale))).sum(axis=(-2, -1))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_array_equal(ours.log_scale, log_scale)
  assert [p.tolist() for p in ours.params] == [loc.tolist(), log_scale.tolist()]


def test_scalar_distribution_reduces_nothing():
  dist = shardopt.multi_normal(0.0, 0.0)
  x = jnp.array([0.0, 1.0])
  np.testing.assert_allclose(dist.log_prob(x), scipy.stats.norm.logpdf([0.0, 1.0]), rtol=1e-6)
