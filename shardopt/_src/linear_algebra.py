"""Small linear-algebra solvers with optax's names: the dominant eigenpair
(power iteration), a matrix's inverse p-th root (coupled Newton iteration)
and non-negative least squares (fast projected gradient)."""

import functools
from typing import Any
from typing import Callable

import jax
from jax import lax
import jax.numpy as jnp

from shardopt._src import tree_math
from shardopt._src import tree_reductions

__all__ = [
    "matrix_inverse_pth_root",
    "nnls",
    "power_iteration",
]


def _normalized(tree: Any) -> Any:
  """``tree`` divided by its Euclidean norm."""
  return tree_math.tree_scale(1.0 / tree_reductions.tree_norm(tree), tree)


def _not_converged(error_tolerance, num_iters, loop_vars) -> jax.Array:
  """Whether to iterate again: the eigen-residual ``|A v - lambda v|``
  relative to ``|lambda|`` is not below the tolerance, and iterations remain."""
  vector, product, eigenvalue, iteration = loop_vars
  residual = tree_math.tree_sub(product, tree_math.tree_scale(eigenvalue, vector))
  converged = jnp.abs(tree_reductions.tree_norm(residual) / eigenvalue) < error_tolerance
  return ~converged & (iteration < num_iters)


def power_iteration(
    matrix: jax.Array | Callable[[Any], Any],
    *,
    v0: Any = None,
    num_iters: int = 100,
    error_tolerance: float = 1e-6,
    precision: lax.Precision = lax.Precision.HIGHEST,
    key: jax.Array | None = None,
) -> tuple[jax.Array, Any]:
  """The dominant eigenvalue of a diagonalizable matrix and its eigenvector.

  Repeats ``v <- A v / |A v|`` until the eigen-residual relative to the
  eigenvalue estimate ``<v, A v>`` is below ``error_tolerance``, or for
  ``num_iters`` iterations. May not converge when the dominant eigenvalue is
  not unique.

  Args:
    matrix: a square matrix, or a function computing a matrix-vector product
      on a tree (e.g. a Hessian-vector product).
    v0: the starting vector (a tree, for a function ``matrix``: required
      then). Default for an array: uniform in [-1, 1] from ``key``.
    num_iters: the most iterations.
    error_tolerance: the relative residual at which to stop.
    precision: the matrix products' precision (for an array ``matrix``).
    key: the PRNG key drawing the default ``v0`` (default
      ``jax.random.PRNGKey(0)``).

  Returns:
    ``(eigenvalue, eigenvector)``, the eigenvector normalized.

  Raises:
    ValueError: for a function ``matrix`` without ``v0``.

  References:
    Golub & Van Loan, "Matrix Computations", 4th ed. 2013, Sec. 8.2.1;
    "Power iteration", Wikipedia
    (https://en.wikipedia.org/wiki/Power_iteration).
  """
  if callable(matrix):
    if v0 is None:
      raise ValueError("power_iteration: a function `matrix` needs v0, a tree the"
                       " function takes (its structure is not known otherwise)")
    product = matrix
  else:
    product = functools.partial(jnp.matmul, matrix, precision=precision)
    if v0 is None:
      key = jax.random.PRNGKey(0) if key is None else key
      v0 = jax.random.uniform(key, matrix.shape[-1:], matrix.dtype, -1.0, 1.0)
  v0 = _normalized(v0)

  def step(loop_vars):
    _, last_product, _, iteration = loop_vars
    vector = _normalized(last_product)
    new_product = product(vector)
    eigenvalue = tree_math.tree_inner_product(vector, new_product)
    return vector, new_product, eigenvalue, iteration + 1

  start = (v0, product(v0), jnp.asarray(0.0), jnp.asarray(0))
  _, last_product, eigenvalue, _ = lax.while_loop(
      functools.partial(_not_converged, error_tolerance, num_iters), step, start)
  return eigenvalue, _normalized(last_product)


def _power_of_two(matrix: jax.Array, p, precision) -> jax.Array:
  """``matrix ** p`` for p in (1, 2, 4, 8), by repeated squaring (a traced
  ``p`` picks the branch of ``round(log2(p))``)."""
  def square(m):
    return jnp.matmul(m, m, precision=precision)

  branches = [lambda m: m, square, lambda m: square(square(m)),
              lambda m: square(square(square(m)))]
  return lax.switch(jnp.asarray(jnp.round(jnp.log2(p)), jnp.int32), branches, matrix)


def matrix_inverse_pth_root(
    matrix: jax.Array,
    p: int,
    num_iters: int = 100,
    ridge_epsilon: float = 1e-6,
    error_tolerance: float = 1e-6,
    precision: lax.Precision = lax.Precision.HIGHEST,
) -> tuple[jax.Array, jax.Array]:
  """``matrix ** (-1/p)`` of a symmetric positive semi-definite matrix.

  The coupled Newton iteration: with ``M_0 = z (A + r I)``, ``H_0 = z**(1/p)
  I`` and ``z = (1 + p) / (2 |A + r I|_F)``, repeat ``X = ((p + 1) I -
  M) / p``, ``M <- X**p M``, ``H <- H X``, so that ``M -> I`` and ``H ->
  (A + r I)**(-1/p)``. It stops when ``max |M - I|`` is below
  ``error_tolerance``, after ``num_iters`` steps, or when the error grows by
  more than 1.2x (then the previous ``H`` is returned). The ridge ``r`` is
  ``ridge_epsilon`` times the largest eigenvalue (by ``power_iteration``).
  The iteration runs in float32; the result has ``matrix``'s dtype.

  Args:
    matrix: a symmetric PSD matrix ``(n, n)``.
    p: the root, 1, 2, 4 or 8.
    num_iters: the most iterations.
    ridge_epsilon: the ridge relative to the largest eigenvalue.
    error_tolerance: the error ``max |M - I|`` at which to stop.
    precision: the matrix products' precision.

  Returns:
    ``(root, error)``: the inverse p-th root and the final ``max |M - I|``
    (0 for a 1x1 matrix).

  Raises:
    ValueError: for a Python number ``p`` other than 1, 2, 4 or 8.

  References:
    Higham, "Functions of Matrices: Theory and Computation", SIAM 2008,
    Eq. (7.18) (https://doi.org/10.1137/1.9780898717778); Guo & Higham, "A
    Schur-Newton method for the matrix p-th root and its inverse", SIAM J.
    Matrix Anal. Appl. 2006 (https://doi.org/10.1137/050643374).
  """
  if isinstance(p, (int, float)) and p not in (1, 2, 4, 8):
    raise ValueError(f"matrix_inverse_pth_root: p must be 1, 2, 4 or 8, got {p}")
  size = matrix.shape[0]
  alpha = jnp.asarray(-1.0 / p, jnp.float32)
  identity = jnp.eye(size, dtype=jnp.float32)
  largest, _ = power_iteration(matrix, num_iters=100, error_tolerance=1e-6,
                               precision=precision)
  ridge = ridge_epsilon * jnp.maximum(largest, 1e-16)
  if size == 1:
    return (matrix + ridge) ** alpha, 0

  def keep_going(state):
    i, _, _, _, error, improving = state
    return (i < num_iters) & (error > error_tolerance) & improving

  def newton_step(state):
    i, m, h, _, error, _ = state
    x = (1 - alpha) * identity + alpha * m
    new_m = jnp.matmul(_power_of_two(x, p, precision), m, precision=precision)
    new_h = jnp.matmul(h, x, precision=precision)
    new_error = jnp.max(jnp.abs(new_m - identity))
    # The error may rise once before it falls: up to 1.2x is allowed.
    return i + 1, new_m, new_h, h, new_error, new_error < 1.2 * error

  damped = matrix + ridge * identity
  z = (1 + p) / (2 * jnp.linalg.norm(damped))
  m0 = damped * z
  h0 = identity * jnp.power(z, 1.0 / p)
  start = (0, m0, h0, h0, jnp.max(jnp.abs(m0 - identity)), True)
  _, m, h, previous_h, _, improving = lax.while_loop(keep_going, newton_step, start)
  error = jnp.max(jnp.abs(m - identity))
  improved = jnp.asarray(improving, previous_h.dtype)
  root = improved * h + (1 - improved) * previous_h
  return jnp.asarray(root, matrix.dtype), error


def _spectral_radius_bound(matrix: jax.Array) -> jax.Array:
  """An upper bound of the spectral radius: min(Frobenius norm, 1-norm)."""
  frobenius = jnp.linalg.matrix_norm(matrix, ord="fro")
  one_norm = jnp.linalg.matrix_norm(matrix, ord=1) if matrix.size else 0
  return jnp.minimum(frobenius, one_norm)


# pylint: disable=invalid-name (optax's argument names A and L)
def nnls(A: jax.Array, b: jax.Array, iters: int, unroll: int | bool = 1,  # noqa: N803
         L: jax.Array | float | None = None) -> jax.Array:  # noqa: N803
  """Non-negative least squares: ``argmin |A x - b|_2`` over ``x >= 0``.

  The fast projected gradient method: a projected gradient step of size
  ``1 / L`` on ``|A x - b|**2 / 2`` from an extrapolated point, with
  Nesterov's momentum weights, for ``iters`` steps from ``x = 0``.

  Args:
    A: the matrix ``(m, n)``.
    b: the target ``(m,)``, or ``(m, k)`` for k problems at once.
    iters: the number of steps.
    unroll: passed to ``lax.scan``.
    L: an upper bound of the spectral radius of ``A.T @ A`` (default
      ``min(|A.T A|_F, |A.T A|_1)``).

  Returns:
    ``x``, shaped ``(n,)`` or ``(n, k)``.

  Raises:
    ValueError: for ``A`` not a matrix, ``b`` not of rank 1 or 2, or their
      first dimensions different.

  References:
    Polyak, "Projected gradient method for non-negative least square",
    Contemporary Mathematics 636, 2015 (http://www.ams.org/books/conm/636/).
  """
  if A.ndim != 2 or b.ndim not in (1, 2) or b.shape[0] != A.shape[0]:
    raise ValueError(f"nnls: A must be (m, n) and b (m,) or (m, k); got A {A.shape}, b"
                     f" {b.shape}")
  gram, target = A.mT @ A, A.mT @ b
  L = _spectral_radius_bound(gram) if L is None else L  # noqa: N806
  L = jnp.where(L == 0, 1, L)  # noqa: N806 (a zero matrix: any step is exact)

  def step(carry, _):
    x, point, c = carry
    next_c = (1 + jnp.sqrt(1 + 4 * c**2)) / 2
    momentum = (c - 1) / next_c
    next_x = (point - (gram @ point - target) / L).clip(0)
    return (next_x, next_x + momentum * (next_x - x), next_c), None

  x0 = jnp.zeros_like(b, shape=A.shape[-1:] + b.shape[1:])
  (x, _, _), _ = lax.scan(step, (x0, x0, 0.0), length=iters, unroll=unroll)
  return x
