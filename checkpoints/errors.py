"""Errors raised by checkpoints/: each names what to look at and what to do."""

__all__ = [
    "BarrierTimeoutError",
    "CheckpointDirectoryError",
    "CheckpointError",
    "CorruptCheckpointError",
    "NoCheckpointError",
    "StructureMismatchError",
]


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
  """

  def __init__(self, message: str, *, step: int | None = None, leaves: tuple[str, ...] = ()):
    super().__init__(message)
    self.step = step
    self.leaves = tuple(leaves)


class NoCheckpointError(CheckpointError, FileNotFoundError):
  """No (valid) checkpoint exists where one was asked for."""


class CheckpointDirectoryError(CheckpointError, OSError):
  """The checkpoint directory is a file, or cannot be created or written."""


class BarrierTimeoutError(CheckpointError, TimeoutError):
  """Some processes did not reach a multi-host barrier within its timeout."""
