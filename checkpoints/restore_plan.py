"""What a restore reads, matched against the step's record before any array is read: the
target's leaves in their saved form (quantized state saved in other blocks or precision,
``retile.saved_tiles``), checked against the saved layout and optimizer-state classes, and,
once read, the re-tiled leaves put back in the target's form."""

import logging
from typing import Any
from typing import NamedTuple

from checkpoints import layout
from checkpoints import record
from checkpoints import retile
from checkpoints import state_classes
from checkpoints.errors import StructureMismatchError
from checkpoints.reinit import is_optimizer_leaf
from checkpoints.reinit import split_optimizer

__all__ = ["ReadPlan", "in_target_form", "subtree", "whole_state"]

_log = logging.getLogger(__name__)


class ReadPlan(NamedTuple):
  """``target``: the restore target with the re-tiled leaves in their saved form; ``pairs``:
  its ``(name, leaf)`` in flatten order, which the state is rebuilt from; ``read``: those read
  from the step (all but a re-initialized optimizer state); ``partial``: whether they are
  fewer than the leaves saved; ``retiled``: the names of the leaves in their saved form."""

  target: Any
  pairs: list
  read: list
  partial: bool
  retiled: list[str]


def whole_state(target: Any, saved: record.Record, what: str, optimizer_changed: str,
                opt_state_key: str) -> ReadPlan:
  """The plan of ``CheckpointManager.restore``; raises ``StructureMismatchError`` (message
  after ``what``) where the target differs from what was saved, the optimizer state aside
  with ``optimizer_changed="reinit"``."""
  # reinit reads no optimizer state (where quantized state lives): nothing to re-tile
  read_target, retiled = ((target, []) if optimizer_changed == "reinit"
                          else retile.saved_tiles(target, saved.leaves))
  pairs, notes = layout.named_leaves(read_target), retile.code_notes(read_target)
  if optimizer_changed == "reinit":
    _, read = split_optimizer(read_target, pairs, opt_state_key)
    saved_rest = {n: s for n, s in saved.leaves.items() if not is_optimizer_leaf(n, opt_state_key)}
    layout.check_same(saved_rest, layout.describe(read, notes), what)
  else:
    read = pairs
    hint = lambda paths: _reinit_hint(paths, opt_state_key)
    layout.check_same(saved.leaves, layout.describe(pairs, notes), what, hint,
                      _class_differences(saved, target, "", opt_state_key))
  return ReadPlan(read_target, pairs, read, len(read) < len(saved.leaves), retiled)


def subtree(target: Any, saved: record.Record, prefix: str, where: str,
            opt_state_key: str) -> ReadPlan:
  """The plan of ``CheckpointManager.restore_subtree``: the saved leaves under ``prefix`` into
  ``target``; raises ``StructureMismatchError`` (message after ``where``) where they differ."""
  read_target, retiled = retile.saved_tiles(target, saved.leaves, prefix)
  pairs = layout.named_leaves(read_target, prefix)
  under = {n: s for n, s in saved.leaves.items() if n == prefix or n.startswith(prefix + ".")}
  _check_subtree_target(where, saved.leaves, under, read_target, prefix)
  layout.check_same(under, layout.describe(pairs, retile.code_notes(read_target, prefix)),
                    where, more=_class_differences(saved, target, prefix, opt_state_key))
  return ReadPlan(read_target, pairs, pairs, True, retiled)


def _check_subtree_target(where: str, saved: dict, under: dict, target: Any,
                          prefix: str) -> None:
  """Raises StructureMismatchError where nothing was saved under ``prefix`` (naming the saved
  tree's top-level names), or where ``target`` is the whole saved state, not the subtree
  under ``prefix`` (its leaves' names, without the prefix, are those saved under it)."""
  if not under:
    tops = sorted({name.split(".")[0] for name in saved})
    raise StructureMismatchError(f"{where}: nothing was saved under {prefix!r}; the saved"
                                 f" tree's top-level names are {tops}.")
  whole = {name for name, _ in layout.named_leaves(target)}
  if set(under) <= whole:
    raise StructureMismatchError(
        f"{where}: the target is the whole state (its leaves are named as saved, e.g."
        f" {min(under)!r}), not the subtree under {prefix!r}: pass that subtree (e.g."
        f" state[{prefix!r}]) as the target, or restore the whole state with restore().")


def _class_differences(saved: record.Record, target: Any, prefix: str,
                       opt_state_key: str) -> list[tuple[str, str]]:
  """The optimizer-state nodes (under ``opt_state_key``) whose saved class is not the target's."""
  return state_classes.differences(saved.classes, state_classes.of(target, prefix),
                                   lambda name: is_optimizer_leaf(name, opt_state_key))


def in_target_form(state: Any, target: Any, retiled: list[str], step: int) -> Any:
  """``state`` with the leaves named in ``retiled`` (read in their saved form) in ``target``'s
  (``retile.retile``), said in a warning naming them."""
  if not retiled:
    return state
  _log.warning("Step %d was saved with other quantization blocks or precision (another mesh): "
               "re-encoded %d leaves in this mesh's blocks, or in float where it keeps them so (each "
               "value within one quantization step): %s", step, len(retiled), ", ".join(retiled))
  return retile.retile(state, target)


def _reinit_hint(paths: list[str], opt_state_key: str) -> str:
  if all(is_optimizer_leaf(n, opt_state_key) for n in paths):
    return ("\nOnly the optimizer state differs: if the optimizer was changed on purpose, pass "
            "optimizer_changed='reinit' to restore the rest with a fresh optimizer state.")
  return ""
