"""Finding and replacing values in a tree (an optimizer state) by key.

A key is a dict key, a NamedTuple field or a NamedTuple's class name. Paths
name NamedTuple fields with ``NamedTupleKey`` (the tuple's class and the
field), so a filter can tell apart two states that share a field name.
"""

from collections.abc import Callable
import dataclasses
from typing import Any

import jax

__all__ = ["NamedTupleKey", "tree_get", "tree_get_all_with_path", "tree_set"]

_DictKey = jax.tree_util.DictKey


@dataclasses.dataclass(frozen=True)
class NamedTupleKey:
  """A path entry for the field ``name`` of a NamedTuple of class
  ``tuple_name``.

  Attributes:
    tuple_name: the NamedTuple's class name.
    name: the field's name.
  """

  tuple_name: str
  name: str

  def __str__(self) -> str:
    return f"{self.tuple_name}.{self.name}"


KeyPath = tuple[Any, ...]
Filter = Callable[[KeyPath, Any], bool]


def _is_named_tuple(x) -> bool:
  return isinstance(x, tuple) and hasattr(x, "_fields")


def _has_key(node, keys) -> bool:
  if _is_named_tuple(node):
    return any(k in node._fields or k == type(node).__name__ for k in keys)
  return isinstance(node, dict) and any(k in node for k in keys)


def _children(path: KeyPath, node) -> list[tuple[KeyPath, Any]]:
  if _is_named_tuple(node):
    name = type(node).__name__
    return [((*path, NamedTupleKey(name, f)), getattr(node, f))
            for f in node._fields]
  return [((*path, _DictKey(k)), v) for k, v in node.items()]


def _nodes_with_path(tree, stop) -> list[tuple[KeyPath, Any]]:
  """Leaves and ``stop`` nodes of ``tree`` with their paths, NamedTuple
  fields named by ``NamedTupleKey``."""
  found = []
  for path, node in jax.tree_util.tree_leaves_with_path(
      tree, is_leaf=lambda x: stop(x) or _is_named_tuple(x)):
    if stop(node) or not _is_named_tuple(node):
      found.append((path, node))
      continue
    for child_path, child in _children(path, node):
      found += [((*child_path, *p), v) for p, v in _nodes_with_path(child, stop)]
  return found


def _select(path: KeyPath, node, key) -> tuple[KeyPath, Any]:
  if _is_named_tuple(node):
    if key == type(node).__name__:
      return path, node
    return (*path, NamedTupleKey(type(node).__name__, key)), getattr(node, key)
  return (*path, _DictKey(key)), node[key]


def _all_with_path(tree, key) -> list[tuple[KeyPath, Any]]:
  holders = [(p, n) for p, n in _nodes_with_path(tree, lambda x: _has_key(x, (key,)))
             if _has_key(n, (key,))]
  found = [_select(p, n, key) for p, n in holders]
  for path, holder in holders:
    for child_path, child in _children(path, holder):
      found += [((*child_path, *p), v) for p, v in _all_with_path(child, key)]
  return found


def tree_get_all_with_path(tree: Any, key: Any, filtering: Filter | None = None
                           ) -> list[tuple[KeyPath, Any]]:
  """Every value of ``tree`` under ``key``, with its path.

  Args:
    tree: the tree to search (e.g. an optimizer state).
    key: a dict key, a NamedTuple field name or a NamedTuple class name.
    filtering: ``filtering(path, value) -> bool`` keeps only some matches.

  Returns:
    A list of ``(path, value)``: matches at the outermost level first, then
    those nested inside them.
  """
  found = _all_with_path(tree, key)
  return [(p, v) for p, v in found if filtering is None or filtering(p, v)]


def tree_get(tree: Any, key: Any, default: Any = None,
             filtering: Filter | None = None) -> Any:
  """The one value of ``tree`` under ``key`` (``default`` if none).

  Args:
    tree: the tree to search (e.g. an optimizer state).
    key: a dict key, a NamedTuple field name or a NamedTuple class name.
    default: returned when nothing matches.
    filtering: ``filtering(path, value) -> bool`` keeps only some matches.

  Returns:
    The matching value.

  Raises:
    KeyError: when several values match (narrow them with ``filtering``).
  """
  found = tree_get_all_with_path(tree, key, filtering)
  if len(found) > 1:
    paths = ", ".join(jax.tree_util.keystr(p) for p, _ in found)
    raise KeyError(f"tree_get: several values under {key!r} ({paths}); pass"
                   " a filtering function to choose one")
  return found[0][1] if found else default


def tree_set(tree: Any, filtering: Filter | None = None, /, **kwargs: Any
             ) -> Any:
  """A copy of ``tree`` with the values under the keys of ``kwargs`` replaced.

  Args:
    tree: the tree (e.g. an optimizer state).
    filtering: ``filtering(path, value) -> bool`` limits which matches are
      replaced.
    **kwargs: key -> new value (keys as in ``tree_get``).

  Returns:
    The tree with the replacements.

  Raises:
    KeyError: when a key of ``kwargs`` matches nothing.
  """
  for key in kwargs:
    if not tree_get_all_with_path(tree, key, filtering):
      why = " given the filtering function" if filtering else ""
      raise KeyError(f"tree_set: no value under {key!r}{why}; keys are dict"
                     " keys, NamedTuple fields or NamedTuple class names")
  keys = tuple(kwargs)
  wanted = lambda path, value: filtering is None or filtering(path, value)

  def replace(path, node):
    if not _has_key(node, keys):
      return node
    if _is_named_tuple(node) and type(node).__name__ in kwargs and wanted(
        path, node):
      return kwargs[type(node).__name__]
    new = {}
    for child_path, child in _children(path, node):
      name = child_path[-1].name if _is_named_tuple(node) else child_path[-1].key
      if name in kwargs and wanted(child_path, child):
        new[name] = kwargs[name]
      elif isinstance(child, (dict, list, tuple)):
        new[name] = replace(child_path, child)
      else:
        new[name] = child
    return node._replace(**new) if _is_named_tuple(node) else new

  stop = lambda x: _has_key(x, keys)
  leaves, treedef = jax.tree.flatten(tree, is_leaf=stop)
  paths = [p for p, _ in _nodes_with_path(tree, stop)]
  return treedef.unflatten(replace(p, n) for p, n in zip(paths, leaves))
