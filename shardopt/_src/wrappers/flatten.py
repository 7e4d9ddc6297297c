"""Running a transformation on one flat vector of all the params.

``flatten(inner)`` concatenates every leaf into a single vector before
``inner`` sees it, which saves per-leaf overhead for trees of many small
arrays. The price under sharding: the flat vector (and every state leaf
``inner`` keeps for it) no longer has a param's layout, so its sharding is
whatever the concatenation gives, usually replicated. Use it for small,
unsharded trees.
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np

from shardopt._src import base

__all__ = [
    "flatten",
]


def _ravel(x) -> jax.Array:
  """``x`` as a vector, whole on every device (on Explicit axes a split
  array cannot be raveled in place)."""
  whole = jax.typeof(x).sharding.update(spec=P(None))
  return jnp.reshape(x, (-1,), out_sharding=whole)


def _to_vector(tree) -> jax.Array:
  """All leaves of ``tree``, raveled and concatenated in flatten order."""
  return jnp.concatenate([_ravel(x) for x in jax.tree.leaves(tree)])


def _like(template, vector: jax.Array):
  """``vector`` cut into the leaves of ``template`` (its shapes and order)."""
  leaves, treedef = jax.tree.flatten(template)
  ends = np.cumsum([np.size(x) for x in leaves])
  pieces = jnp.split(vector, ends[:-1])
  return jax.tree.unflatten(
      treedef, [jnp.reshape(p, np.shape(x), out_sharding=jax.typeof(x).sharding)
                for p, x in zip(pieces, leaves)])


def flatten(inner: base.GradientTransformation
            ) -> base.GradientTransformationExtraArgs:
  """Applies ``inner`` to the concatenation of all params and updates.

  Leaf-wise transformations give the same numbers as without ``flatten``;
  transformations that reduce over a leaf (norms, trust ratios, factored
  moments) now reduce over the whole tree. The inner state is laid out for
  one vector, so it is not sharded like any param: use it for small,
  unsharded trees.

  Args:
    inner: the transformation to run on the flat vector.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is ``inner``'s state
    of the flat vector.

  References:
    optax's ``flatten``.
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    return inner.init(_to_vector(params))

  def update_fn(updates, state, params=None, **extra_args):
    flat_params = None if params is None else _to_vector(params)
    flat_updates, state = inner.update(_to_vector(updates), state, flat_params,
                                       **extra_args)
    return _like(updates, flat_updates), state

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
