"""The classes of a state's NamedTuple nodes: recorded with each step, compared on restore.

A restore reads arrays by leaf name into the target's own tree, so a state
of another class with the same fields (Adam's ``ScaleByAdamState`` into
AdaBelief's ``ScaleByBeliefState``: count, mu, nu) would have one
optimizer's statistics read as another's. optax's and shardopt's optimizer
states are NamedTuples: the record keeps each NamedTuple node's class
(module and qualified name) by node name, and a restore compares them.
Classes are the same where their qualified names are: a class moved to
another module, or optax's and shardopt's state of one transformation
(shardopt keeps optax's class names and fields), is the same state.
Containers (dicts, lists, ``FrozenDict``, nnx ``State``, ``TrainState``) are
the caller's and may differ, as restoring into the target's types allows.
"""

from typing import Any, Callable

import jax

from checkpoints import layout

__all__ = ["differences", "of"]


def _is_named_tuple(x) -> bool:
  return isinstance(x, tuple) and hasattr(type(x), "_fields")


def of(tree: Any, prefix: str = "") -> dict[str, dict[str, str]]:
  """``{node name: {"module", "qualname"}}`` of every NamedTuple node of
  ``tree``, named as ``layout.named_leaves`` names leaves (after ``prefix``,
  where given)."""
  out = {}

  def visit(node, path):
    if _is_named_tuple(node):
      out[layout.name_under(prefix, path)] = {
          "module": type(node).__module__, "qualname": type(node).__qualname__}
    inner = lambda x: x is not node and _is_named_tuple(x)
    for sub, child in jax.tree_util.tree_flatten_with_path(node, is_leaf=inner)[0]:
      if _is_named_tuple(child):
        visit(child, (*path, *sub))

  visit(tree, ())
  return out


def differences(saved: dict[str, dict] | None, target: dict[str, dict],
                compared: Callable[[str], bool]) -> list[tuple[str, str]]:
  """``[(node name, what differs)]`` for the nodes named in both whose
  classes differ, among those ``compared`` selects; none for a record
  without classes (``saved`` None: written before they were recorded)."""
  if saved is None:
    return []
  return [(n, f"saved state class {_shown(saved[n])} vs target {_shown(target[n])}")
          for n in sorted(saved.keys() & target.keys())
          if compared(n) and saved[n]["qualname"] != target[n]["qualname"]]


def _shown(cls: dict[str, str]) -> str:
  return f"{cls['module']}.{cls['qualname']}"
