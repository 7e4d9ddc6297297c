"""The folders a run creates and holds: a new run folder's name and creation, and the
``Claim`` that removes them again.

What a run holds is a ``Claim``: its locks (launch/run_lock.py) and the
folders it created, removed again by one mechanism (``Claim.remove``) wherever
the run ends before it started. Nothing here imports jax.
"""

import contextlib
import os
import pathlib
import shutil
import time

from launch.errors import UsageError
from launch.path_checks import blocking_part
from launch.run_contents import RUNS

__all__ = ["Claim", "claim_new", "make_folders", "missing_folders", "new_name"]


def new_name(tag: str = "", now: float | None = None) -> pathlib.Path:
  """``runs/lm-<YYYYmmdd-HHMMSS>[-tag]`` for the time ``now`` (default: now)."""
  stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
  return RUNS / (f"lm-{stamp}-{tag}" if tag else f"lm-{stamp}")


def missing_folders(path: pathlib.Path) -> list[pathlib.Path]:
  """The folder ``path`` and those above it that do not exist (yet), outermost first."""
  return [p for p in (path, *path.parents) if not p.is_dir()][::-1]


def make_folders(path: pathlib.Path) -> list[str]:
  """Creates the folder ``path`` and the folders above it that are missing; those it created,
  outermost first (a folder another run creates meanwhile is that run's). Raises OSError."""
  created = []
  for folder in missing_folders(path):
    try:
      folder.mkdir()
      created.append(str(folder))
    except FileExistsError:
      if not folder.is_dir():
        raise
  return created


def claim_new(base: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
  """Creates ``base`` (or ``base-2``, ``base-3``, ... when taken): (it, the folders created,
  outermost first: ``runs`` too when it was missing).

  ``mkdir`` without ``exist_ok`` is atomic: of two runs started in the same
  second, each gets a folder of its own.
  """
  blocked = blocking_part(str(base.parent))
  if blocked is not None:
    raise UsageError(f"cannot create the run folder {base}: {blocked[0]} is {blocked[1]} (new run"
                     " folders go in it); move it away, or pass --out")
  try:
    created = make_folders(base.parent)
  except OSError as e:
    raise UsageError(f"cannot create the run folder {base} ({e.strerror}); pass --out") from None
  for n in range(1, 1000):
    path = base if n == 1 else base.with_name(f"{base.name}-{n}")
    try:
      path.mkdir()
      return path, [*created, str(path)]
    except FileExistsError:
      continue
    except OSError as e:
      _remove_folders(created)
      raise UsageError(f"cannot create the run folder {path} ({e.strerror}); pass --out") from None
  raise UsageError(f"{base}: 999 run folders of that name exist already; pass --out")


class Claim:
  """What a run holds of its folders: ``locks`` (``run_lock.RunLock``) and ``created``, the
  folders it created, outermost first. ``taken``: ``run_folder.take`` is done; ``settled``:
  ``run_folder.prepare`` is (the run starts); ``trained``: a step was trained (what the run
  wrote is kept); ``default``: (resumed?, note) where no --out or --checkpoint-dir was given."""

  def __init__(self):
    self.locks, self.created = [], []
    self.taken = self.settled = self.trained = self._aborted = False
    self.default = None

  def adopt(self, folder: str) -> None:
    """Counts ``folder`` as created by this run (another process of it may have made it),
    before the folders created inside it: ``created`` stays outermost first."""
    real = os.path.realpath(folder)
    reals = [os.path.realpath(f) for f in self.created]
    if real in reals:
      return
    inside = [i for i, r in enumerate(reals) if r.startswith(real.rstrip(os.sep) + os.sep)]
    self.created.insert(inside[0] if inside else len(self.created), folder)

  def remove(self, written: bool = False) -> list[str]:
    """Removes what this run created and releases its locks: each folder created, innermost
    first, when empty once its lock is released; with ``written``, also what this run wrote in
    the folders it created and locked (nobody else writes there). Returns the folders removed,
    innermost first. A lock refused, a failure before the run started and a signal before
    step 1 all end here: nothing created is left."""
    mine = {os.path.realpath(lock.path.parent): lock for lock in self.locks}
    removed = []
    for folder in reversed(self.created):
      lock = mine.pop(os.path.realpath(folder), None)
      if lock is not None:
        if written:
          _remove_contents(folder, keep=lock.path.name)
        lock.release()
      if _remove_folders([folder]):
        removed.append(folder)
    for lock in mine.values():
      lock.release()
    self.locks, self.created = [], [f for f in self.created if f not in removed]
    return removed

  def abort(self) -> str | None:
    """What a second signal leaves (``stop.StopRequest.on_abort``): before the run trained a
    step (``trained``, set by the job), what it created is removed, what it wrote there too,
    as a signal before step 1 removes it; the line saying so (None once a step was trained:
    the locks released, the rest kept). Done once."""
    if self._aborted:
      return None
    self._aborted = True
    if self.trained:
      self.end()
      return None
    removed = self.remove(written=True)
    return ("no step was trained; " + (f"removed the folders it created: {', '.join(removed)}"
                                       if removed else "it had created no folder"))

  def end(self) -> None:
    """At the end of the run: releases the locks; where the run never started (not
    ``settled``), removes the folders it created too. Done once; calling it again does
    nothing."""
    if self.settled:
      for lock in self.locks:
        lock.release()
      self.locks = []
    else:
      self.remove()


def _remove_contents(folder: str, keep: str) -> None:
  """Removes everything in ``folder`` but the entry ``keep``."""
  for entry in os.scandir(folder):
    if entry.name == keep:
      continue
    if entry.is_dir(follow_symlinks=False):
      shutil.rmtree(entry.path, ignore_errors=True)
    else:
      with contextlib.suppress(OSError):
        os.unlink(entry.path)


def _remove_folders(created: list[str]) -> list[str]:
  """Removes the folders ``created`` (outermost first) that are empty, innermost first; those
  removed (a folder another run wrote into is kept)."""
  removed = []
  for folder in reversed(created):
    try:
      os.rmdir(folder)
      removed.append(folder)
    except OSError:
      pass
  return removed
