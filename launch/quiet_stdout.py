"""Keeps the gloo library's connection lines off the job's standard output.

XLA:CPU's multi-process collectives use gloo, whose C++ code writes
``[Gloo] Rank N is connected to M peer ranks...`` to file descriptor 1 for
every communicator it opens (16 lines in a 2-process run); no environment
variable or log level turns it off. ``drop_lines`` routes descriptor 1
through a pipe and a thread that copies every other line to the real output.
"""

import os
import sys
import threading

__all__ = ["GLOO_PREFIX", "drop_lines"]

GLOO_PREFIX = b"[Gloo] Rank "


def _copy_lines(source: int, target: int, prefix: bytes) -> None:
  with os.fdopen(source, "rb") as lines:
    for line in lines:
      if not line.startswith(prefix):
        os.write(target, line)


def drop_lines(prefix: bytes = GLOO_PREFIX):
  """From now on, lines written to fd 1 that start with ``prefix`` are dropped.

  Returns ``restore()``, which puts the original fd 1 back after copying
  everything written so far.
  """
  sys.stdout.flush()
  original = os.dup(1)
  source, sink = os.pipe()
  os.dup2(sink, 1)
  os.close(sink)
  copier = threading.Thread(target=_copy_lines, args=(source, original, prefix), daemon=True)
  copier.start()

  def restore() -> None:
    sys.stdout.flush()
    os.dup2(original, 1)  # closes the pipe's last writer: the copier reaches its end
    copier.join(timeout=10)
    os.close(original)

  return restore
