"""Keeps the gloo library's connection lines off the job's standard output.

XLA:CPU's multi-process collectives use gloo, whose C++ code prints
``[Gloo] Rank N is connected to M peer ranks...`` to the process's standard
output (file descriptor 1) for every communicator it opens, from several
threads at once, so the pieces of its lines interleave (16 lines in a
2-process run); no environment variable or log level turns it off.
``python_only`` gives Python's ``sys.stdout`` a descriptor of its own and
points descriptor 1, which only native code still writes to, at /dev/null.
"""

import io
import os
import sys

__all__ = ["python_only"]


def python_only():
  """From now on only Python's own writes to ``sys.stdout`` reach stdout.

  Returns ``restore()``, which puts descriptor 1 and ``sys.stdout`` back.
  """
  previous = sys.stdout
  previous.flush()
  python_fd = os.dup(1)
  null = os.open(os.devnull, os.O_WRONLY)
  os.dup2(null, 1)
  os.close(null)
  sys.stdout = io.TextIOWrapper(io.FileIO(python_fd, "w", closefd=False),
                                encoding=previous.encoding, errors=previous.errors,
                                line_buffering=True, write_through=True)

  def restore() -> None:
    sys.stdout.flush()
    os.dup2(python_fd, 1)
    sys.stdout = previous
    os.close(python_fd)

  return restore
