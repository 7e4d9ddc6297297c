"""power_iteration, matrix_inverse_pth_root and nnls against optax's and
against direct solutions (eigh, scipy's NNLS)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.optimize

import shardopt


def _psd(seed, n):
  x = jax.random.normal(jax.random.PRNGKey(seed), (n, n))
  return x @ x.T / n + 0.1 * jnp.eye(n)


def test_power_iteration_matches_optax_and_eigh():
  matrix = _psd(0, 6)
  ours = jax.jit(lambda m: shardopt.power_iteration(m, num_iters=300))(matrix)
  theirs = jax.jit(lambda m: optax.power_iteration(m, num_iters=300))(matrix)
  np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-6)
  np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-5, atol=1e-6)
  values, vectors = np.linalg.eigh(np.asarray(matrix, np.float64))
  np.testing.assert_allclose(ours[0], values[-1], rtol=1e-5)
  np.testing.assert_allclose(abs(np.dot(ours[1], vectors[:, -1])), 1.0, rtol=1e-4)


def test_power_iteration_on_a_tree_through_a_product_function():
  blocks = {"a": _psd(1, 3), "b": 3.0 * _psd(2, 2)}  # block-diagonal operator
  v0 = {"a": jnp.ones(3), "b": jnp.ones(2)}

  def product(v):
    return {k: blocks[k] @ v[k] for k in blocks}

  eigenvalue, vector = shardopt.power_iteration(product, v0=v0, num_iters=500)
  want = max(np.linalg.eigvalsh(np.asarray(m)).max() for m in blocks.values())
  np.testing.assert_allclose(eigenvalue, want, rtol=1e-4)
  np.testing.assert_allclose(eigenvalue, optax.power_iteration(product, v0=v0, num_iters=500)[0],
                             rtol=1e-6)
  assert jax.tree.structure(vector) == jax.tree.structure(v0)
  with pytest.raises(ValueError, match="needs v0"):
    shardopt.power_iteration(product)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_matrix_inverse_pth_root_matches_optax_and_eigh(p):
  matrix = _psd(3, 8)
  root, error = jax.jit(shardopt.matrix_inverse_pth_root, static_argnums=1)(matrix, p)
  want_root, want_error = jax.jit(optax.matrix_inverse_pth_root, static_argnums=1)(matrix, p)
  np.testing.assert_allclose(root, want_root, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(error, want_error, rtol=1e-5, atol=1e-7)
  values, vectors = np.linalg.eigh(np.asarray(matrix, np.float64))
  exact = (vectors * values ** (-1.0 / p)) @ vectors.T
  np.testing.assert_allclose(root, exact, rtol=1e-3, atol=1e-4)


def test_matrix_inverse_pth_root_of_a_scalar_and_bad_p():
  root, error = shardopt.matrix_inverse_pth_root(jnp.array([[4.0]]), 2)
  np.testing.assert_allclose(root, [[0.5]], rtol=1e-5)
  assert error == 0
  with pytest.raises(ValueError, match="p must be 1, 2, 4 or 8"):
    shardopt.matrix_inverse_pth_root(jnp.eye(3), 3)


@pytest.mark.parametrize("targets", [1, 3])
def test_nnls_matches_optax_and_scipy(targets):
  a = jax.random.normal(jax.random.PRNGKey(4), (12, 5))
  b = jax.random.normal(jax.random.PRNGKey(5), (12, targets)).squeeze()
  x = jax.jit(shardopt.nnls, static_argnums=2)(a, b, 2000)
  np.testing.assert_allclose(x, jax.jit(optax.nnls, static_argnums=2)(a, b, 2000),
                             rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(x) >= 0)
  columns = np.asarray(b).reshape(12, -1).T
  want = np.stack([scipy.optimize.nnls(np.asarray(a, np.float64), c)[0] for c in columns], -1)
  np.testing.assert_allclose(np.asarray(x).reshape(5, -1), want, atol=1e-4)


def test_nnls_names_bad_shapes():
  with pytest.raises(ValueError, match=r"A must be \(m, n\)"):
    shardopt.nnls(jnp.ones((3, 2)), jnp.ones(4), 10)
