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
two-element ``chain`` state) fails the shape test and is searched further
down; the shape test cannot tell apart two params of one shape, which is why
this match is only the fallback.
"""

import jax

from shardopt.sharding._zero import param_dims

__all__ = ["state_owners"]


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


def _owners_by_prefix(state, params_def, params_shapes) -> list[int | None]:
  try:
    subtrees = params_def.flatten_up_to(state)
  except (ValueError, TypeError):
    subtrees = None
  if subtrees is not None and all(
      _derives(leaf, shape)
      for sub, shape in zip(subtrees, params_shapes)
      for leaf in jax.tree.leaves(sub)):
    return [i for i, sub in enumerate(subtrees) for _ in jax.tree.leaves(sub)]
  children = jax.tree.leaves(state, is_leaf=lambda x: x is not state)
  if len(children) == 1 and children[0] is state:  # an array leaf
    return [None]
  return [o for child in children
          for o in _owners_by_prefix(child, params_def, params_shapes)]
