"""A tree's dtype, and random trees shaped (and sharded) like a tree."""

from collections.abc import Callable
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp

__all__ = [
    "tree_dtype",
    "tree_random_like",
    "tree_split_key_like",
    "tree_unwrap_random_key_data",
]

_HANDLERS = (None, "promote", "highest", "lowest")


def _lower(dtype_a, dtype_b):
  promoted = jnp.promote_types(dtype_a, dtype_b)
  if promoted == dtype_a:
    return dtype_b
  if promoted == dtype_b:
    return dtype_a
  raise ValueError(f"tree_dtype: neither of {dtype_a} and {dtype_b} promotes to"
                   " the other; use mixed_dtype_handler='promote'")


def _higher(dtype_a, dtype_b):
  return dtype_b if _lower(dtype_a, dtype_b) == dtype_a else dtype_a


def _require_one_dtype(tree: Any, dtype) -> None:
  wrong = [f"{jax.tree_util.keystr(path)} is {jnp.asarray(x).dtype}"
           for path, x in jax.tree_util.tree_leaves_with_path(tree)
           if jnp.asarray(x).dtype != dtype]
  if wrong:
    raise ValueError(
        f"tree_dtype: expected every leaf to be {dtype}, but " + "; ".join(wrong)
        + ". Pass mixed_dtype_handler='promote', 'highest' or 'lowest'.")


def tree_dtype(tree: Any, mixed_dtype_handler: str | None = None) -> Any:
  """The dtype of a tree's leaves.

  Args:
    tree: a tree of arrays.
    mixed_dtype_handler: None (every leaf must have the same dtype),
      ``"promote"`` (their promoted dtype), ``"highest"`` or ``"lowest"``
      (the leaf dtype every other promotes to, or that promotes to every
      other).

  Returns:
    A dtype (that of an empty array for a tree without leaves).

  Raises:
    ValueError: for mixed dtypes without a handler, dtypes without an order,
      or an unknown handler.
  """
  if mixed_dtype_handler not in _HANDLERS:
    raise ValueError(f"tree_dtype: mixed_dtype_handler={mixed_dtype_handler!r};"
                     f" use one of {_HANDLERS}")
  dtypes = [jnp.asarray(x).dtype for x in jax.tree.leaves(tree)]
  if not dtypes:
    return jnp.asarray([]).dtype
  if mixed_dtype_handler is None:
    _require_one_dtype(tree, dtypes[0])
    return dtypes[0]
  combine = {"promote": jnp.promote_types, "highest": _higher,
             "lowest": _lower}[mixed_dtype_handler]
  return functools.reduce(combine, dtypes)


def tree_split_key_like(rng_key: jax.Array, target_tree: Any) -> Any:
  """One key per leaf of ``target_tree``, split from ``rng_key``, in a tree of
  its structure."""
  treedef = jax.tree.structure(target_tree)
  return jax.tree.unflatten(treedef, jax.random.split(rng_key, treedef.num_leaves))


def tree_random_like(
    rng_key: jax.Array,
    target_tree: Any,
    sampler: Callable[..., jax.Array] = jax.random.normal,
    dtype: Any = None,
) -> Any:
  """Random leaves with the shapes and shardings of ``target_tree``.

  Args:
    rng_key: the key to split, one key per leaf.
    target_tree: the tree to imitate.
    sampler: ``sampler(key, shape, dtype)``, optionally taking
      ``out_sharding``: then each leaf is drawn in the sharding of its
      target's type, which carries the target's layout on a mesh whose axes
      are Explicit.
    dtype: the leaves' dtype (default: each target leaf's).

  Returns:
    A tree of ``target_tree``'s structure.
  """
  keys = tree_split_key_like(rng_key, target_tree)
  takes_sharding = "out_sharding" in inspect.signature(sampler).parameters

  def draw(leaf, key):
    leaf_dtype = dtype or leaf.dtype
    if takes_sharding:
      return sampler(key, leaf.shape, leaf_dtype,
                     out_sharding=jax.typeof(leaf).sharding)
    return sampler(key, leaf.shape, leaf_dtype)

  return jax.tree.map(draw, target_tree, keys)


def tree_unwrap_random_key_data(input_tree: Any) -> Any:
  """Typed PRNG key leaves replaced by their raw ``uint32`` data."""
  def unwrap(x):
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key):
      return jax.random.key_data(x)
    return x
  return jax.tree.map(unwrap, input_tree)
