"""How a process started by ``launch.local_multihost`` tells the launcher its exit code
before it ends, so the launcher names the process whose failure came first.

When one process of a multi-process job fails, the others fail because of it: their
collective loses its peer once the failed process's sockets close, that is as it exits.
They may be reaped first, so the order of exits does not say which process failed first.
Each process writes ``PID CODE`` to one pipe all of them share (``ENV`` names its file
descriptor and the pipe's inode) before it exits; writes of a line are atomic, so the lines
lie in the pipe in the order the processes decided to fail, and a failure caused by a
process's exit comes after that process's own line.

The variable reaches the processes' own children too, which do not inherit the descriptor:
there its number may be another file of theirs, so ``send`` writes only to the very pipe the
variable names.
"""

import contextlib
import os
import stat

__all__ = ["ENV", "read", "send", "variable"]

ENV = "SHARDOPT_EXIT_REPORT_FD"  # "FD:INODE": the write end of the launcher's pipe


def variable(write_end: int) -> str:
  """``ENV``'s value naming the pipe whose write end is ``write_end``."""
  return f"{write_end}:{os.fstat(write_end).st_ino}"


def _named_pipe(value: str) -> int | None:
  """The descriptor ``value`` names when it is open on the pipe ``value`` names, else None."""
  fd, _, inode = value.partition(":")
  with contextlib.suppress(OSError, ValueError):
    found = os.fstat(int(fd))
    if stat.S_ISFIFO(found.st_mode) and found.st_ino == int(inode):
      return int(fd)
  return None


def send(code: int) -> None:
  """Tells the launcher, if one started this process, that it is about to exit with ``code``
  (nothing for 0: a process's exit 0 is seen as it happens)."""
  value = os.environ.get(ENV)
  fd = None if code == 0 or value is None else _named_pipe(value)
  if fd is None:
    return
  with contextlib.suppress(OSError):  # the launcher is gone
    os.write(fd, f"{os.getpid()} {code}\n".encode())


def _parsed(line: str) -> tuple[int, int] | None:
  """(pid, code) of a report line, or None for any other text."""
  words = line.split()
  if len(words) != 2 or not all(w.lstrip("-").isdigit() for w in words):
    return None
  return int(words[0]), int(words[1])


def read(read_end: int, index_of_pid: dict[int, int], put) -> None:
  """Calls ``put((index, code))`` for each process's line in the pipe, in order, until every
  write end is closed; lines of other processes, or not of ``send``'s form, are passed over."""
  with os.fdopen(read_end, errors="replace") as reports:
    for line in reports:
      report = _parsed(line)
      if report is not None and report[0] in index_of_pid:
        put((index_of_pid[report[0]], report[1]))
