"""Orthogonalising a matrix by Newton-Schulz iterations (Muon's core).

Each iteration maps X to ``c0 X + (c1 A + c2 A A) X`` with ``A = X X^H``.
Since that map commutes with transposition, a tall matrix is transposed
first so that the Gram matrix ``A`` is taken over the *smaller* side: for an
(m, n) matrix with m <= n, ``A`` is (m, m) and every product contracts over
n or m. Written as plain matmuls of the (possibly sharded) matrix, XLA's
sharding propagation partitions them: the contraction over a sharded side
becomes a partial product plus one all-reduce of the (m, m) Gram matrix,
and ``B X`` keeps X's layout (benchmarks/results/muon_communication.md
measures the collectives).

Parameters of rank > 2 are reshaped to a stack of matrices by
``MuonDimensionNumbers`` (batch axes are those named neither reduction nor
output) and orthogonalised matrix by matrix.
"""

from collections.abc import Sequence
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt._src import typed_layouts
from shardopt.contrib._matrix_axes import as_matrix_stack

__all__ = [
  "PRECONDITIONINGS",
  "MuonDimensionNumbers",
  "orthogonalize_via_newton_schulz",
]

PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")


class MuonDimensionNumbers(NamedTuple):
  """Which axes of a weight form the matrix that Muon orthogonalises.

  For ``y = x W`` the reduction (input) axis comes first and the output axis
  second, so the default describes a plain 2-D matrix. Axes named in neither
  are batch axes: each matrix along them is orthogonalised on its own.
  """

  reduction_axis: Sequence[int] | int = 0
  output_axis: Sequence[int] | int = 1


def _quintic_step(x, coeffs, gram):
  """``c0 x + (c1 A + c2 A A) x`` for the Gram matrix ``A`` of ``x``."""
  b = coeffs[1] * gram + coeffs[2] * gram @ gram
  return coeffs[0] * x + b @ x


def _gram_fn(mesh):
  """``x -> x x^H``; on an Explicit ``mesh`` the partial products over the
  sharded contraction are summed into a replicated (m, m) Gram matrix."""
  out_sharding = None if mesh is None else NamedSharding(mesh, P())
  return lambda x, conj=True: jnp.matmul(
      x, x.T.conj() if conj else x.T, out_sharding=out_sharding)


def _aol_first_step(x, coeffs, eps, gram_fn):
  """Almost-orthogonal-layer rescaling of the rows, then one step."""
  gram = gram_fn(x)
  row_scale = jax.lax.rsqrt(jnp.clip(jnp.abs(gram).sum(axis=-1), min=eps))
  row_scale = row_scale[:, None]
  return _quintic_step(x * row_scale, coeffs,
                       gram * row_scale * row_scale.transpose(-1, -2))


def _schatten_first_step(x, coeffs, eps, gram_fn):
  """Rescaling by the Schatten-4 norm (Frobenius norm of ``x x^T``)."""
  gram = gram_fn(x, conj=False)
  scale = jax.lax.rsqrt(jnp.clip(
      jnp.linalg.norm(gram, ord="fro", axis=(-2, -1)), min=eps))
  scale = jnp.expand_dims(scale, (0, -1))
  return _quintic_step(x * scale, coeffs, gram * scale**2)


def _plain_first_step(x, coeffs, eps, gram_fn):
  del eps
  return _quintic_step(x, coeffs, gram_fn(x))


_FIRST_STEPS = {"frobenius": _plain_first_step, "spectral": _plain_first_step,
                "aol": _aol_first_step, "schatten": _schatten_first_step}


def _precondition(x, preconditioning, eps, mesh):
  if preconditioning == "frobenius":
    return x / (jnp.linalg.norm(x, ord="fro") + eps)
  if preconditioning == "spectral":
    whole = x if mesh is None else jax.sharding.reshard(
        x, NamedSharding(mesh, P()))
    return x / (jnp.linalg.norm(whole, ord=2) + eps)
  return x


# Always compiled (inlined under jit): run op by op, the iterations round
# differently from a compiled loop (optax's, eager or not).
@functools.partial(jax.jit, inline=True,
                   static_argnames=("ns_steps", "preconditioning", "mesh"))
def _iterate_unrolled(x, coeffs, eps, *, ns_steps, preconditioning, mesh):
  """The iterations unrolled: one per row of (k, 3) coefficients, or
  ``ns_steps`` (an int) of (3,) ones."""
  gram_fn = _gram_fn(mesh)
  per_step = [coeffs] * ns_steps if coeffs.ndim == 1 else list(coeffs)
  if not per_step:
    return x
  x = _FIRST_STEPS[preconditioning](x, per_step[0], eps, gram_fn)
  for step_coeffs in per_step[1:]:
    x = _quintic_step(x, step_coeffs, gram_fn(x))
  return x


@functools.partial(jax.jit, inline=True,
                   static_argnames=("preconditioning", "mesh"))
def _iterate_looped(x, coeffs, eps, ns_steps, *, preconditioning, mesh):
  """``ns_steps`` (a traced count, e.g. an injected hyperparameter)
  iterations of (3,) coefficients: the first, then a loop over the rest."""
  gram_fn = _gram_fn(mesh)
  x = jax.lax.cond(
      ns_steps > 0,
      lambda y: _FIRST_STEPS[preconditioning](y, coeffs, eps, gram_fn),
      lambda y: y, x)
  return jax.lax.fori_loop(
      1, ns_steps, lambda _, y: _quintic_step(y, coeffs, gram_fn(y)), x)


def _iterate(x, coeffs, eps, ns_steps, preconditioning, mesh):
  """Unrolled unless ``ns_steps`` is traced and counts (3,) coefficients."""
  if coeffs.ndim == 1 and isinstance(ns_steps, jax.core.Tracer):
    return _iterate_looped(x, coeffs, eps, ns_steps,
                           preconditioning=preconditioning, mesh=mesh)
  return _iterate_unrolled(
      x, coeffs, eps, ns_steps=int(ns_steps) if coeffs.ndim == 1 else None,
      preconditioning=preconditioning, mesh=mesh)


def _orthogonalize_matrix(x, coeffs, ns_steps, preconditioning, eps):
  """One (m, n) matrix, the Gram matrix over its smaller side.

  On an Explicit mesh the layout is chosen here: the rows (the Gram side)
  are gathered once, the columns stay sharded, so each iteration's only
  communication is the all-reduce of the (m, m) Gram matrix; the result
  is laid out as ``x`` was. Elsewhere XLA's propagation partitions it.
  """
  tall = x.shape[0] > x.shape[1]
  x = x.T if tall else x
  layout = typed_layouts.explicit_sharding(x)
  mesh = None if layout is None else layout.mesh
  if layout is not None:
    columns = layout.spec[1] if len(layout.spec) > 1 else None
    x = jax.sharding.reshard(x, NamedSharding(mesh, P(None, columns)))
  x = _precondition(x, preconditioning, eps, mesh)
  x = _iterate(x, coeffs.astype(x.dtype), eps, ns_steps, preconditioning, mesh)
  if layout is not None:
    x = jax.sharding.reshard(x, layout)
  return x.T if tall else x


def orthogonalize_via_newton_schulz(
    x: jax.Array,
    ns_coeffs: jax.Array,
    ns_steps: int = 5,
    preconditioning: str = "frobenius",
    eps: jax.typing.ArrayLike = 1e-8,
    dimension_numbers: MuonDimensionNumbers | None = None,
) -> jax.Array:
  """``x`` with each of its matrices orthogonalised by Newton-Schulz.

  Args:
    x: a matrix, or an array whose matrices ``dimension_numbers`` names.
    ns_coeffs: quintic coefficients, shape (3,) (used ``ns_steps`` times) or
      (k, 3) (one row per step, ``ns_steps`` ignored).
    ns_steps: number of iterations for (3,) coefficients (an int, or a
      traced integer such as an injected hyperparameter).
    preconditioning: 'frobenius' or 'spectral' (divide by that norm first),
      'aol' or 'schatten' (a rescaled first iteration).
    eps: added to denominators.
    dimension_numbers: the matrix axes of ``x`` (ignored for a 2-D ``x``).

  Returns:
    An array of ``x``'s shape whose singular values are close to 1.

  References:
    Jordan, "modded-nanogpt: Speedrunning the NanoGPT baseline", 2024
    (https://github.com/KellerJordan/modded-nanogpt).
  """
  if preconditioning not in PRECONDITIONINGS:
    raise ValueError(f"preconditioning={preconditioning!r}: use one of "
                     f"{PRECONDITIONINGS}")
  if ns_coeffs.ndim not in (1, 2) or ns_coeffs.shape[-1] != 3:
    raise ValueError("Newton-Schulz coefficients must have shape (3,) or "
                     f"(k, 3); got {ns_coeffs.shape}")
  if x.ndim == 2:  # a matrix is always taken as (reduction, output)
    dimension_numbers = MuonDimensionNumbers()
  elif dimension_numbers is None:
    raise ValueError(
        f"a parameter of shape {x.shape} needs MuonDimensionNumbers naming"
        " its matrix axes (only 2-D parameters default to (0, 1)).")
  to_stack, from_stack = as_matrix_stack(x.shape, dimension_numbers)
  orthogonalize = lambda m: _orthogonalize_matrix(
      m, ns_coeffs, ns_steps, preconditioning, eps)
  return from_stack(jax.vmap(orthogonalize)(to_stack(x)))
