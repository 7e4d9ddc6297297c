"""Per-block matrix functions for Shampoo and SOAP: inverse roots, eigenbases.

Every function takes a stack of symmetric positive semi-definite blocks of
shape ``(n_1, ..., n_k, b, b)`` and returns a stack of the same shape.

Eigendecompositions run one block at a time through ``jax.lax.map``: a
batched ``eigh`` inside a program sharded over several simulated CPU devices
can deadlock (LAPACK's batched loop waits on the thread pool that the other
devices' threads hold). On Explicit mesh axes the blocks' shardings are
known while tracing, and each device maps over its own blocks
(``jax.shard_map``): the compiled step has no collective. On Auto axes the
partitioner cannot split that loop over sharded blocks: at a refresh the
step all-gathers each statistic and every device decomposes every block
(the FSDP x TP transformer tree of tests/blocked_layout.py: 40
all-gathers; the statistics stay sharded between steps). The coupled Newton
iteration uses matrix products only, batched over the blocks, so it runs
where the blocks live on either kind of axes, with no collective
(tests/test_shampoo.py, tests/test_soap.py).
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shardopt.contrib import _blocking as blocking

__all__ = ["eigenbasis", "inverse_root"]


def _per_block(fn, mats: jax.Array) -> jax.Array:
  """``fn`` applied to each ``(b, b)`` block, one after another (on Explicit
  mesh axes, each device through its own blocks, whichever grid dims carry
  the mesh axes)."""
  b = mats.shape[-1]

  def mapped(blocks):
    flat = jnp.reshape(blocks, (-1, b, b))
    return jnp.reshape(jax.lax.map(fn, flat), blocks.shape)

  spec = blocking.explicit_spec(mats)
  if spec is not None:
    grid = P(*spec[:-2], None, None)  # a block is never split
    mapped = jax.shard_map(mapped, mesh=jax.typeof(mats).sharding.mesh,
                           in_specs=grid, out_specs=grid)
  return mapped(mats)


def eigenbasis(mats: jax.Array) -> jax.Array:
  """Per block, the eigenvectors (columns, ascending eigenvalues)."""
  return _per_block(lambda m: jnp.linalg.eigh(m)[1], mats)


def _inverse_root_eigh(mats: jax.Array, p: int, eps: float) -> jax.Array:
  def root(m):
    values, vectors = jnp.linalg.eigh(m)
    scale = jnp.maximum(values, 0.0) + eps
    return (vectors * scale[None, :] ** (-1.0 / p)) @ vectors.T
  return _per_block(root, mats)


def _inverse_root_newton(mats: jax.Array, p: int, eps: float,
                         iterations: int) -> jax.Array:
  """Coupled Newton iteration (Guo and Higham 2006; Anil et al. 2020, alg. 3)."""
  eye = jnp.eye(mats.shape[-1], dtype=mats.dtype)
  damped = mats + eps * eye
  norm = jnp.sqrt(jnp.sum(damped * damped, axis=(-2, -1), keepdims=True))
  z = (1.0 + p) / (2.0 * norm)
  m = damped * z
  h = jnp.zeros_like(mats) + eye * z ** (1.0 / p)

  def body(_, carry):
    m, h = carry
    step = ((p + 1.0) * eye - m) / p
    power = step
    for _ in range(p - 1):
      power = power @ step
    return power @ m, h @ step

  return jax.lax.fori_loop(0, iterations, body, (m, h))[1]


def inverse_root(mats: jax.Array, p: int, eps: float, method: str = "eigh",
                 newton_iterations: int = 40) -> jax.Array:
  """Per block, ``(A + eps I)^(-1/p)``.

  Args:
    mats: symmetric positive semi-definite blocks ``(..., b, b)``.
    p: the root.
    eps: added to every eigenvalue (the diagonal) first.
    method: ``'eigh'`` (an eigendecomposition per block) or ``'newton'`` (the
      coupled Newton iteration, matrix products only).
    newton_iterations: iterations of the Newton method.

  Returns:
    The inverse ``p``-th roots, shaped like ``mats``.
  """
  if method == "eigh":
    return _inverse_root_eigh(mats, p, eps)
  if method == "newton":
    return _inverse_root_newton(mats, p, eps, newton_iterations)
  raise ValueError(f"inverse_root_method={method!r}: expected 'eigh' or "
                   "'newton'.")
