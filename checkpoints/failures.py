"""Which failed reads mean a damaged checkpoint, and a short account of each.

Only storage and decode failures count as corruption: TensorStore statuses
``DATA_LOSS`` (undecodable), ``NOT_FOUND`` (a file of a finalized step is
missing), ``OUT_OF_RANGE`` (a truncated file) and ``FAILED_PRECONDITION``
(e.g. a truncated compressed stream), a missing file or item folder, and
undecodable JSON.
Everything else (a wrong restore target, permissions, transient I/O such as
``UNAVAILABLE`` or ``DEADLINE_EXCEEDED``, a timeout) is not corruption and
propagates, so nothing silently rolls back to an older step.
"""

from collections.abc import Iterator
import json
import re

__all__ = ["is_corruption", "leaf_of", "permission_denied", "summary"]

_CORRUPTION_STATUSES = ("DATA_LOSS", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION")
_MISSING_ITEM = "was not found in the checkpoint"  # Orbax: an item folder of the step is gone
_STATUS = re.compile(r"^([A-Z_]+): ")
_LEAF = re.compile(r'Error (?:reading|opening|decoding) "([^"/]+)/')
_SPEC = re.compile(r" ?\[tensorstore_spec(\[\d+\])?='.*?'\]", re.DOTALL)


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
    if isinstance(e, KeyError) and _MISSING_ITEM in str(e):
      return True
    if _status(e) in _CORRUPTION_STATUSES:
      return True
  return False


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
