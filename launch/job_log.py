"""Library log lines (Orbax's absl warnings and errors, JAX's, checkpoints') go to a file in the
run folder, not the terminal: the job's own lines stay readable, and a failure ends in one
``error:`` line, not a page of background-thread tracebacks."""

import logging
import pathlib

__all__ = ["log_path", "to_file"]


def log_path(out, process_index: int) -> pathlib.Path:
  """``OUT/job.log`` (process 0), ``OUT/job.<i>.log`` (process i)."""
  return pathlib.Path(out) / ("job.log" if process_index == 0 else f"job.{process_index}.log")


def to_file(path: pathlib.Path):
  """Sends every record of the root logger (what Python's logging and absl print) to ``path``,
  appending; a record that cannot be written (a full disk) is dropped without a word. Returns
  the function that puts the previous handlers back (for a job run inside another program)."""
  handler = logging.FileHandler(path, delay=True)
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
  root = logging.getLogger()
  previous, raise_exceptions = list(root.handlers), logging.raiseExceptions
  for old in previous:
    root.removeHandler(old)
  root.addHandler(handler)
  logging.raiseExceptions = False  # logging's own errors (ENOSPC) would print tracebacks

  def restore() -> None:
    root.removeHandler(handler)
    try:
      handler.close()  # flushes: fails on a full disk, with nothing left to do about it
    except OSError:
      pass
    for old in previous:
      root.addHandler(old)
    logging.raiseExceptions = raise_exceptions
  return restore
