"""Errors raised by checkpoints/: each names what to look at and what to do."""

__all__ = [
    "BarrierTimeoutError",
    "CheckpointDirectoryError",
    "CheckpointError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "NoCheckpointError",
    "StructureMismatchError",
    "quoted_names",
]


def quoted_names(names, shown: int = 5) -> str:
  """The first ``shown`` of ``names`` quoted, and how many more (``'a', 'b' and 3 more``): a
  message names a few leaves, however many there are."""
  names = list(names)
  more = f" and {len(names) - shown} more" if len(names) > shown else ""
  return ", ".join(repr(n) for n in names[:shown]) + more


class CheckpointError(Exception):
  """Base class of every error raised by checkpoints/."""


class StructureMismatchError(CheckpointError, ValueError):
  """The saved tree and the restore target differ (paths, shapes or dtypes)."""


class CorruptCheckpointError(CheckpointError):
  """A finalized checkpoint's bytes are damaged or missing: unreadable, undecodable, or read back
  different from what was written (checksum mismatch).

  Attributes:
    step: the damaged step (None if unknown).
    leaves: names of the damaged leaves (e.g. ``("params.dense.kernel",)``); empty when the damage
      is not tied to a leaf (a missing or undecodable item file).
    missing: files of the step were not found (on a filesystem that lags they may yet appear),
      rather than found damaged.
  """

  def __init__(self, message: str, *, step: int | None = None, leaves: tuple[str, ...] = (),
               missing: bool = False):
    super().__init__(message)
    self.step = step
    self.leaves = tuple(leaves)
    self.missing = missing


class NoCheckpointError(CheckpointError, FileNotFoundError):
  """No (valid) checkpoint exists where one was asked for.

  Attributes:
    skipped: from ``restore_latest_valid``, every step it tried and why it failed
      (``SkippedStep``s, newest first); empty when there was no step at all.
  """

  def __init__(self, message: str, *, skipped: tuple = ()):
    super().__init__(message)
    self.skipped = tuple(skipped)


class CheckpointDirectoryError(CheckpointError, OSError):
  """The checkpoint directory is a file, or cannot be created or written."""


class CheckpointWriteError(CheckpointError, OSError):
  """A step could not be written: the disk is full, permission was lost, or the filesystem went
  away. The step is not finalized (a later manager removes its temporary folder); the steps
  before it are intact.

  Attributes:
    step: the step being written.
    path: the file or folder that could not be written (None if unknown).
    reason: what the storage said, e.g. "No space left on device".
    newest: the newest finalized step (None if there is none).
  """

  def __init__(self, message: str, *, step: int | None, path: str | None, reason: str,
               newest: int | None):
    super().__init__(message)
    self.step, self.path, self.reason, self.newest = step, path, reason, newest


class BarrierTimeoutError(CheckpointError, TimeoutError):
  """Some processes did not reach a multi-host barrier within its timeout."""
