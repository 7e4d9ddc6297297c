"""One run per folder: an exclusive lock file held for the whole run.

``OUT/run.lock`` holds who has the folder (host, pid, the pid's start time,
since when). It is created whole and atomically by ``os.link`` of a file
written beside it (``link`` fails if the lock exists, also on NFS), and its
modification time is refreshed every ``HEARTBEAT_S`` seconds while the run
lives. A lock is stale when its holder is gone: on the same host, no process
with its pid and start time, or only its exit status left (a zombie); on
another host, no heartbeat for ``STALE_AFTER_S`` seconds. A stale lock is
taken over: renamed to a private name, then checked to be the very file judged
stale (its inode and content); a lock another run took meanwhile is put back,
and the run is told the folder is in use, so of two runs taking it over only
one succeeds (not excluded: a third run creating its lock in
the microseconds between such a move and its return). In a multi-process job
process 0 holds it.

A lock file that cannot be written (a full disk, no permission) is a
``StorageError`` naming it, nothing left behind.

A run's folder holds all it writes, so no other run may write anywhere inside
it, e.g. with a --checkpoint-dir there: a folder is in use while a live run
holds its lock or the lock of a folder above it, and a run does not take a
folder holding a live run's lock below it (``refuse_if_held``). A run takes
its locks first and checks above and below them after: of two runs starting
at once whose folders nest, the later to take its lock sees the other's.

Nothing here imports jax, so the job can check a folder before importing it.
"""

import contextlib
import dataclasses
import json
import os
import pathlib
import socket
import stat
import threading
import time
import uuid

from launch.errors import StorageError
from launch.errors import UsageError

__all__ = ["HEARTBEAT_S", "LOCK_NAME", "STALE_AFTER_S", "Holder", "RunLock", "holder_of",
           "refuse_if_held", "refuse_if_inside"]

LOCK_NAME = "run.lock"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0


def _stat_fields(pid: int) -> list[str] | None:
  """The fields of ``/proc/PID/stat`` after the command's name (Linux: the state first), or
  None."""
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
  except (OSError, IndexError):
    return None


def _start_ticks(pid: int) -> int | None:
  """The start time of process ``pid`` in clock ticks since boot (Linux), or None."""
  fields = _stat_fields(pid)
  try:
    return int(fields[19]) if fields else None
  except (IndexError, ValueError):
    return None


def _has_exited(pid: int) -> bool:
  """Whether process ``pid`` has exited and is left only to be reaped (a zombie: its parent
  has not waited for it, e.g. in a container whose first process never does)."""
  fields = _stat_fields(pid)
  return bool(fields) and fields[0] in ("Z", "X")


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a folder, as written in its lock file."""

  host: str
  pid: int
  started: int | None  # the pid's start time, to tell a reused pid
  since: float

  def describe(self) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
    return f"host {self.host}, pid {self.pid}, since {when}"

  def gone(self, lock_age_s: float) -> str | None:
    """Why the holder is gone, or None when it may still run."""
    if self.host != socket.gethostname():
      if lock_age_s > STALE_AFTER_S:
        return f"no heartbeat for {lock_age_s:.0f} s"
      return None
    try:
      os.kill(self.pid, 0)
    except ProcessLookupError:
      return f"no process {self.pid} on this host"
    except PermissionError:
      pass  # another user's live process
    if self.started is not None and _start_ticks(self.pid) not in (None, self.started):
      return f"pid {self.pid} is now another process"
    if _has_exited(self.pid):
      return f"process {self.pid} has exited (not yet reaped)"
    return None


def _mine() -> Holder:
  return Holder(socket.gethostname(), os.getpid(), _start_ticks(os.getpid()), time.time())


def _read(path: pathlib.Path) -> tuple[str, int, float]:
  """(the text, the inode, the age in s) of the file ``path``, read through one descriptor (the
  three of one file). Raises FileNotFoundError, NotADirectoryError, or OSError when unreadable."""
  with open(path, "rb") as f:
    info = os.fstat(f.fileno())
    return f.read().decode(errors="replace"), info.st_ino, time.time() - info.st_mtime


def _identity(path: pathlib.Path) -> tuple[int, str | None]:
  """(inode, text or None where unreadable) of the lock file ``path``: which lock it is."""
  try:
    text, inode, _ = _read(path)
  except OSError:  # unreadable: its inode alone
    return os.stat(path).st_ino, None
  return inode, text


def _found(folder) -> tuple[Holder, str | None, tuple[int, str | None]] | None:
  """(holder, why it is gone or None, the lock file's ``_identity``) of ``folder``'s lock, or
  None when it is not locked. An unreadable lock file counts as held by nobody alive."""
  path = pathlib.Path(folder) / LOCK_NAME
  try:
    text, inode, age = _read(path)
    identity = inode, text
  except (FileNotFoundError, NotADirectoryError):
    return None
  except OSError:
    try:
      identity = os.stat(path).st_ino, None
    except OSError:
      return None
    text, age = "", 0.0  # unreadable
  try:
    holder = Holder(**json.loads(text))
  except (ValueError, TypeError):
    return Holder("?", -1, None, 0.0), f"its lock file {path} is unreadable", identity
  return holder, holder.gone(age), identity


def holder_of(folder) -> tuple[Holder, str | None] | None:
  """(the holder of ``folder``'s lock, why it is gone or None), or None when it is not locked.
  An unreadable lock file counts as held by nobody alive."""
  found = _found(folder)
  return None if found is None else found[:2]


def _in_use(flag: str, folder, holder: Holder, lock: pathlib.Path, fix: str | None) -> UsageError:
  return UsageError(f"{flag} {folder} is in use by another run ({holder.describe()}; lock"
                    f" {lock}): wait for it to end, or {_remedy(flag, fix)}")


def _remedy(flag: str, fix: str | None) -> str:
  return fix or f"choose another {flag}"


def _refuse_a_lock_that_is_no_file(path: pathlib.Path, flag: str, folder) -> None:
  """Raises UsageError when ``path`` is there and no regular file (a folder, a link): no run
  made it (a run's lock is a file it links), so it is neither taken over nor moved."""
  try:
    mode = os.lstat(path).st_mode
  except FileNotFoundError:
    return
  if not stat.S_ISREG(mode):
    kind = "a folder" if stat.S_ISDIR(mode) else "a link" if stat.S_ISLNK(mode) else "no file"
    raise UsageError(f"{flag} {folder}: its lock {path} is {kind}, not a lock file a run wrote;"
                     f" nothing was changed: remove it, or {_remedy(flag, None)}")


class RunLock:
  """The lock of one run folder, held from ``acquire`` until ``release``."""

  def __init__(self, path: pathlib.Path, holder: Holder):
    self.path, self.holder = path, holder
    self._stop = threading.Event()
    self._beat = threading.Thread(target=self._heartbeat, name="run-lock-heartbeat", daemon=True)
    self._beat.start()

  @classmethod
  def acquire(cls, folder, flag: str = "--out", warn=print, fix: str | None = None) -> "RunLock":
    """Takes ``folder``'s lock (the folder must exist); a stale one is taken over with one
    warning. Raises UsageError naming ``flag`` and the holder when a live run holds it, with
    ``fix`` as the remedy (default: choose another ``flag``); StorageError naming the lock file
    when it cannot be written (nothing left behind)."""
    path = pathlib.Path(folder) / LOCK_NAME
    mine, taken_over = _mine(), None
    for _ in range(3):
      if cls._create(path, mine, flag, folder):
        if taken_over is not None:
          warn(f"warning: {flag} {folder}: took over the lock of a run that is gone"
               f" ({taken_over[0].describe()}: {taken_over[1]})")
        return cls(path, mine)
      _refuse_a_lock_that_is_no_file(path, flag, folder)
      found = _found(folder)
      if found is None:
        continue  # released meanwhile
      holder, why, identity = found
      if why is None:
        raise _in_use(flag, folder, holder, path, fix)
      if cls._set_aside(path, identity):
        taken_over = holder, why
    raise UsageError(f"{flag} {folder}: could not take its lock {path} (other runs keep taking"
                     f" it); choose another {flag}")

  @staticmethod
  def _create(path: pathlib.Path, holder: Holder, flag: str, folder) -> bool:
    """Creates the lock file whole; False when it exists. Raises StorageError when it cannot
    be written, its draft removed."""
    draft = path.with_name(f".{LOCK_NAME}.{uuid.uuid4().hex}")
    try:
      try:
        draft.write_text(json.dumps(dataclasses.asdict(holder)))
        os.link(draft, path)
        return True
      except FileExistsError:
        return False
      finally:
        with contextlib.suppress(FileNotFoundError):
          draft.unlink()
    except OSError as e:
      raise StorageError(f"{flag} {folder}: cannot write its lock file {path}"
                         f" ({e.strerror or e}); nothing was left behind. Free space (or"
                         " restore the permissions, the mount), then run again") from e

  @staticmethod
  def _set_aside(path: pathlib.Path, identity: tuple[int, str | None]) -> bool:
    """Removes the stale lock file whose ``_identity`` was read: renamed to a private name
    first, and removed only if it is that file; a lock another run took since it was read is
    put back. Whether the stale lock was removed (False: gone or another's)."""
    moved = path.with_name(f".{LOCK_NAME}.stale.{uuid.uuid4().hex}")
    try:
      os.rename(path, moved)
    except FileNotFoundError:
      return False
    try:
      if _identity(moved) == identity:
        return True
      try:
        os.link(moved, path)  # another run's lock: put back
      except FileExistsError:
        pass  # a third run created one in between: the moved one cannot come back
      return False
    finally:
      moved.unlink()

  def _heartbeat(self) -> None:
    """Touches the lock every ``HEARTBEAT_S``; a lock file deleted while the run lives is
    written again (unless another run took the folder meanwhile), so the lock is held for the
    whole run."""
    while not self._stop.wait(HEARTBEAT_S):
      try:
        os.utime(self.path)
      except FileNotFoundError:
        with contextlib.suppress(StorageError):  # a lost folder: the job's own writes say so
          self._create(self.path, self.holder, "--out", self.path.parent)
      except OSError:
        pass  # a lost folder is reported by the job's own writes

  def release(self) -> None:
    """Stops the heartbeat and removes the lock file if it is still this run's."""
    self._stop.set()
    found = holder_of(self.path.parent)
    if found is not None and found[0] == self.holder:
      try:
        self.path.unlink()
      except OSError:
        pass  # the folder is gone or read-only: nothing left to release


def _live(place: pathlib.Path, mine: set[str]) -> tuple[pathlib.Path, Holder] | None:
  """(``place``'s lock file, its holder) when a live run other than this one holds it."""
  lock = place / LOCK_NAME
  found = None if str(lock) in mine else holder_of(place)
  return (lock, found[0]) if found is not None and found[1] is None else None


def _live_lock_above(folder, mine: set[str]) -> tuple[pathlib.Path, Holder] | None:
  """The nearest live lock of ``folder`` or a folder above it (``_live``), or None."""
  here = pathlib.Path(os.path.realpath(folder))
  return next(filter(None, (_live(place, mine) for place in (here, *here.parents))), None)


def _live_lock_below(folder, mine: set[str]) -> tuple[pathlib.Path, Holder] | None:
  """A live lock of a folder under ``folder`` (``_live``; symbolic links not followed), or
  None."""
  top = os.path.realpath(folder)
  for place, _, files in os.walk(top):
    found = _live(pathlib.Path(place), mine) if LOCK_NAME in files and place != top else None
    if found is not None:
      return found
  return None


def refuse_if_held(flag: str, folder, own=(), fix: str | None = None) -> None:
  """Raises UsageError when a live run other than this one (whose lock files are ``own``) holds
  ``folder`` or a folder above it, or a folder under it (reads only: a fast check before the
  job imports jax, and again once this run holds its locks; ``None`` or a URL: nothing to
  check). ``fix``: the remedy named (default: choose another ``flag``)."""
  if not folder or "://" in folder:
    return
  mine = {os.path.realpath(path) for path in own}
  found = _live_lock_above(folder, mine)
  if found is not None:
    raise _in_use(flag, folder, found[1], found[0], fix)
  found = _live_lock_below(folder, mine)
  if found is not None:
    raise UsageError(f"{flag} {folder} holds the folder of another run ({found[1].describe()};"
                     f" lock {found[0]}): wait for it to end, or {_remedy(flag, fix)}")


def refuse_if_inside(what: str, folder, own=()) -> None:
  """Raises UsageError when a live run other than this one holds ``folder`` or a folder above
  it: ``what`` (e.g. where new run folders go) would be created in its folder."""
  found = _live_lock_above(folder, {os.path.realpath(path) for path in own})
  if found is not None:
    raise UsageError(f"{what} is in the folder of another run ({found[1].describe()}; lock"
                     f" {found[0]}): pass --out naming a folder outside it")
