"""Which param each optimizer-state leaf belongs to.

By the stand-in trace (optax's ``tree_map_params`` idea, as in
``shardopt._src.tree_map_params``, one stand-in per param): ``tx.init`` runs
on the params tree with every leaf replaced by a ``_ParamSlot``, a pytree
node without leaves that remembers its param's index. Whatever ``init``
builds by mapping over the params (moments, traces, factored statistics, SM3
covers, L-BFGS memories) carries the slots through unchanged, while masks and
labels given as trees still line up with the params. Every state leaf below
a slot's position derives from that slot's param; every other leaf (counts,
keys, hyperparameters) from none.

When that trace cannot run (``init`` looks inside the params, e.g. to
concatenate them, or a labelling function flattens them) or its result does
not fit the real state, the owners fall back to a structural match: a state
subtree belongs to the params when the params' tree structure is a prefix of
it and every leaf it gives a param has a shape derived from that param's
(the same, ``(m, *param)``, or the param with dimensions reduced). A node
that has the params' structure by accident (tuple params ``(w, b)`` and a
two-element ``chain`` state) fails the shape test, or, where the params have
one shape, holds a tree of the params' structure inside a part (Adam's
``mu`` in a chain's part), and is searched further down. Two params of one
shape whose states hold no such tree are still told apart by position only,
which is why this match is only the fallback.
"""

import itertools

import jax

__all__ = ["in_blocks_of", "param_dims", "state_owners"]


def in_blocks_of(shape, param_shape) -> bool:
  """The param's rank, not its shape, every dimension a divisor of the
  param's and above 1 where the param's is (a block-wise layout)."""
  return (len(shape) == len(param_shape) and tuple(shape) != tuple(param_shape)
          and all(s > 0 and p % s == 0 and (s > 1 or p == 1)
                  for s, p in zip(shape, param_shape)))


def _block_grid_of(shape, param_shape) -> bool:
  """More dimensions than the param, the leading ones each a divisor of the
  param's dimension (its block count there): per-block statistics."""
  rank = len(param_shape)
  return (0 < rank < len(shape)
          and all(g > 0 and p % g == 0 for g, p in zip(shape[:rank], param_shape)))


def param_dims(shape, param_shape) -> list[int | None] | None:
  """Per leaf dimension, the param dimension it keeps (None: its own, e.g. a
  history dimension); None when the two shapes match no single way."""
  shape, param_shape = tuple(shape), tuple(param_shape)
  rank, param_rank = len(shape), len(param_shape)
  if shape == param_shape:
    return list(range(rank))
  if 0 < param_rank < rank and shape[-param_rank:] == param_shape:
    return [None] * (rank - param_rank) + list(range(param_rank))
  if rank == param_rank and all(s in (p, 1) for s, p in zip(shape, param_shape)):
    return [d if s == p else None for d, (s, p) in enumerate(zip(shape, param_shape))]
  if in_blocks_of(shape, param_shape):
    return list(range(rank))
  if _block_grid_of(shape, param_shape):
    return list(range(param_rank)) + [None] * (rank - param_rank)
  if rank < param_rank:
    matches = [kept for kept in itertools.combinations(range(param_rank), rank)
               if all(shape[i] == param_shape[d] for i, d in enumerate(kept))]
    if len(matches) == 1:
      return list(matches[0])
  return None



@jax.tree_util.register_pytree_node_class
class _ParamSlot:
  """Stands for param ``index`` in the params tree; has no leaves."""

  def __init__(self, index: int):
    self.index = index

  def tree_flatten(self):
    return (), self.index

  @classmethod
  def tree_unflatten(cls, index, children):
    del children
    return cls(index)


def _is_slot(x) -> bool:
  return isinstance(x, _ParamSlot)


def state_owners(init, params, state) -> list[int | None]:
  """Per leaf of ``state`` (flatten order), the index of the param it derives
  from, or None.

  Args:
    init: the transformation's ``init``.
    params: the params (arrays or ``jax.ShapeDtypeStruct``).
    state: the (abstract) state ``init`` builds from the params.
  """
  leaves, params_def = jax.tree.flatten(params)
  params_shapes = [tuple(p.shape) for p in leaves]
  if params_def.num_leaves == 0:
    return [None] * len(jax.tree.leaves(state))
  try:
    return _owners_by_stand_in(init, params_def, state)
  except Exception:  # noqa: BLE001 (any init that cannot run on stand-ins)
    return _owners_by_prefix(state, params_def, params_shapes)


def _owners_by_stand_in(init, params_def, state) -> list[int | None]:
  slots = jax.tree.unflatten(
      params_def, [_ParamSlot(i) for i in range(params_def.num_leaves)])
  layout = jax.eval_shape(init, slots)
  nodes, layout_def = jax.tree.flatten(layout, is_leaf=_is_slot)
  owners = []
  for node, part in zip(nodes, layout_def.flatten_up_to(state)):
    count = len(jax.tree.leaves(part))
    if _is_slot(node):
      owners += [node.index] * count
    elif count != 1:
      raise ValueError("the stand-in state does not fit the real state")
    else:
      owners.append(None)
  return owners


def _derives(leaf, param_shape) -> bool:
  return param_dims(leaf.shape, param_shape) is not None


def _holds_params_tree(tree, params_def) -> bool:
  """Whether a node strictly inside ``tree`` has the params' structure: a
  state holding a tree per params (a chain's part holding Adam's ``mu``),
  not one param's state, whatever the shapes (two params of one shape
  matched the chain's parts by prefix). ``tree`` itself may have it (SM3's
  covers of one param, a list like the params)."""
  children = jax.tree.leaves(tree, is_leaf=lambda x: x is not tree)
  if len(children) == 1 and children[0] is tree:  # an array leaf
    return False
  return any(jax.tree.structure(child) == params_def or
             _holds_params_tree(child, params_def) for child in children)


def _owners_by_prefix(state, params_def, params_shapes) -> list[int | None]:
  try:
    subtrees = params_def.flatten_up_to(state)
  except (ValueError, TypeError):
    subtrees = None
  if subtrees is not None and not (
      params_def.num_leaves > 1 and
      any(_holds_params_tree(sub, params_def) for sub in subtrees)) and all(
          _derives(leaf, shape)
          for sub, shape in zip(subtrees, params_shapes)
          for leaf in jax.tree.leaves(sub)):
    return [i for i, sub in enumerate(subtrees) for _ in jax.tree.leaves(sub)]
  children = jax.tree.leaves(state, is_leaf=lambda x: x is not state)
  if len(children) == 1 and children[0] is state:  # an array leaf
    return [None]
  return [o for child in children
          for o in _owners_by_prefix(child, params_def, params_shapes)]
