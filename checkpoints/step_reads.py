"""Reading a finalized step's items through orbax: its record and user metadata, and the
arrays a restore asks for, each checked against the checksum written at save time. A missing
item folder, an unreadable file or a checksum mismatch raises ``CorruptCheckpointError``."""

import errno
import logging
from typing import Any

import orbax.checkpoint as ocp

from checkpoints import failures
from checkpoints import layout
from checkpoints import record
from checkpoints.errors import CheckpointError
from checkpoints.errors import CorruptCheckpointError
from checkpoints.errors import quoted_names

__all__ = ["read_arrays", "read_record"]

_log = logging.getLogger(__name__)


def _require_items(directory, step: int, names: tuple[str, ...]) -> None:
  """Raises ``FileNotFoundError`` (a missing file: ``failures.is_corruption``) naming the
  first of the step's item folders ``names`` that is not there; checked on the filesystem
  before orbax reads them."""
  for name in names:
    folder = directory / str(step) / name
    if not folder.is_dir():
      raise FileNotFoundError(errno.ENOENT, f"the item folder {name!r} of the step is missing", str(folder))


def read_record(mngr: ocp.CheckpointManager, directory, step: int) -> tuple[record.Record, dict]:
  """The step's parsed record and user metadata (one orbax read of both JSON items)."""
  try:
    _require_items(directory, step, ("layout", "metadata"))
    items = mngr.restore(step, args=ocp.args.Composite(
        layout=ocp.args.JsonRestore(), metadata=ocp.args.JsonRestore()))
  except Exception as e:  # noqa: BLE001  (classified by failures.raise_for)
    failures.raise_for(e, step, directory, "its layout or metadata file")
  try:
    return record.parse(items["layout"], items["metadata"]), items["metadata"]
  except (ValueError, KeyError, TypeError) as e:
    raise CorruptCheckpointError(
        f"Checkpoint step {step} in {directory} is damaged: {e}. "
        "restore_latest_valid() falls back to the newest intact step.", step=step) from e


def read_arrays(mngr: ocp.CheckpointManager, directory, step: int, pairs: list,
                saved: record.Record, partial: bool) -> dict[str, Any]:
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
    _require_items(directory, step, ("state",))
    values = mngr.restore(step, args=ocp.args.Composite(state=args))["state"]
  except CheckpointError:
    raise
  except Exception as e:  # noqa: BLE001  (classified by failures.raise_for)
    failure = e
    failures.release_abandoned_reads(e)
  missing_elsewhere = failures.agree_across_processes(failure, step, directory)
  if failure is not None:
    failures.raise_for(failure, step, directory, "an array file", missing_elsewhere)
  if saved.checksums is None:
    _log.warning("Checkpoint step %d in %s was written without checksums: its bytes are not verified.",
                 step, directory)
    return {**values, **empty}
  damaged = saved.damaged(values)
  if damaged:
    raise CorruptCheckpointError(
        f"Checkpoint step {step} in {directory} is damaged: leaf {quoted_names(damaged)} read back different from what "
        "was written (checksum mismatch). restore_latest_valid() falls back to the newest intact step.",
        step=step, leaves=tuple(damaged))
  return {**values, **empty}
