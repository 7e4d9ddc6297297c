"""Per-example gradient clipping (as in DP-SGD), for a leading batch axis.

These are plain functions over per-example gradients: every leaf has the batch
on axis 0. They reduce over the non-batch axes (a per-example norm, local to
the device holding that example) and then contract the batch axis with the
clipping multipliers, so a batch sharded over a data axis costs one
all-reduce of the summed result, never a gather of the batch.
"""

import math
from typing import Any

import jax
import jax.numpy as jnp

from shardopt._src import numerics

__all__ = [
    "per_example_global_norm_clip",
    "per_example_layer_norm_clip",
]


def _check_batch_axis(grads: Any, caller: str) -> None:
  """Raises unless every leaf has the same leading (batch) dimension."""
  leaves = jax.tree_util.tree_leaves_with_path(grads)
  if not leaves:
    raise ValueError(f"{caller}: got no gradients")
  first_path, first = leaves[0]
  if jnp.ndim(first) < 1:
    raise ValueError(
        f"{caller}: gradient {jax.tree_util.keystr(first_path)} is a scalar;"
        " per-example gradients need a batch dimension on axis 0"
    )
  batch = jnp.shape(first)[0]
  for path, leaf in leaves:
    if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != batch:
      raise ValueError(
          f"{caller}: gradient {jax.tree_util.keystr(path)} has shape"
          f" {jnp.shape(leaf)} but {jax.tree_util.keystr(first_path)} has"
          f" batch size {batch}; every per-example gradient needs the same"
          " batch dimension on axis 0"
      )


def _per_example_sq_norms(grads: Any) -> jax.Array:
  """Squared L2 norm of each example's gradients, all leaves together: (B,)."""
  return sum(
      jnp.sum(numerics.abs_sq(g), axis=tuple(range(1, g.ndim)))
      for g in jax.tree.leaves(grads)
  )


def _clip_and_sum(grads: Any, l2_norm_clip) -> tuple[Any, jax.Array]:
  norms = jnp.sqrt(_per_example_sq_norms(grads))
  # 0 / 0 (a zero gradient with a zero clip) keeps the example unscaled.
  multipliers = jnp.nan_to_num(jnp.minimum(l2_norm_clip / norms, 1.0), nan=1.0)
  num_clipped = jnp.sum(multipliers < 1.0)
  clipped_sum = jax.tree.map(
      lambda g: jnp.tensordot(multipliers, g, axes=1), grads
  )
  return clipped_sum, num_clipped


def per_example_global_norm_clip(
    grads: Any, l2_norm_clip: jax.typing.ArrayLike
) -> tuple[Any, jax.Array]:
  """Clips each example's gradients to global L2 norm ``l2_norm_clip``, then sums.

  Args:
    grads: a tree of per-example gradients, each leaf with the batch on axis
      0 (the same batch size in every leaf).
    l2_norm_clip: the largest global norm an example's gradients keep.

  Returns:
    ``(sum of the clipped per-example gradients, number of examples
    clipped)``.

  References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016
    (https://arxiv.org/abs/1607.00133).
  """
  _check_batch_axis(grads, "per_example_global_norm_clip")
  return _clip_and_sum(grads, l2_norm_clip)


def per_example_layer_norm_clip(
    grads: Any, global_l2_norm_clip: jax.typing.ArrayLike, uniform: bool = True
) -> tuple[Any, Any]:
  """Clips each example's gradient leaf by leaf ("per layer"), then sums.

  With ``K`` leaves, leaf ``i`` is clipped to ``C / sqrt(K)`` if ``uniform``,
  else to ``C * sqrt(D_i / D)`` (``D_i`` its size per example, ``D`` the
  total), where ``C = global_l2_norm_clip``; the per-leaf bounds compose to
  ``C`` overall.

  Args:
    grads: a tree of per-example gradients, each leaf with the batch on axis
      0 (the same batch size in every leaf).
    global_l2_norm_clip: ``C``, the overall bound of an example's norm.
    uniform: whether every leaf gets the same bound (default True) or one
      proportional to the root of its size.

  Returns:
    ``(tree of clipped sums, tree of per-leaf numbers of examples
    clipped)``.

  References:
    McMahan et al., "Learning Differentially Private Recurrent Language
    Models", ICLR 2018 (https://arxiv.org/abs/1710.06963).
  """
  _check_batch_axis(grads, "per_example_layer_norm_clip")
  leaves, treedef = jax.tree.flatten(grads)
  if uniform:
    bounds = [global_l2_norm_clip * (1.0 / len(leaves)) ** 0.5] * len(leaves)
  else:
    sizes = [math.prod(jnp.shape(g)[1:]) for g in leaves]
    bounds = [global_l2_norm_clip * (d / sum(sizes)) ** 0.5 for d in sizes]
  results = [_clip_and_sum(g, bound) for g, bound in zip(leaves, bounds)]
  sums = jax.tree.unflatten(treedef, [s for s, _ in results])
  counts = jax.tree.unflatten(treedef, [n for _, n in results])
  return sums, counts
