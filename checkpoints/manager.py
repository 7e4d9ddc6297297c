"""Resumable checkpoints of a sharded training state, restorable onto any mesh.

A step directory holds three orbax items: ``state`` (the leaf-path dict of
arrays, each process writing only its own shards), ``layout`` (JSON: each
leaf's shape, dtype and key implementation) and ``metadata`` (the caller's
JSON). Orbax writes into a temporary directory and renames it on completion,
so a save killed at any point never shows up as a step; old steps are deleted
only after a newer save has been finalized.
"""

import json
import logging
import os
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath

from checkpoints import layout
from checkpoints.barrier import barrier
from checkpoints.errors import CheckpointError, CorruptCheckpointError, NoCheckpointError
from checkpoints.policy import CheckpointPolicy
from checkpoints.reinit import OPTIMIZER_CHANGED, fresh_opt_state, is_optimizer_leaf, split_optimizer

__all__ = ["CheckpointManager", "Restored"]

_FORMAT = "shardopt.checkpoint/1"
_log = logging.getLogger(__name__)


class Restored(NamedTuple):
  """What a restore returns: the state (target's types), its step, the user metadata."""

  state: Any
  step: int
  metadata: dict


def _json(value: Any, what: str) -> Any:
  try:
    return json.loads(json.dumps(value))
  except TypeError as e:
    raise TypeError(f"{what} must be JSON-serializable (dicts, lists, str, numbers): {e}") from e


def _absolute(directory) -> epath.Path:
  """``directory`` as an absolute path (Orbax rejects relative local paths);
  URLs such as ``gs://bucket/run`` are kept as given."""
  text = os.fspath(directory)
  return epath.Path(text if "://" in text else os.path.abspath(text))


class CheckpointManager:
  """Saves and restores training states under ``directory`` (one subdirectory per step).

  Every process must make the same calls (save, restore, wait, close) in the
  same order. Use as a context manager, or call ``close()``, so the last
  asynchronous save is finalized before the program exits.
  """

  def __init__(self, directory, policy: CheckpointPolicy | None = None):
    self.policy = policy or CheckpointPolicy()
    self.directory = _absolute(directory)
    if jax.process_count() > 1:  # orbax refuses create=True with explicit active processes
      self.directory.mkdir(parents=True, exist_ok=True)
      barrier("create_directory", self.policy.timeout_s)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        item_names=("state", "layout", "metadata"),
        options=self.policy.manager_options(),
    )

  # Listing and lifecycle -------------------------------------------------

  def all_steps(self) -> list[int]:
    """Steps of the finalized checkpoints, ascending."""
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    """The newest finalized step, or None."""
    return self._mngr.latest_step()

  def should_save(self, step: int) -> bool:
    """Whether ``save(step, ...)`` would write under the save interval."""
    return self._mngr.should_save(step)

  def wait_until_finished(self) -> None:
    """Blocks until the background save (if any) is finalized; raises its error."""
    self._mngr.wait_until_finished()

  def close(self) -> None:
    """Finalizes pending saves and deletions and releases orbax's threads."""
    self._mngr.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # Saving -------------------------------------------------------------

  def save(self, step: int, state: Any, *, metadata: dict | None = None,
           metrics: dict | None = None, force: bool = False) -> bool:
    """Starts writing ``state`` at ``step``; returns whether a save was started.

    With ``async_save`` (the default) it returns once the arrays are copied off
    the devices, and the write goes on in the background. ``metadata`` is any
    JSON (data position, config); ``metrics`` ranks checkpoints for keep_best.
    Skipped (False) when ``step`` is not on the save interval, unless ``force``.
    """
    if not force and not self._mngr.should_save(step):
      return False
    metadata = _json(metadata or {}, "metadata")
    if metrics is not None:
      metrics = {k: float(v) for k, v in metrics.items()}
    barrier(f"save_{step}", self.policy.timeout_s)
    args = ocp.args.Composite(
        state=ocp.args.PyTreeSave(layout.to_saveable(state)),
        layout=ocp.args.JsonSave({"format": _FORMAT, "leaves": layout.describe(layout.named_leaves(state))}),
        metadata=ocp.args.JsonSave(metadata),
    )
    return self._mngr.save(step, args=args, metrics=metrics, force=force)

  # Restoring ----------------------------------------------------------

  def _step(self, step: int | None) -> int:
    self._mngr.reload()
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise NoCheckpointError(f"No finalized checkpoint in {self.directory}.")
      return steps[-1]
    if step not in steps:
      raise NoCheckpointError(f"No finalized checkpoint for step {step} in {self.directory}; steps there: {steps}.")
    return step

  def _read_json(self, step: int, item: str) -> Any:
    try:
      return self._mngr.restore(step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item]
    except Exception as e:  # missing or damaged JSON file
      raise CorruptCheckpointError(
          f"Checkpoint step {step} in {self.directory}: its {item!r} item is unreadable "
          f"({type(e).__name__}: {e}). Use restore_latest_valid() to fall back to an older step.") from e

  def saved_layout(self, step: int | None = None) -> dict[str, dict]:
    """``{leaf name: {shape, dtype, key_impl}}`` of a saved step (default: latest)."""
    step = self._step(step)
    saved = self._read_json(step, "layout")
    if not isinstance(saved, dict) or saved.get("format") != _FORMAT:
      raise CorruptCheckpointError(f"Checkpoint step {step} in {self.directory} has no {_FORMAT} layout.")
    return saved["leaves"]

  def metadata(self, step: int | None = None) -> dict:
    """The user metadata saved with a step (default: latest)."""
    return self._read_json(self._step(step), "metadata")

  def _read(self, step: int, pairs: list, partial: bool) -> dict:
    item, restore_args = layout.read_args(pairs)
    args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=partial)
    try:
      return self._mngr.restore(step, args=ocp.args.Composite(state=args))["state"]
    except CheckpointError:
      raise
    except Exception as e:
      raise CorruptCheckpointError(
          f"Checkpoint step {step} in {self.directory} could not be read ({type(e).__name__}: {e}). "
          "restore_latest_valid() falls back to the newest readable step.") from e

  def restore(self, target: Any, step: int | None = None, *, optimizer_changed: str = "error",
              opt_state_key: str = "opt_state") -> Restored:
    """Restores ``step`` (default: latest) into ``target``'s types and shardings.

    ``target`` is the state as the current program would build it: arrays, or
    ``jax.ShapeDtypeStruct`` with ``sharding=`` for the current mesh (any mesh
    shape, device or process count). Any difference of paths, shapes or dtypes
    raises ``StructureMismatchError`` listing them. With
    ``optimizer_changed="reinit"`` the leaves under ``opt_state_key`` are not
    read: the optimizer state is created fresh (``target.tx.init`` for a
    TrainState, else the target's own concrete values).
    """
    if optimizer_changed not in OPTIMIZER_CHANGED:
      raise ValueError(f"optimizer_changed must be one of {OPTIMIZER_CHANGED}, got {optimizer_changed!r}.")
    step = self._step(step)
    saved = self.saved_layout(step)
    pairs = layout.named_leaves(target)
    what = f"Restoring step {step} from {self.directory}"
    if optimizer_changed == "reinit":
      _, pairs = split_optimizer(target, pairs, opt_state_key)
      saved_rest = {n: s for n, s in saved.items() if not is_optimizer_leaf(n, opt_state_key)}
      layout.check_same(saved_rest, layout.describe(pairs), what)
    else:
      hint = lambda paths: _reinit_hint(paths, opt_state_key)  # noqa: E731
      layout.check_same(saved, layout.describe(pairs), what, hint)
    values = self._read(step, pairs, partial=len(pairs) < len(saved))
    state = layout.rebuild(target, layout.named_leaves(target), values, saved)
    if optimizer_changed == "reinit":
      state = fresh_opt_state(state, target, opt_state_key)
    return Restored(state, step, self.metadata(step))

  def restore_subtree(self, target: Any, prefix: str, step: int | None = None) -> Restored:
    """Restores only the saved leaves under ``prefix`` (e.g. ``"params"``) into ``target``."""
    step = self._step(step)
    saved = self.saved_layout(step)
    pairs = [(f"{prefix}.{n}", x) for n, x in layout.named_leaves(target)]
    under = {n: s for n, s in saved.items() if n.startswith(prefix + ".")}
    layout.check_same(under, layout.describe(pairs), f"Restoring {prefix!r} of step {step} from {self.directory}")
    values = self._read(step, pairs, partial=True)
    return Restored(layout.rebuild(target, pairs, values, saved), step, self.metadata(step))

  def restore_params(self, params_target: Any, step: int | None = None, *, prefix: str = "params") -> Restored:
    """Restores the params only (a TrainState's ``params`` by default)."""
    return self.restore_subtree(params_target, prefix, step)

  def restore_latest_valid(self, target: Any, **kwargs) -> Restored:
    """Restores the newest step that reads back; skips (and logs) corrupt ones.

    Structure mismatches are not skipped: they mean the target is wrong.
    """
    self._mngr.reload()
    failures = []
    for step in reversed(self.all_steps()):
      try:
        return self.restore(target, step, **kwargs)
      except CorruptCheckpointError as e:
        _log.warning("Skipping unreadable checkpoint step %d: %s", step, e)
        failures.append(f"  step {step}: {e}")
    raise NoCheckpointError(f"No readable checkpoint in {self.directory}." + ("\n" + "\n".join(failures) if failures else ""))


def _reinit_hint(paths: list[str], opt_state_key: str) -> str:
  if all(is_optimizer_leaf(n, opt_state_key) for n in paths):
    return ("\nOnly the optimizer state differs: if the optimizer was changed on purpose, pass "
            "optimizer_changed='reinit' to restore the rest with a fresh optimizer state.")
  return ""
