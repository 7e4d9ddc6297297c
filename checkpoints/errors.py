"""Errors raised by checkpoints/: each names what to look at and what to do."""

__all__ = [
    "BarrierTimeoutError",
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
  """A finalized checkpoint could not be read back (truncated, damaged files)."""


class NoCheckpointError(CheckpointError, FileNotFoundError):
  """No (valid) checkpoint exists where one was asked for."""


class BarrierTimeoutError(CheckpointError, TimeoutError):
  """Some processes did not reach a multi-host barrier within its timeout."""
