"""shardopt.assignment against scipy's linear_sum_assignment (the optimal
cost) and optax's: shapes, a valid one-to-one assignment, jit and vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.optimize

import shardopt
from shardopt import assignment

_SOLVE = jax.jit(assignment.hungarian_algorithm)


def _check(costs, i, j):
  costs = np.asarray(costs)
  r = min(costs.shape)
  assert i.shape == j.shape == (r,)
  assert jnp.issubdtype(i.dtype, jnp.integer) and jnp.issubdtype(j.dtype, jnp.integer)
  assert np.all(np.diff(np.asarray(i)) > 0)  # rows increasing, each once
  assert len(set(np.asarray(j).tolist())) == r and np.all((0 <= j) & (j < costs.shape[1]))
  rows, cols = scipy.optimize.linear_sum_assignment(costs)
  np.testing.assert_allclose(costs[np.asarray(i), np.asarray(j)].sum(), costs[rows, cols].sum(),
                             rtol=1e-5, atol=1e-6)


def test_optimal_on_random_and_tied_costs():
  for n, m in [(0, 3), (4, 7), (7, 4), (6, 6)]:
    for seed in range(2):
      costs = jax.random.normal(jax.random.PRNGKey(seed), (n, m))
      _check(costs, *_SOLVE(costs))
  tied = jax.random.randint(jax.random.PRNGKey(0), (6, 6), 0, 3).astype(jnp.float32)
  _check(tied, *_SOLVE(tied))


def test_optaxs_docstring_example_and_cost():
  cost = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]], jnp.float32)
  i, j = _SOLVE(cost)
  assert i.tolist() == [0, 1, 3] and j.tolist() == [0, 2, 1]
  costs = jax.random.normal(jax.random.PRNGKey(3), (4, 7))
  theirs = costs[jax.jit(optax.assignment.hungarian_algorithm)(costs)].sum()
  np.testing.assert_allclose(costs[_SOLVE(costs)].sum(), theirs, rtol=1e-6)
  base = assignment.base_hungarian_algorithm(costs)
  np.testing.assert_array_equal(base, _SOLVE(costs))
  assert shardopt.assignment is assignment


def test_vmap_over_a_batch_of_problems():
  costs = jax.random.normal(jax.random.PRNGKey(4), (3, 4, 7))
  i, j = jax.jit(jax.vmap(assignment.hungarian_algorithm))(costs)
  assert i.shape == j.shape == (3, 4)
  for k in range(3):
    _check(costs[k], i[k], j[k])
