"""The extreme dtype of a tree's leaves, for scalars kept next to params."""

import functools

import jax
import jax.numpy as jnp

__all__ = ["extreme_dtype"]


def extreme_dtype(tree, highest: bool):
  """The highest (or lowest) dtype of the leaves, by promotion order."""
  dtypes = [jnp.asarray(x).dtype for x in jax.tree.leaves(tree)]
  if not dtypes:
    return jnp.asarray([]).dtype

  def pick(a, b):
    a_below_b = jnp.promote_types(a, b) == b
    return (b if a_below_b else a) if highest else (a if a_below_b else b)

  return functools.reduce(pick, dtypes)
