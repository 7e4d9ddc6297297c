"""Donated arrays at the sharded step's boundary, checked on every call.

A donated (deleted) array passed to a jitted step can crash the process in
this jax version instead of raising, so ``check_live`` refuses it first,
saying it was donated (a call inside another ``jit`` passes tracers, which
hold no buffer and are not checked). In the same pass it refuses one array
passed twice where a use is donated (gradients that are the params, one
param at two paths), which crashes it the same way.
"""

from typing import NoReturn

import jax
from jax.tree_util import keystr
from jax.tree_util import tree_flatten_with_path

from shardopt._src import messages

__all__ = ["check_live", "is_concrete_array"]


def is_concrete_array(x) -> bool:
  """An array with buffers (not a tracer of an enclosing ``jit``)."""
  return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


def _is_deleted(x) -> bool:
  return is_concrete_array(x) and x.is_deleted()


def check_live(what: str, donated: tuple[str, ...] = (), **trees) -> None:
  """Raises RuntimeError naming every deleted (donated) array in ``trees``,
  and ValueError naming an array passed twice where a use of it is in one
  of the ``donated`` trees (those the call consumes). One flatten of the
  inputs on every call; paths are built only for an error.

  ``what`` names the call, for the message (e.g. ``"opt.update"``).
  """
  leaves = [x for tree in trees.values() for x in jax.tree.leaves(tree)]
  if any(_is_deleted(x) for x in leaves):
    _raise_deleted(what, trees)
  if donated and len({id(x) for x in leaves}) != len(leaves):
    _check_unaliased(what, donated, trees)


def _raise_deleted(what: str, trees: dict) -> NoReturn:
  dead = [f"{name}{keystr(path)}" for name, tree in trees.items()
          for path, x in tree_flatten_with_path(tree)[0] if _is_deleted(x)]
  raise RuntimeError(
      f"{what} got deleted arrays: {messages.first_few(dead, 5)}. They were "
      "donated to an earlier call of the sharded step (make_sharded_optimizer"
      "(..., donate=True), the default, consumes the params and state it is "
      "given and reuses their memory for the results). Pass the params and "
      "state that call returned; to keep your own copy, copy it first "
      "(jax.tree.map(jnp.copy, params)) or build the optimizer with "
      "donate=False.")


def _check_unaliased(what: str, donated: tuple[str, ...], trees: dict) -> None:
  """Raises naming the first concrete array met again after a donated use
  (the donated trees are read first)."""
  donated_uses = {}
  for name in [*donated, *(name for name in trees if name not in donated)]:
    for path, x in tree_flatten_with_path(trees[name])[0]:
      if not is_concrete_array(x):
        continue
      where = f"{name}{keystr(path)}"
      if id(x) in donated_uses:
        _raise_aliased(what, donated_uses[id(x)], where)
      if name in donated:
        donated_uses[id(x)] = where


def _raise_aliased(what: str, donated_path: str, other_path: str) -> NoReturn:
  raise ValueError(
      f"{what}: {other_path} is the same array as {donated_path}, which the call donates "
      "(consumes, reusing its memory for the results while the other use still reads it). "
      "Pass separate arrays (e.g. jax.tree.map(jnp.copy, ...) of one of them), or build the "
      "optimizer with donate=False.")
