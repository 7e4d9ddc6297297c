"""shardopt.assignment against scipy's linear_sum_assignment (the optimal
cost) and optax's (the same indices in the same order): shapes, a valid
one-to-one assignment, jit and vmap."""

import doctest

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
  assert len(set(np.asarray(i).tolist())) == r  # each row once
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


def _problems():
  """Random and tied (few distinct values) costs: square, wide and tall."""
  for shape in [(1, 1), (5, 5), (6, 6), (1, 4), (3, 7), (2, 9), (4, 1), (7, 3),
                (9, 2)]:
    for seed in range(6):
      key = jax.random.PRNGKey(seed)
      yield jax.random.normal(key, shape)
      yield jax.random.randint(key, shape, 0, 3).astype(jnp.float32)


def _assert_same_indices(got, want):
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
    assert g.dtype == w.dtype


def test_indices_and_their_order_match_optax():
  # optax: j = arange(n) for a square matrix, else the shorter side's
  # indices decreasing; ties broken alike.
  theirs = jax.jit(optax.assignment.hungarian_algorithm)
  for costs in _problems():
    _assert_same_indices(_SOLVE(costs), theirs(costs))


def test_base_matches_optax_on_random_and_tied_costs():
  # optax's base_hungarian_algorithm is Crouse's algorithm: on ties (integer
  # costs of few values) it picks one of several optimal assignments, the
  # same one here; rows increasing.
  theirs = jax.jit(optax.assignment.base_hungarian_algorithm)
  ours = jax.jit(assignment.base_hungarian_algorithm)
  for costs in _problems():
    got = ours(costs)
    _assert_same_indices(got, theirs(costs))
    _check(costs, *got)
    assert np.all(np.diff(np.asarray(got[0])) > 0)
  integer = jax.random.randint(jax.random.PRNGKey(7), (4, 6), 0, 2)
  _assert_same_indices(ours(integer), theirs(integer))
  batch = jax.random.randint(jax.random.PRNGKey(3), (5, 4, 6), 0, 3).astype(float)
  _assert_same_indices(jax.vmap(ours)(batch), jax.jit(jax.vmap(
      optax.assignment.base_hungarian_algorithm))(batch))


def test_optaxs_docstring_examples():
  tall = jnp.array([[8, 4, 7], [5, 2, 3], [9, 6, 7], [9, 4, 8]])
  i, j = _SOLVE(tall)
  assert i.tolist() == [1, 3, 0] and j.tolist() == [2, 1, 0]
  assert int(tall[i, j].sum()) == 15
  i, j = assignment.base_hungarian_algorithm(tall)
  assert i.tolist() == [0, 1, 3] and j.tolist() == [0, 2, 1]
  wide = jnp.array([[90, 80, 75, 70], [35, 85, 55, 65], [125, 95, 90, 95],
                    [45, 110, 95, 115], [50, 100, 90, 100]]).T  # (4, 5)
  i, j = _SOLVE(wide)
  _assert_same_indices((i, j), optax.assignment.hungarian_algorithm(wide))
  assert int(wide[i, j].sum()) == 265
  assert shardopt.assignment is assignment


def test_docstring_example_runs():
  tests = doctest.DocTestFinder(recurse=False).find(
      assignment.hungarian_algorithm, "hungarian_algorithm")
  runner = doctest.DocTestRunner()
  report = []
  for test in tests:
    runner.run(test, out=report.append)
  results = runner.summarize(verbose=False)
  assert results.attempted > 0 and results.failed == 0, "".join(report)


def test_vmap_over_a_batch_of_problems():
  costs = jax.random.normal(jax.random.PRNGKey(4), (3, 4, 7))
  i, j = jax.jit(jax.vmap(assignment.hungarian_algorithm))(costs)
  assert i.shape == j.shape == (3, 4)
  for k in range(3):
    _check(costs[k], i[k], j[k])
  _assert_same_indices(
      (i, j), jax.jit(jax.vmap(optax.assignment.hungarian_algorithm))(costs))
