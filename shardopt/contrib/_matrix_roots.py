"""Per-block matrix functions for Shampoo and SOAP: inverse roots, eigenbases.

Every function takes a stack of symmetric positive semi-definite blocks of
shape ``(n_1, ..., n_k, b, b)`` and returns a stack of the same shape,
computed one block at a time on the devices that hold the blocks
(``_blockwise``): where the blocks tile the shards, no collective.
"""

import functools

import jax
import jax.numpy as jnp

from shardopt.contrib._blockwise import blockwise

__all__ = ["check_method", "eigenbasis", "inverse_root", "orthonormal"]


def _per_block(fn, mats: jax.Array, *more: jax.Array) -> jax.Array:
  return blockwise(fn, mats.ndim - 2, mats, *more)


def eigenbasis(mats: jax.Array) -> jax.Array:
  """Per block, the eigenvectors (columns, ascending eigenvalues)."""
  return _per_block(_eigenvectors, mats)


def _at_least_float32(fn):
  """``fn`` of one block computed in float32 where the block is narrower
  (LAPACK's ``eigh`` and ``qr`` have no bfloat16 or float16 kernels), its
  result cast back to the block's dtype."""

  @functools.wraps(fn)
  def wrapped(m, *args, **kwargs):
    if jnp.finfo(m.dtype).bits >= 32:
      return fn(m, *args, **kwargs)
    return fn(m.astype(jnp.float32), *args, **kwargs).astype(m.dtype)

  return wrapped


@_at_least_float32
def _eigenvectors(m):
  return jnp.linalg.eigh(m)[1]


@_at_least_float32
def orthonormal(m: jax.Array) -> jax.Array:
  """The ``Q`` of one block's QR decomposition (call inside ``blockwise``)."""
  return jnp.linalg.qr(m)[0]


def inverse_root(mats: jax.Array, p: int, eps: float, method: str = "eigh",
                 previous: jax.Array | None = None,
                 newton_iterations: int = 40) -> jax.Array:
  """Per block, ``(A + eps lambda_max(A) I)^(-1/p)``.

  ``eps`` is relative to the block's largest eigenvalue, so the damping
  scales with the statistics; a block of zeros gets the identity.

  Args:
    mats: symmetric positive semi-definite blocks ``(..., b, b)``.
    p: the root.
    eps: the damping, relative to each block's largest eigenvalue.
    method: ``'eigh'`` (an eigendecomposition per block) or ``'newton'`` (the
      coupled Newton iteration, matrix products only).
    previous: ``'newton'`` only: the roots kept where the iteration does not
      reach an error of ``_FAILURE``, or gives a non-finite result (default
      the identity).
    newton_iterations: the most iterations of the Newton method.

  Returns:
    The inverse ``p``-th roots, shaped like ``mats``.
  """
  check_method(method)
  if method == "eigh":
    return _per_block(functools.partial(_root_by_eigh, p=p, eps=eps), mats)
  if previous is None:
    previous = jnp.zeros_like(mats) + jnp.eye(mats.shape[-1], dtype=mats.dtype)
  newton = functools.partial(_root_by_newton, p=p, eps=eps,
                             iterations=newton_iterations)
  return _per_block(newton, mats, previous)


def check_method(method: str) -> None:
  if method not in ("eigh", "newton"):
    raise ValueError(f"inverse_root_method={method!r}: expected 'eigh' or "
                     "'newton'.")


@_at_least_float32
def _root_by_eigh(m, p, eps):
  values, vectors = jnp.linalg.eigh(m)
  values = jnp.maximum(values, 0.0)
  top = jnp.max(values)
  scale = (values + eps * jnp.where(top > 0, top, 1.0)) ** (-1.0 / p)
  return jnp.where(top > 0, (vectors * scale[None, :]) @ vectors.T,
                   jnp.eye(m.shape[-1], dtype=m.dtype))


def _max_eigenvalue(m, iterations: int = 20):
  """The largest eigenvalue of a PSD block: power iteration from a fixed
  vector, at least ``||A||_F / sqrt(b)`` (a lower bound, so a start vector
  orthogonal to the top eigenvector cannot give 0)."""
  tiny = jnp.finfo(m.dtype).tiny
  v = jnp.zeros_like(m[0]) + jnp.linspace(1.0, 2.0, m.shape[-1], dtype=m.dtype)
  step = lambda _, v: (m @ v) / jnp.maximum(jnp.linalg.norm(m @ v), tiny)
  v = jax.lax.fori_loop(0, iterations, step, v)
  rayleigh = (v @ m @ v) / jnp.maximum(v @ v, tiny)
  return jnp.maximum(rayleigh, jnp.linalg.norm(m) / jnp.sqrt(float(m.shape[-1])))


def _root_by_newton(m, previous, p, eps, iterations):
  """Coupled Newton iteration (Guo and Higham 2006; Anil et al. 2020, alg. 3).

  ``M_0 = z (A + eps lambda_max I)``, ``H_0 = z^(1/p) I`` with
  ``z = (1 + p) / (2 ||.||_F)``; each iteration ``S = ((p + 1) I - M) / p``,
  ``M <- S^p M``, ``H <- H S``, so ``H -> (A + eps lambda_max I)^(-1/p)`` as
  ``M -> I``. The iterate of least error ``max |M - I|`` is kept; the
  iteration stops once the error grows past ``_GROWTH`` times the last one
  or an iterate is not finite. Where the least error exceeds ``_FAILURE``
  (or the statistic is not finite, as a NaN in it gives) ``previous`` is
  kept; a block of zeros gets the identity.
  """
  eye = jnp.eye(m.shape[-1], dtype=m.dtype)
  top = _max_eigenvalue(m)
  zero = top == 0
  damped = m + eps * jnp.where(zero, 1.0, top) * eye
  z = (1.0 + p) / (2.0 * jnp.linalg.norm(damped))
  error_of = lambda x: jnp.max(jnp.abs(x - eye))
  finite = lambda x: jnp.all(jnp.isfinite(x))

  def body(_, carry):
    m, h, error, best, best_error, active = carry
    step = ((p + 1.0) * eye - m) / p
    power = step
    for _ in range(p - 1):
      power = power @ step
    new_m, new_h = power @ m, h @ step
    new_error = error_of(new_m)
    active = active & (new_error < _GROWTH * error) & finite(new_m) & finite(new_h)
    improved = active & (new_error < best_error)
    return (jnp.where(active, new_m, m), jnp.where(active, new_h, h),
            jnp.where(active, new_error, error), jnp.where(improved, new_h, best),
            jnp.where(improved, new_error, best_error), active)

  m, h = damped * z, eye * z ** (1.0 / p)
  error = error_of(m)
  carry = (m, h, error, h, error, jnp.ones_like(error, bool))
  _, _, _, best, best_error, _ = jax.lax.fori_loop(0, iterations, body, carry)
  ok = (best_error <= _FAILURE) & finite(best)
  return jnp.where(zero, eye, jnp.where(ok, best, previous))


# Newton: a block iterates while max |M - I| stays below _GROWTH times its
# last value, and keeps its iterate of least error; that result is used where
# its error is at most _FAILURE (distributed Shampoo's defaults, Anil et al.),
# elsewhere the last preconditioner.
_GROWTH = 1.2
_FAILURE = 0.1
