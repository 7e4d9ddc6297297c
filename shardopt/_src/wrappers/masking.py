"""Applying a transformation to a masked subset of the params.

A mask is a tree of booleans with the structure of the params, or a prefix of
it (one boolean then covers a whole subtree), or a function of the params that
returns such a tree. Masked-out leaves are replaced by ``MaskedNode()`` (a
pytree node without children) before the inner transformation sees them, so
the inner state holds nothing for them.
"""

from typing import Any
from typing import Callable
from typing import NamedTuple

import jax
from jax.tree_util import keystr
from jax.tree_util import tree_flatten_with_path

from shardopt._src import base
from shardopt._src import tree_map_params

__all__ = [
    "Mask",
    "MaskedNode",
    "MaskedState",
    "apply_mask",
    "freeze",
    "is_mask_fn",
    "masked",
    "resolve_mask",
]

Mask = Any  # a (prefix) tree of booleans, or a function params -> such a tree


class MaskedState(NamedTuple):
  """The state of the inner transformation, over the unmasked params only."""

  inner_state: Any


class MaskedNode(NamedTuple):
  """Stands in for a masked-out leaf or subtree; has no leaves itself."""


def is_mask_fn(mask: Mask) -> bool:
  """Whether ``mask`` is a function to call on the params (not a tree)."""
  leaves = jax.tree.leaves(mask)
  return bool(leaves) and all(callable(leaf) for leaf in leaves)


def _paths(tree: Any) -> list[tuple]:
  return [path for path, _ in tree_flatten_with_path(tree)[0]]


def _describe_mismatch(mask: Mask, tree: Any) -> str:
  """Names the first path where ``mask`` is not a prefix of ``tree``."""
  mask_paths = set(_paths(mask))
  tree_paths = _paths(tree)
  for path in tree_paths:
    if not any(path[:i] in mask_paths for i in range(len(path) + 1)):
      return f"the params have {keystr(path)} but the mask has no entry for it"
  tree_prefixes = {
      path[:i] for path in tree_paths for i in range(len(path) + 1)}
  for path in _paths(mask):
    if path not in tree_prefixes:
      return f"the mask has {keystr(path)} but the params have no such entry"
  return "the node types differ (e.g. a list where the params have a tuple)"


def resolve_mask(mask: Mask, tree: Any) -> Any:
  """The mask tree for ``tree``; raises ValueError naming a mismatching path."""
  mask_tree = mask(tree) if is_mask_fn(mask) else mask
  try:
    jax.tree.structure(mask_tree).flatten_up_to(tree)
  except (ValueError, TypeError) as err:
    raise ValueError(
        f"mask does not match the params: {_describe_mismatch(mask_tree, tree)}"
        f" ({err}). Give a mask with the structure of the params or a prefix"
        " of it (one bool per subtree), or a function that builds it from the"
        " params."
    ) from None
  return mask_tree


def apply_mask(tree: Any, mask_tree: Any) -> Any:
  """``tree`` with every subtree whose mask is False replaced by MaskedNode."""
  return jax.tree.map(lambda m, t: t if m else MaskedNode(), mask_tree, tree)


def _mask_extra_args(extra_args: dict, updates: Any, mask_tree: Any) -> dict:
  """Masks the extra args whose tree structure is that of the updates."""
  structure = jax.tree.structure(updates)
  return {
      name: apply_mask(value, mask_tree)
      if jax.tree.structure(value) == structure else value
      for name, value in extra_args.items()
  }


def masked(
    inner: base.GradientTransformation,
    mask: Mask | Callable[[base.Params], Any],
    *,
    mask_compatible_extra_args: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Applies ``inner`` where ``mask`` is True; passes the other updates through.

  The inner transformation sees only the masked-in leaves (the others are
  ``MaskedNode``), so its state holds no copy of the masked-out params.

  Args:
    inner: the transformation to apply to the masked-in params.
    mask: a tree of bools with the params' structure (or a prefix of it), or
      a function of the params returning one; it must be static (Python
      bools or concrete arrays) for the result to be jittable. A mask that
      does not match the params raises ValueError naming the first
      mismatching path.
    mask_compatible_extra_args: whether extra arguments with the tree
      structure of the updates are masked the same way (default False;
      keyword only).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a ``MaskedState``.

  References:
    optax's ``masked``.
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    if tree_map_params.is_params_stand_in(params):  # no structure to mask
      return MaskedState(inner_state=inner.init(params))
    mask_tree = resolve_mask(mask, params)
    return MaskedState(inner_state=inner.init(apply_mask(params, mask_tree)))

  def update_fn(updates, state, params=None, **extra_args):
    mask_tree = resolve_mask(mask, updates)
    if mask_compatible_extra_args:
      extra_args = _mask_extra_args(extra_args, updates, mask_tree)
    inner_params = None if params is None else apply_mask(params, mask_tree)
    new_updates, inner_state = inner.update(
        apply_mask(updates, mask_tree), state.inner_state, inner_params,
        **extra_args)
    merged = jax.tree.map(
        lambda m, new, old: new if m else old, mask_tree, new_updates, updates)
    return merged, MaskedState(inner_state=inner_state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def freeze(mask: Mask) -> base.GradientTransformationExtraArgs:
  """Zeros the updates where ``mask`` is True.

  Args:
    mask: a tree of bools (or a prefix of the params' structure; a single
      bool freezes all or none), or a function of the params returning one.

  Returns:
    A ``GradientTransformationExtraArgs``: ``masked(set_to_zero(), mask)``.

  References:
    optax's ``freeze``.
  """
  return masked(base.set_to_zero(), mask)
