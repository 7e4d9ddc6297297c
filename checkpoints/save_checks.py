"""What ``CheckpointManager.save`` refuses before any process writes: a step that is not an
integer >= 0, metadata that is not JSON, arrays already deleted (donated to a jitted call), a
state with no data to write."""

import json
import operator
from typing import Any

import jax

from checkpoints import layout
from checkpoints.errors import CheckpointError
from checkpoints.errors import quoted_names

__all__ = ["checked_json", "checked_step", "refuse_deleted", "refuse_no_data"]


def checked_json(value: Any, what: str) -> Any:
  try:
    return json.loads(json.dumps(value))
  except TypeError as e:
    raise TypeError(f"{what} must be JSON-serializable (dicts, lists, str, numbers): {e}") from e


def refuse_deleted(step: int, state: Any) -> None:
  """Raises CheckpointError naming the leaves of ``state`` whose arrays were deleted (donated
  to a jitted call, which consumed them), before any process writes."""
  dead = [name for name, leaf in layout.named_leaves(state)
          if isinstance(leaf, jax.Array) and leaf.is_deleted()]
  if dead:
    raise CheckpointError(
        f"save({step}): the arrays of {quoted_names(dead)} were deleted: donated"
        " to a jitted call (the sharded step consumes the params and state it is given and"
        " returns new ones). Save the params and state that call returned.")


def checked_step(step) -> int:
  """``step`` as an int: an integer >= 0, a Python int or a 0-d integer array (a
  ``TrainState.step``); a negative one would be written but never listed or restored."""
  try:
    index = operator.index(step)
  except TypeError:
    index = None
  if isinstance(step, bool) or index is None or index < 0:
    raise ValueError(f"save(step={step!r}): a step is an integer >= 0 (a negative one "
                     "would be written but never listed or restored).")
  return index


def refuse_no_data(step: int, state: Any, saveable: dict) -> None:
  """Raises CheckpointError when ``state`` has no data to write (``saveable``, its written
  form, is empty: no leaves, or arrays with no elements only, which the layout alone records):
  Orbax writes no step without data ('Found empty item', from the background write)."""
  if not saveable:
    empty = [f"{name} {tuple(leaf.shape)}" for name, leaf in layout.named_leaves(state)]
    found = f"only arrays with no elements: {', '.join(empty[:5])}" if empty else "no leaves"
    raise CheckpointError(f"save({step}): the state holds no data to write ({found});"
                          " save a state with data (e.g. params and optimizer state together).")
