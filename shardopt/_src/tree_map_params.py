"""Mapping a function over the parts of an optimizer state that mirror the
params (moments, traces, previous gradients), leaving counters and scalars.

``tree_map_params(tx, f, state, *rest)`` finds those parts by running
``tx.init`` on a stand-in params tree with no leaves: every part of the state
that ``init`` builds leaf by leaf from the params comes out as the stand-in,
and ``f`` is mapped over the matching subtree of ``state`` (and of each tree
of ``rest``, which have the params' structure). Use it to give every mirror
of a param that param's sharding, dtype or spec. A moment stored quantized
(``quantized_state``) mirrors its param with two arrays, its codes and its
scales: ``f`` is applied to each with that param's leaves of ``rest``.
"""

from typing import Any
from typing import Callable

import jax

from shardopt._src import base
from shardopt._src.quantization import quantized_array

__all__ = [
    "is_params_stand_in",
    "tree_map_params",
]


@jax.tree_util.register_pytree_node_class
class _ParamsStandIn:
  """A pytree with no leaves, passed to ``init`` in place of the params."""

  def tree_flatten(self):
    return (), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux, children
    return cls()


def is_params_stand_in(x) -> bool:
  """Whether ``x`` is the stand-in that ``tree_map_params`` passes to
  ``init``: a wrapper whose ``init`` reads the params' structure (``masked``)
  hands it on to its inner ``init`` unread."""
  return isinstance(x, _ParamsStandIn)


def tree_map_params(
    initable: Callable[[base.Params], base.OptState] | Any,
    f: Callable[..., Any],
    state: base.OptState,
    /,
    *rest: Any,
    transform_non_params: Callable[..., Any] | None = None,
    is_leaf: Callable[[Any], bool] | None = None,
) -> base.OptState:
  """``state`` with ``f(leaf, *rest_leaves)`` applied over every params-shaped part.

  Which parts of the state are params-shaped is found by calling
  ``initable`` on a stand-in for the params; e.g. map each moment to its
  param's sharding.

  Args:
    initable: the transformation (anything with ``init``) or its init
      function.
    f: applied leaf by leaf to each params-shaped part of ``state`` and the
      trees of ``rest`` (to a quantized moment's codes and scales each with
      its param's leaves).
    state: a state built by ``initable``.
    *rest: trees with the structure of the params (e.g. their shardings).
    transform_non_params: applied to every other leaf of ``state``; those
      leaves are kept as they are when it is None.
    is_leaf: passed to ``jax.tree.map`` over the params-shaped parts (e.g. to
      stop at ``masked``'s placeholders).

  Returns:
    A tree with the structure of ``state``.

  References:
    optax's ``tree_map_params``.
  """
  init = initable.init if hasattr(initable, "init") else initable
  layout = init(_ParamsStandIn())

  def map_mirror(leaf, *param_leaves):
    if quantized_array.is_quantized(leaf):
      return jax.tree.map(lambda array: f(array, *param_leaves), leaf)
    return f(leaf, *param_leaves)

  def is_mirror(x) -> bool:
    return quantized_array.is_quantized(x) or (is_leaf is not None and is_leaf(x))

  def map_part(part, value):
    if is_params_stand_in(part):
      return jax.tree.map(map_mirror, value, *rest, is_leaf=is_mirror)
    if transform_non_params is not None:
      return transform_non_params(value)
    return value

  return jax.tree.map(map_part, layout, state, is_leaf=is_params_stand_in)
