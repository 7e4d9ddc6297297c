"""Which failed reads mean a damaged checkpoint, and a short account of each.

Only storage and decode failures count as corruption: TensorStore statuses
``DATA_LOSS`` (undecodable), ``NOT_FOUND`` (a file of a finalized step is
missing), ``OUT_OF_RANGE`` (a truncated file) and ``FAILED_PRECONDITION``
(e.g. a truncated compressed stream), a missing file or item folder, and
undecodable JSON.
Everything else (a wrong restore target, permissions, transient I/O such as
``UNAVAILABLE`` or ``DEADLINE_EXCEEDED``, a timeout) is not corruption and
propagates, so nothing silently rolls back to an older step.

TensorStore raises a plain ``ValueError`` whose message starts with the absl
status code (``NOT_FOUND: ...``), the one place it gives the code (no
attribute carries it); ``_status`` reads that prefix and nothing else of the
text. Missing item folders are found on the filesystem before a step is read
(``step_reads._require_items``), not from Orbax's messages.
"""

from collections.abc import Iterator
import errno
import gc
import json
import os
import re
import traceback
from typing import NoReturn
import warnings

import jax
import numpy as np

from checkpoints.errors import CorruptCheckpointError

__all__ = ["agree_across_processes", "is_corruption", "is_missing", "leaf_of", "newest_phrase",
           "permission_denied", "raise_for", "summary", "write_failure"]

_FALL_BACK = "restore_latest_valid() falls back to the newest intact step."

_CORRUPTION_STATUSES = ("DATA_LOSS", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION")
_STATUS = re.compile(r"^([A-Z_]+): ")
_LEAF = re.compile(r'Error (?:reading|opening|decoding) "([^"/]+)/')
_SPEC = re.compile(r" ?\[tensorstore_spec(\[\d+\])?='.*?'\]", re.DOTALL)
_WRITE_STATUSES = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "NOT_FOUND", "UNAVAILABLE")
_WRITTEN_PATH = re.compile(r'(?:Failed writing|Error (?:writing|opening|deleting)(?: local file)?|local file):? "([^"]+)"')
_OS_ERROR = re.compile(r"\[os_error_code='(\d+)'\]")


def _chain(exc: BaseException) -> Iterator[BaseException]:
  seen = set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    yield exc
    exc = exc.__cause__ or exc.__context__


def _status(exc: BaseException) -> str | None:
  match = _STATUS.match(str(exc)) if isinstance(exc, ValueError) else None
  return match.group(1) if match else None


def permission_denied(exc: BaseException) -> bool:
  """Whether the read failed for lack of permission (never corruption)."""
  return any(isinstance(e, PermissionError) or _status(e) == "PERMISSION_DENIED" for e in _chain(exc))


def is_corruption(exc: BaseException) -> bool:
  """Whether a failed read means the checkpoint's files are damaged or missing."""
  if permission_denied(exc):
    return False
  for e in _chain(exc):
    if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError, FileNotFoundError)):
      return True
    if _status(e) in _CORRUPTION_STATUSES:
      return True
  return False


def is_missing(exc: BaseException) -> bool:
  """Whether a failed read means files were not found (rather than found damaged)."""
  return any(isinstance(e, FileNotFoundError) or _status(e) == "NOT_FOUND" for e in _chain(exc))


def write_failure(exc: BaseException) -> tuple[str | None, str] | None:
  """(path, reason) when a failed write means the storage refused it (disk full, permission
  lost, filesystem gone: an OSError, or a TensorStore status that says so), else None."""
  for e in _chain(exc):
    if isinstance(e, OSError) and e.errno is not None:
      return e.filename, e.strerror or errno.errorcode.get(e.errno, str(e.errno))
    status = _status(e)
    if status in _WRITE_STATUSES:
      text = str(e)
      paths, code = _WRITTEN_PATH.findall(text), _OS_ERROR.search(text)
      reason = os.strerror(int(code.group(1))) if code else status.replace("_", " ").lower()
      return (paths[-1] if paths else None), reason
  return None


def newest_phrase(newest: int | None, listed: bool, directory) -> str:
  """A failed write's account of the newest finalized step in ``directory``: as the storage
  lists it (``listed``), or as seen before the failure where the storage does not list it now
  (a filesystem gone mid-run)."""
  if listed:
    return (f"the newest complete checkpoint is step {newest} in {directory}" if newest is not None
            else f"there is no complete checkpoint in {directory}")
  if newest is None:
    return f"{directory} cannot be listed now, and no complete checkpoint was seen there before"
  return (f"the newest complete checkpoint seen in {directory} before the failure is step"
          f" {newest}; the folder does not list it now")


def summary(exc: BaseException, limit: int = 400) -> str:
  """The innermost message of a failure, without TensorStore's spec dumps, at most ``limit`` characters."""
  inner = list(_chain(exc))[-1]
  text = " ".join(_SPEC.sub("", str(inner)).split())
  text = text if len(text) <= limit else text[:limit - 3] + "..."
  return f"{type(inner).__name__}: {text}"


def leaf_of(exc: BaseException) -> str | None:
  """The state leaf a TensorStore read error names (its key in the checkpoint), if any."""
  for e in _chain(exc):
    match = _LEAF.search(str(e))
    if match:
      return match.group(1)
  return None


def release_abandoned_reads(exc: BaseException) -> None:
  """Frees, here and without a word, what a failed Orbax read left behind: it creates a read's
  coroutines before awaiting them, so when one read fails the others are never awaited, and
  Python prints a RuntimeWarning whenever they are collected (later, in the middle of the
  caller's output, through any error line it prints). Clears the locals of the failure's frames
  (the traceback keeps its lines) and collects them now, that warning silenced."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    for e in _chain(exc):
      traceback.clear_frames(e.__traceback__)
    gc.collect()


def raise_for(e: Exception, step: int, directory, what: str, missing_elsewhere: bool = False) -> NoReturn:
  """Raises for a failed read of ``what`` (e.g. "an array file"): CorruptCheckpointError only for
  damaged or missing storage (``missing`` when files were not found here or, per
  ``missing_elsewhere``, by another process), a PermissionError naming the step for a permission
  failure, else ``e`` itself."""
  if permission_denied(e):
    raise PermissionError(f"Checkpoint step {step} in {directory}: permission denied reading {what} "
                          f"({summary(e)}). Fix the files' permissions; the step was not skipped.") from e
  if not is_corruption(e):
    raise e
  leaf = leaf_of(e)
  raise CorruptCheckpointError(
      f"Checkpoint step {step} in {directory} is damaged: {what}" + (f" (leaf {leaf!r})" if leaf else "")
      + f" could not be read ({summary(e)}). {_FALL_BACK}", step=step, leaves=(leaf,) if leaf else (),
      missing=missing_elsewhere or is_missing(e)) from e


def agree_across_processes(failure: Exception | None, step: int, directory) -> bool:
  """With several processes each reads its own shards: a process whose read succeeded raises too
  when another's failed, so that all go on, or fall back, together (a collective). Returns
  whether any process found files missing (False with one process)."""
  if jax.process_count() == 1:
    return False
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  kind = 0 if failure is None else (3 if is_missing(failure) else 1) if is_corruption(failure) else 2
  kinds = np.asarray(multihost_utils.process_allgather(np.int32(kind))).reshape(-1)
  missing = bool((kinds == 3).any())
  if failure is not None or not kinds.any():
    return missing
  bad = [int(i) for i in np.flatnonzero(kinds)]
  if kinds.max() != 2:
    raise CorruptCheckpointError(
        f"Checkpoint step {step} in {directory} is damaged: process(es) {bad} could not read their shards "
        f"(see their errors). {_FALL_BACK}", step=step, missing=missing)
  raise RuntimeError(f"Process(es) {bad} failed to read checkpoint step {step} in {directory} for a reason "
                     "other than damage (see their errors); the step was not skipped.")
