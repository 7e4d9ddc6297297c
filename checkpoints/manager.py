"""Resumable checkpoints of a sharded training state, restorable onto any mesh.

A step directory holds three orbax items: ``state`` (the leaf-path dict of
arrays, each process writing only its own shards), ``layout`` (JSON: each
leaf's shape, dtype and key implementation, its checksum, and a digest; see
checkpoints.record) and ``metadata`` (the caller's JSON). Orbax writes into a
temporary directory and renames it on completion, so a save killed at any
point never shows up as a step; old steps are deleted only after a newer save
has been finalized. Every restore checks the bytes it read against the
checksums written at save time.
"""

import errno
import json
import logging
import operator
import warnings
from typing import Any
from typing import NamedTuple
from typing import NoReturn

import jax
import orbax.checkpoint as ocp

from checkpoints import failures
from checkpoints import layout
from checkpoints import quiet
from checkpoints import record
from checkpoints import retile
from checkpoints import state_classes
from checkpoints.barrier import barrier
from checkpoints.directory import checked_directory
from checkpoints.errors import CheckpointError
from checkpoints.errors import CheckpointWriteError
from checkpoints.errors import CorruptCheckpointError
from checkpoints.errors import NoCheckpointError
from checkpoints.errors import StructureMismatchError
from checkpoints.policy import CheckpointPolicy
from checkpoints.reinit import OPTIMIZER_CHANGED
from checkpoints.reinit import fresh_opt_state
from checkpoints.reinit import is_optimizer_leaf
from checkpoints.reinit import split_optimizer

__all__ = ["CheckpointManager", "Restored", "SkippedStep"]

_log = logging.getLogger(__name__)


class SkippedStep(NamedTuple):
  """A step ``restore_latest_valid`` passed over, why (the CorruptCheckpointError's message), and
  whether its files were missing rather than damaged (a filesystem that lags may yet show them)."""

  step: int
  reason: str
  missing: bool = False


class Restored(NamedTuple):
  """What a restore returns: the state (target's types), its step, the user metadata.

  ``skipped`` lists the newer steps ``restore_latest_valid`` passed over
  because they were damaged, newest first (always empty from ``restore``).
  ``retiled`` names the optimizer-state leaves saved in another quantized
  form than the target's (on another mesh): codes in other blocks re-encoded
  in the target's, codes decoded where the target keeps float, float encoded
  where the target keeps codes.
  """

  state: Any
  step: int
  metadata: dict
  skipped: tuple[SkippedStep, ...] = ()
  retiled: tuple[str, ...] = ()


def _json(value: Any, what: str) -> Any:
  try:
    return json.loads(json.dumps(value))
  except TypeError as e:
    raise TypeError(f"{what} must be JSON-serializable (dicts, lists, str, numbers): {e}") from e


def _refuse_deleted(step: int, state: Any) -> None:
  """Raises CheckpointError naming the leaves of ``state`` whose arrays were deleted (donated
  to a jitted call, which consumed them), before any process writes."""
  dead = [name for name, leaf in layout.named_leaves(state)
          if isinstance(leaf, jax.Array) and leaf.is_deleted()]
  if dead:
    raise CheckpointError(
        f"save({step}): the arrays of {', '.join(repr(n) for n in dead[:5])}"
        f"{f' and {len(dead) - 5} more leaves' if len(dead) > 5 else ''} were deleted: donated"
        " to a jitted call (the sharded step consumes the params and state it is given and"
        " returns new ones). Save the params and state that call returned.")


def _checked_step(step) -> int:
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


class CheckpointManager:
  """Saves and restores training states under ``directory`` (one subdirectory per step).

  Every process must make the same calls (save, restore, wait, close) in the
  same order. Use as a context manager, or call ``close()``, so the last
  asynchronous save is finalized before the program exits.

  Raises:
    CheckpointDirectoryError: at construction, when ``directory`` is a file or
      cannot be created or written (``read_only=True`` only restores, and
      needs the directory to exist).
  """

  def __init__(self, directory, policy: CheckpointPolicy | None = None, *, read_only: bool = False):
    self.policy = policy or CheckpointPolicy()
    self.read_only = read_only
    self.directory = checked_directory(directory, read_only=read_only)
    quiet.install()
    if jax.process_count() > 1:  # every process has created it before orbax looks
      barrier("create_directory", self.policy.timeout_s)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        item_handlers=self.policy.item_handlers(),
        options=self.policy.manager_options(read_only=read_only),
    )
    self._writing = None  # the step of the save in flight, until it is known to be finalized
    self._failed = False  # a CheckpointWriteError was raised: close() only releases

  # Listing and lifecycle -------------------------------------------------

  def all_steps(self) -> list[int]:
    """Steps of the finalized checkpoints, ascending."""
    return sorted(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    """The largest finalized step (the one ``restore`` reads by default), or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def should_save(self, step: int) -> bool:
    """Whether ``save(step, ...)`` would write under the save interval."""
    return self._mngr.should_save(step)

  def wait_until_finished(self) -> None:
    """Blocks until the background save (if any) is finalized; raises its error
    (``CheckpointWriteError`` when the storage refused the write)."""
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # noqa: BLE001  (classified by _write_failed)
      self._write_failed(e)
    self._writing = None

  def close(self) -> None:
    """Finalizes pending saves and deletions and releases orbax's threads, the clean-up of
    temporary folders it starts on opening included (orbax's own close leaves that thread
    running: a process exiting at once, on a usage error, printed its traceback). After a
    ``CheckpointWriteError`` it only releases (the failure was raised once)."""
    try:
      cleanup = getattr(self._mngr, "_cleanup_tmp_directory_future", None)
      if cleanup is not None:
        cleanup.result()
      self._mngr.close()
    except Exception as e:  # noqa: BLE001  (classified by _write_failed)
      if self._failed:
        _log.warning("Closing after a failed write: %s", failures.summary(e))
        return
      self._write_failed(e)

  def _write_failed(self, e: Exception) -> NoReturn:
    """Raises ``CheckpointWriteError`` naming the step in flight, the path and the newest
    finalized step when the storage refused a write, else ``e`` itself."""
    found = failures.write_failure(e)
    if found is None:
      raise e
    path, reason = found
    self._failed = True
    try:
      self._mngr.reload()
      newest = max((s for s in self._mngr.all_steps() if s != self._writing), default=None)
    except Exception:  # noqa: BLE001  (the storage may be gone altogether)
      newest = None
    intact = (f"the newest complete checkpoint is step {newest}" if newest is not None
              else "there is no complete checkpoint")
    raise CheckpointWriteError(
        f"Checkpoint step {self._writing} could not be written to {path or self.directory}: {reason};"
        f" {intact} in {self.directory}.", step=self._writing, path=path, reason=reason,
        newest=newest) from e

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
    Skipped (False) when ``step`` is not on the save interval or not above
    the largest step saved (with a warning saying so), unless ``force``.
    Each array's checksum is computed from its shards before the write starts.
    """
    if self.read_only:
      raise CheckpointError(f"CheckpointManager({self.directory}, read_only=True) cannot save.")
    step = _checked_step(step)
    latest = self.latest_step()
    if not force and latest is not None and step <= latest:
      warnings.warn(f"CheckpointManager({self.directory}).save({step}) skipped: not above the"
                    f" largest step saved, {latest}; pass force=True to write it (restore"
                    " reads the largest step by default)", stacklevel=2)
      return False
    if not force and not self._mngr.should_save(step):
      return False
    metadata = _json(metadata or {}, "metadata")
    if metrics is not None:
      metrics = {k: float(v) for k, v in metrics.items()}
    _refuse_deleted(step, state)
    barrier(f"save_{step}", self.policy.timeout_s)
    saveable = layout.to_saveable(state)
    args = ocp.args.Composite(
        state=ocp.args.PyTreeSave(saveable),
        layout=ocp.args.JsonSave(record.make(state, saveable, metadata)),
        metadata=ocp.args.JsonSave(metadata),
    )
    self.wait_until_finished()  # a failure of the previous save is reported as that step's
    self._writing = step
    try:
      started = self._mngr.save(step, args=args, metrics=metrics, force=force)
    except Exception as e:  # noqa: BLE001  (classified by _write_failed)
      self._write_failed(e)
    if not started:
      self._writing = None
    return started

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

  def _require_items(self, step: int, names: tuple[str, ...]) -> None:
    """Raises ``FileNotFoundError`` (a missing file: ``failures.is_corruption``) naming the
    first of the step's item folders ``names`` that is not there; checked on the filesystem
    before orbax reads them."""
    for name in names:
      folder = self.directory / str(step) / name
      if not folder.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"the item folder {name!r} of the step is missing", str(folder))

  def _record(self, step: int) -> tuple[record.Record, dict]:
    """The step's parsed record and user metadata (one orbax read of both JSON items)."""
    try:
      self._require_items(step, ("layout", "metadata"))
      items = self._mngr.restore(step, args=ocp.args.Composite(
          layout=ocp.args.JsonRestore(), metadata=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001  (classified by failures.raise_for)
      failures.raise_for(e, step, self.directory, "its layout or metadata file")
    try:
      return record.parse(items["layout"], items["metadata"]), items["metadata"]
    except (ValueError, KeyError, TypeError) as e:
      raise CorruptCheckpointError(
          f"Checkpoint step {step} in {self.directory} is damaged: {e}. "
          "restore_latest_valid() falls back to the newest intact step.", step=step) from e

  def saved_layout(self, step: int | None = None) -> dict[str, dict]:
    """``{leaf name: {shape, dtype, key_impl}}`` of a saved step (default: latest)."""
    return self._record(self._step(step))[0].leaves

  def metadata(self, step: int | None = None) -> dict:
    """The user metadata saved with a step (default: latest)."""
    return self._record(self._step(step))[1]

  def _read(self, step: int, pairs: list, saved: record.Record, partial: bool) -> dict:
    """The arrays of ``pairs`` read from ``step``, each checked against its saved checksum
    (empty ones made, not read: ``layout.empty_value``)."""
    empty = {n: layout.empty_value(n, x) for n, x in pairs if layout.is_empty(x)}
    pairs = [(n, x) for n, x in pairs if n not in empty]
    if not pairs:
      return empty
    item, restore_args = layout.read_args(pairs)
    args = ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=partial)
    failure = None
    try:
      self._require_items(step, ("state",))
      values = self._mngr.restore(step, args=ocp.args.Composite(state=args))["state"]
    except CheckpointError:
      raise
    except Exception as e:  # noqa: BLE001  (classified by failures.raise_for)
      failure = e
      failures.release_abandoned_reads(e)
    missing_elsewhere = failures.agree_across_processes(failure, step, self.directory)
    if failure is not None:
      failures.raise_for(failure, step, self.directory, "an array file", missing_elsewhere)
    if saved.checksums is None:
      _log.warning("Checkpoint step %d in %s was written without checksums: its bytes are not verified.",
                   step, self.directory)
      return {**values, **empty}
    damaged = saved.damaged(values)
    if damaged:
      shown = ", ".join(repr(n) for n in damaged[:5]) + (f" and {len(damaged) - 5} more" if len(damaged) > 5 else "")
      raise CorruptCheckpointError(
          f"Checkpoint step {step} in {self.directory} is damaged: leaf {shown} read back different from what "
          "was written (checksum mismatch). restore_latest_valid() falls back to the newest intact step.",
          step=step, leaves=tuple(damaged))
    return {**values, **empty}

  def restore(self, target: Any, step: int | None = None, *, optimizer_changed: str = "error",
              opt_state_key: str = "opt_state") -> Restored:
    """Restores ``step`` (default: latest) into ``target``'s types and shardings.

    ``target`` is the state as the current program would build it: arrays, or
    ``jax.ShapeDtypeStruct`` with ``sharding=`` for the current mesh (any mesh
    shape, device or process count). Any difference of paths, shapes or dtypes,
    or an optimizer-state NamedTuple of another class than the one saved
    (``checkpoints.state_classes``), raises ``StructureMismatchError`` listing them. With
    ``optimizer_changed="reinit"`` the leaves under ``opt_state_key`` are not
    read: the optimizer state is created fresh (``target.tx.init`` for a
    TrainState, else the target's own concrete values).

    Raises:
      CorruptCheckpointError: the step's files are damaged or missing, or a
        leaf read back different from what was written (names step and leaf).
      StructureMismatchError, PermissionError, and any other read error
        (e.g. transient I/O) as themselves.
    """
    if optimizer_changed not in OPTIMIZER_CHANGED:
      raise ValueError(f"optimizer_changed must be one of {OPTIMIZER_CHANGED}, got {optimizer_changed!r}.")
    step = self._step(step)
    saved, metadata = self._record(step)
    # reinit reads no optimizer state (where quantized state lives): nothing to re-tile
    read_target, retiled = ((target, []) if optimizer_changed == "reinit"
                            else retile.saved_tiles(target, saved.leaves))
    pairs, notes = layout.named_leaves(read_target), retile.code_notes(read_target)
    what = f"Restoring step {step} from {self.directory}"
    if optimizer_changed == "reinit":
      _, pairs = split_optimizer(read_target, pairs, opt_state_key)
      saved_rest = {n: s for n, s in saved.leaves.items() if not is_optimizer_leaf(n, opt_state_key)}
      layout.check_same(saved_rest, layout.describe(pairs, notes), what)
    else:
      hint = lambda paths: _reinit_hint(paths, opt_state_key)
      layout.check_same(saved.leaves, layout.describe(pairs, notes), what, hint,
                        _class_differences(saved, target, "", opt_state_key))
    values = self._read(step, pairs, saved, partial=len(pairs) < len(saved.leaves))
    state = layout.rebuild(read_target, layout.named_leaves(read_target), values, saved.leaves)
    if optimizer_changed == "reinit":
      return Restored(fresh_opt_state(state, target, opt_state_key), step, metadata)
    return Restored(_in_target_form(state, target, retiled, step), step, metadata, retiled=tuple(retiled))

  def restore_subtree(self, target: Any, prefix: str, step: int | None = None, *,
                      opt_state_key: str = "opt_state") -> Restored:
    """Restores only the saved leaves under ``prefix`` (e.g. ``"params"``) into ``target``;
    quantized state saved in another form is re-tiled, and optimizer state of another class
    refused, as ``restore`` does."""
    step = self._step(step)
    saved, metadata = self._record(step)
    read_target, retiled = retile.saved_tiles(target, saved.leaves, prefix)
    pairs = layout.named_leaves(read_target, prefix)
    under = {n: s for n, s in saved.leaves.items() if n == prefix or n.startswith(prefix + ".")}
    where = f"Restoring {prefix!r} of step {step} from {self.directory}"
    _check_subtree_target(where, saved.leaves, under, read_target, prefix)
    layout.check_same(under, layout.describe(pairs, retile.code_notes(read_target, prefix)),
                      where, more=_class_differences(saved, target, prefix, opt_state_key))
    values = self._read(step, pairs, saved, partial=True)
    state = layout.rebuild(read_target, pairs, values, saved.leaves)
    return Restored(_in_target_form(state, target, retiled, step), step, metadata, retiled=tuple(retiled))

  def restore_params(self, params_target: Any, step: int | None = None, *, prefix: str = "params") -> Restored:
    """Restores the params only (a TrainState's ``params`` by default)."""
    return self.restore_subtree(params_target, prefix, step)

  def restore_latest_valid(self, target: Any, **kwargs) -> Restored:
    """Restores the newest intact step, passing over damaged ones (listed in ``Restored.skipped``).

    Only ``CorruptCheckpointError`` (damaged or missing files, checksum
    mismatches) and a step deleted meanwhile are passed over; a structure
    mismatch, a permission error or a transient I/O error is raised as itself,
    never answered with an older step. ``kwargs`` go to ``restore``.

    Raises:
      NoCheckpointError: no step is intact (the message lists why each failed).
    """
    self._mngr.reload()
    skipped = []
    for step in reversed(self.all_steps()):
      try:
        restored = self.restore(target, step, **kwargs)
      except (CorruptCheckpointError, NoCheckpointError) as e:
        reason = str(e)
        _log.warning("Skipping damaged checkpoint step %d: %s", step, reason.splitlines()[0])
        missing = not isinstance(e, CorruptCheckpointError) or e.missing  # deleted meanwhile
        skipped.append(SkippedStep(step, reason, missing))
        continue
      return restored._replace(skipped=tuple(skipped))
    raise NoCheckpointError(f"No readable checkpoint in {self.directory}."
                            + "".join(f"\n  step {s.step}: {s.reason}" for s in skipped),
                            skipped=skipped)


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


def _in_target_form(state: Any, target: Any, retiled: list[str], step: int) -> Any:
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
