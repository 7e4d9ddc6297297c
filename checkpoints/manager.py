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

import logging
import warnings
from typing import Any
from typing import NoReturn

import jax
import orbax.checkpoint as ocp

from checkpoints import failures
from checkpoints import layout
from checkpoints import quiet
from checkpoints import record
from checkpoints import restore_plan
from checkpoints import save_checks
from checkpoints import step_reads
from checkpoints.barrier import barrier
from checkpoints.directory import checked_directory
from checkpoints.errors import CheckpointError
from checkpoints.errors import CheckpointWriteError
from checkpoints.errors import CorruptCheckpointError
from checkpoints.errors import NoCheckpointError
from checkpoints.policy import CheckpointPolicy
from checkpoints.reinit import OPTIMIZER_CHANGED
from checkpoints.reinit import fresh_opt_state
from checkpoints.restore_results import Restored
from checkpoints.restore_results import SkippedStep

__all__ = ["CheckpointManager", "Restored", "SkippedStep"]

_log = logging.getLogger(__name__)


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
    self._seen = None  # the newest step newest_finalized() saw finalized (storage may lose it)

  # Listing and lifecycle -------------------------------------------------

  def all_steps(self) -> list[int]:
    """Steps of the finalized checkpoints, ascending (not the one a background save is still
    writing)."""
    writing = self._writing if self._mngr.is_saving_in_progress() else None
    return sorted(s for s in self._mngr.all_steps() if s != writing)

  def _reload(self) -> None:
    """Reads the steps on storage again (another process or program may have written some),
    unless this manager's own save is in flight: a reload then drops the step being written,
    and orbax does not list it again once it is finalized (a later save of that step wrote
    over it)."""
    if not self._mngr.is_saving_in_progress():
      self._mngr.reload()

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
    newest, listed = self.newest_finalized()
    raise CheckpointWriteError(
        f"Checkpoint step {self._writing} could not be written to {path or self.directory}: {reason};"
        f" {failures.newest_phrase(newest, listed, self.directory)}.", step=self._writing,
        path=path, reason=reason, newest=newest) from e

  def newest_finalized(self) -> tuple[int | None, bool]:
    """(the newest finalized step, whether the storage lists it now), for a failure's account:
    the newest step listed on storage, or the newest this manager saw finalized before where
    the storage lists none as new (a filesystem gone mid-run: the folder is missing, or empty
    where a save in flight created it again). The step of the last save counts only once it is
    known finalized: not in flight, no error raised."""
    doubtful = None if self._last_save_finalized() else self._writing
    newest = lambda: max((s for s in self._mngr.all_steps() if s != doubtful), default=None)
    self._seen = max((s for s in (self._seen, newest()) if s is not None), default=None)
    try:
      if not self.directory.is_dir():
        return self._seen, False
      self._reload()
      listed = newest()
    except Exception:  # noqa: BLE001  (the storage may be gone altogether)
      return self._seen, False
    if self._seen is not None and (listed is None or listed < self._seen):
      return self._seen, False
    return listed, True

  def _last_save_finalized(self) -> bool:
    if self._writing is None:
      return True
    if self._failed or self._mngr.is_saving_in_progress():
      return False
    try:
      self._mngr.check_for_errors()
    except Exception:  # noqa: BLE001  (any error of the background save: not finalized)
      return False
    return True

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
    the largest step saved (with a warning saying so), unless ``force``; a step
    saved already (or being written) is skipped with a warning, and with
    ``force`` refused (``CheckpointError``): a finalized checkpoint is never
    written over. With a policy's ``keep_best``, ``metrics`` (if given) must
    hold its ``best_metric`` (else ``ValueError``, nothing written).
    Each array's checksum is computed from its shards before the write starts.
    """
    if self.read_only:
      raise CheckpointError(f"CheckpointManager({self.directory}, read_only=True) cannot save.")
    step = save_checks.checked_step(step)
    saved = sorted(self._mngr.all_steps())  # the one in flight too
    if step in saved:
      if force:
        raise CheckpointError(
            f"CheckpointManager({self.directory}).save({step}, force=True): step {step} is"
            " saved already, and a finalized checkpoint is never written over (a failed write"
            " would lose it); save another step, or delete this one's folder first.")
      warnings.warn(f"CheckpointManager({self.directory}).save({step}) skipped: step {step} is"
                    " saved already", stacklevel=2)
      return False
    latest = saved[-1] if saved else None
    if not force and latest is not None and step <= latest:
      warnings.warn(f"CheckpointManager({self.directory}).save({step}) skipped: not above the"
                    f" largest step saved, {latest}; pass force=True to write it (restore"
                    " reads the largest step by default)", stacklevel=2)
      return False
    if not force and not self._mngr.should_save(step):
      return False
    metadata = save_checks.checked_json(metadata or {}, "metadata")
    if metrics is not None:
      metrics = {k: float(v) for k, v in metrics.items()}
      self._refuse_unranked(step, metrics)
    save_checks.refuse_deleted(step, state)
    barrier(f"save_{step}", self.policy.timeout_s)
    saveable = layout.to_saveable(state)
    save_checks.refuse_no_data(step, state, saveable)
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

  def _refuse_unranked(self, step: int, metrics: dict) -> None:
    """Raises ValueError, before anything is written, when ``metrics`` lack the key the policy's
    ``keep_best`` ranks by (orbax ranked every later save with it and raised a bare KeyError
    from each, keeping every step)."""
    wanted = self.policy.best_metric
    if self.policy.keep_best is not None and wanted not in metrics:
      raise ValueError(
          f"CheckpointManager({self.directory}).save({step}, metrics={sorted(metrics)}): the"
          f" metrics lack {wanted!r}, by which keep_best={self.policy.keep_best} ranks the"
          f" checkpoints; pass metrics with {wanted!r}, or none (a step without metrics is"
          " always kept).")

  # Restoring ----------------------------------------------------------

  def _step(self, step: int | None) -> int:
    self._reload()
    steps = self.all_steps()
    if step is None:
      if not steps:
        raise NoCheckpointError(f"No finalized checkpoint in {self.directory}.")
      return steps[-1]
    if step not in steps:
      raise NoCheckpointError(f"No finalized checkpoint for step {step} in {self.directory}; steps there: {steps}.")
    return step

  def saved_layout(self, step: int | None = None) -> dict[str, dict]:
    """``{leaf name: {shape, dtype, key_impl}}`` of a saved step (default: latest)."""
    return step_reads.read_record(self._mngr, self.directory, self._step(step))[0].leaves

  def metadata(self, step: int | None = None) -> dict:
    """The user metadata saved with a step (default: latest)."""
    return step_reads.read_record(self._mngr, self.directory, self._step(step))[1]

  def _read_planned(self, step: int, saved: record.Record, metadata: dict,
                    plan: restore_plan.ReadPlan, target: Any) -> Restored:
    """The leaves ``plan`` reads from ``step``, in ``target``'s tree and form (the leaves it
    does not read as given; those read in another quantized form re-tiled)."""
    values = step_reads.read_arrays(self._mngr, self.directory, step, plan.read, saved, plan.partial)
    state = layout.rebuild(plan.target, plan.pairs, values, saved.leaves)
    return Restored(restore_plan.in_target_form(state, target, plan.retiled, step), step, metadata,
                    retiled=tuple(plan.retiled))

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
    saved, metadata = step_reads.read_record(self._mngr, self.directory, step)
    plan = restore_plan.whole_state(target, saved, f"Restoring step {step} from {self.directory}",
                                    optimizer_changed, opt_state_key)
    restored = self._read_planned(step, saved, metadata, plan, target)
    if optimizer_changed == "reinit":  # nothing re-tiled: the optimizer state was not read
      return restored._replace(state=fresh_opt_state(restored.state, target, opt_state_key))
    return restored

  def restore_subtree(self, target: Any, prefix: str, step: int | None = None, *,
                      opt_state_key: str = "opt_state") -> Restored:
    """Restores only the saved leaves under ``prefix`` (e.g. ``"params"``) into ``target``;
    quantized state saved in another form is re-tiled, and optimizer state of another class
    refused, as ``restore`` does."""
    step = self._step(step)
    saved, metadata = step_reads.read_record(self._mngr, self.directory, step)
    plan = restore_plan.subtree(target, saved, prefix,
                                f"Restoring {prefix!r} of step {step} from {self.directory}", opt_state_key)
    return self._read_planned(step, saved, metadata, plan, target)

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
    self._reload()
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

