"""The checkpoint directory: absolute, a directory, writable, checked when a manager is built.

Imports neither jax nor orbax: the job checks its flags with ``orbax_rewrites`` before jax
starts."""

import os
import uuid

from etils import epath

from checkpoints.errors import CheckpointDirectoryError

__all__ = ["checked_directory", "orbax_rewrites"]


def _absolute(directory) -> epath.Path:
  """``directory`` as an absolute path (Orbax rejects relative local paths);
  URLs such as ``gs://bucket/run`` are kept as given."""
  text = os.fspath(directory)
  return epath.Path(text if "://" in text else os.path.abspath(text))


def orbax_rewrites(directory) -> bool:
  """Whether orbax would write the local directory ``directory`` somewhere else: it turns
  every 'gs:/' in a path it hands tensorstore into 'gs://' (so that a gs:// URL survives
  ``os.path.normpath``), and tensorstore refuses the local path that makes (orbax 0.12:
  "Invalid file path" at the first save). False for a URL."""
  text = os.fspath(directory)
  return "://" not in text and "gs:/" in os.path.abspath(text)


def _probe_write(path: epath.Path) -> None:
  """Creates and removes a file in ``path`` (os.access says yes to root on read-only mounts)."""
  probe = path / f".write_probe.{os.getpid()}.{uuid.uuid4().hex}"
  probe.write_text("")
  probe.unlink()


def checked_directory(directory, *, read_only: bool = False) -> epath.Path:
  """The absolute checkpoint directory, created unless ``read_only``.

  Raises:
    CheckpointDirectoryError: the path is a file, is missing (``read_only``),
      cannot be created or written, or is a local path orbax would write
      elsewhere (one holding 'gs:/'); the message names the path.
  """
  path = _absolute(directory)
  if "://" in os.fspath(path):
    return path  # remote storage: checked by its own client on first use
  if orbax_rewrites(path):
    raise CheckpointDirectoryError(
        f"Checkpoint directory {path}: orbax reads 'gs:/' in a local path as a gs:// URL and "
        "cannot write checkpoints there; for a bucket pass gs://..., for a local directory a "
        "path without 'gs:/'.")
  if path.exists() and not path.is_dir():
    raise CheckpointDirectoryError(
        f"Checkpoint directory {path} is a file, not a directory: pass a directory path "
        f"(e.g. {path.parent / 'checkpoints'}).")
  if read_only:
    if not path.is_dir():
      raise CheckpointDirectoryError(f"Checkpoint directory {path} does not exist (read_only=True).")
    return path
  try:
    path.mkdir(parents=True, exist_ok=True)
    _probe_write(path)
  except OSError as e:
    raise CheckpointDirectoryError(
        f"Cannot write checkpoints to {path}: {e.strerror or e}. Choose a writable directory, fix its "
        "permissions, or pass read_only=True to only restore from it.") from e
  return path
