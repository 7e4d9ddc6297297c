"""add_noise against optax with the same key or seed."""

import warnings

import jax
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

CASES = [
    dict(eta=0.01, gamma=0.55, key=0),
    dict(eta=0.3, gamma=1.0, key=jax.random.key(7)),
]


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("kwargs", CASES)
def test_matches_optax(kwargs, jit, with_params):
  oracle.assert_matches_optax(
      shardopt.add_noise(**kwargs), optax.add_noise(**kwargs),
      jit=jit, with_params=with_params)


def test_seed_is_deprecated_alias_of_key():
  with pytest.warns(DeprecationWarning, match="seed"):
    ours = shardopt.add_noise(0.1, 0.5, seed=3)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    theirs = optax.add_noise(0.1, 0.5, seed=3)
  oracle.assert_matches_optax(ours, theirs, steps=3, with_params=False)
  with pytest.raises(ValueError, match="either key or seed"), pytest.warns(
      DeprecationWarning):
    shardopt.add_noise(0.1, 0.5, key=1, seed=3)


def test_missing_key_warns_and_uses_zero():
  with pytest.warns(UserWarning, match="no key"):
    ours = shardopt.add_noise(0.1, 0.5)
  oracle.assert_matches_optax(ours, optax.add_noise(0.1, 0.5, key=0),
                              steps=3, with_params=False)


def test_state_and_annealing():
  params = oracle.mixed_tree()
  tx = shardopt.add_noise(eta=4.0, gamma=2.0, key=1)
  state = tx.init(params)
  zeros = jax.tree.map(np.zeros_like, params)
  noise1, state = tx.update(zeros, state)
  noise2, state = tx.update(zeros, state)
  assert int(state.count) == 2 and type(state).__name__ == "AddNoiseState"
  # std at step t is sqrt(4 / t**2) = 2 / t: the sample spread halves.
  spread = lambda t: np.std(np.concatenate(
      [np.ravel(x) for x in jax.tree.leaves(t)]))
  assert 1.5 < spread(noise1) < 2.5 and 0.75 < spread(noise2) < 1.25
  theirs = optax.add_noise(eta=4.0, gamma=2.0, key=1)
  their_state = theirs.init(params)
  for _ in range(2):
    _, their_state = theirs.update(zeros, their_state)
  np.testing.assert_array_equal(jax.random.key_data(state.rng_key),
                                jax.random.key_data(their_state.rng_key))
