"""Reductions of whole trees to one value: sum, max, min, size, norms,
closeness.

The reductions use ``jnp`` reductions per leaf, so on a mesh each leaf's
partial result is combined by the compiler (an all-reduce of a scalar), never
by gathering the leaf.
"""

import functools
import operator
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "tree_allclose",
    "tree_max",
    "tree_min",
    "tree_norm",
    "tree_size",
    "tree_sum",
]


def tree_sum(tree: Any, associative_reduction: bool = False) -> jax.Array:
  """The sum of all elements of all leaves.

  Args:
    tree: a tree of arrays.
    associative_reduction: add the per-leaf sums as a balanced tree
      (``jax.tree.reduce_associative``) rather than left to right.

  Returns:
    A scalar (``0`` for a tree without leaves).
  """
  sums = jax.tree.map(jnp.sum, tree)
  if associative_reduction:
    return jax.tree.reduce_associative(operator.add, sums, identity=0)
  return jax.tree.reduce(operator.add, sums, initializer=0)


def _reduce_nonempty(reduce_leaf, combine, tree: Any, initial: float):
  partial = [reduce_leaf(x) for x in jax.tree.leaves(tree) if jnp.size(x)]
  return functools.reduce(combine, partial, initial)


def tree_max(tree: Any) -> jax.Array:
  """The largest element over all leaves (``-inf`` when there is none)."""
  return _reduce_nonempty(jnp.max, jnp.maximum, tree, -float("inf"))


def tree_min(tree: Any) -> jax.Array:
  """The smallest element over all leaves (``inf`` when there is none)."""
  return _reduce_nonempty(jnp.min, jnp.minimum, tree, float("inf"))


def tree_size(tree: Any) -> int:
  """The number of elements over all leaves."""
  return sum(jnp.size(x) for x in jax.tree.leaves(tree))


def _abs_square(x) -> jax.Array:
  """``|x|**2``; of a real ``x`` without its (zero) imaginary part, which
  jax builds on one device: called eagerly on Explicit mesh axes, that
  failed against ``x``'s mesh."""
  if not jnp.iscomplexobj(x):
    return jnp.square(x)
  return jnp.square(jnp.real(x)) + jnp.square(jnp.imag(x))


def tree_norm(tree: Any, ord: str | float | None = None,  # pylint: disable=redefined-builtin
              squared: bool = False) -> jax.Array:
  """The vector norm of all leaves taken together.

  Args:
    tree: a tree of (real or complex) arrays.
    ord: 2 or None (Euclidean), 1, or ``inf``/``"inf"``/``"infinity"``.
    squared: return the square of the norm.

  Returns:
    A scalar array.

  Raises:
    ValueError: for another ``ord``.
  """
  if ord is None or ord == 2:
    sq_norm = tree_sum(jax.tree.map(_abs_square, tree))
    return jnp.array(sq_norm if squared else jnp.sqrt(sq_norm))
  if ord == 1:
    norm = tree_sum(jax.tree.map(jnp.abs, tree))
  elif ord == jnp.inf or ord in ("inf", "infinity"):
    norm = tree_max(jax.tree.map(jnp.abs, tree))
  else:
    raise ValueError(f"tree_norm: unsupported ord={ord!r}; use None, 1, 2 or"
                     " inf")
  return jnp.array(_abs_square(norm) if squared else norm)


def tree_allclose(a: Any, b: Any, rtol=1e-5, atol=1e-8,
                  equal_nan: bool = False) -> bool | jax.Array:
  """Whether every pair of leaves is ``jnp.allclose`` within the tolerances.

  Args:
    a: a tree of arrays.
    b: a tree of arrays of the same structure.
    rtol: relative tolerance.
    atol: absolute tolerance.
    equal_nan: count NaNs at the same place as equal.

  Returns:
    A boolean scalar (True for trees without leaves).
  """
  close = jax.tree.map(
      lambda x, y: jnp.allclose(x, y, rtol=rtol, atol=atol, equal_nan=equal_nan),
      a, b)
  return functools.reduce(operator.and_, jax.tree.leaves(close), True)
