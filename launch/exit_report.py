"""How a process started by ``launch.local_multihost`` tells the launcher its exit code
before it ends, so the launcher names the process whose failure came first.

When one process of a multi-process job fails, the others fail because of it: their
collective loses its peer once the failed process's sockets close, that is as it exits.
They may be reaped first, so the order of exits does not say which process failed first.
Each process writes ``PID CODE`` to one pipe all of them share (``ENV`` names its file
descriptor) before it exits; writes of a line are atomic, so the lines lie in the pipe in
the order the processes decided to fail, and a failure caused by a process's exit comes
after that process's own line.
"""

import contextlib
import os

__all__ = ["ENV", "read", "send"]

ENV = "SHARDOPT_EXIT_REPORT_FD"  # the write end of the launcher's pipe, in every process


def send(code: int) -> None:
  """Tells the launcher, if one started this process, that it is about to exit with ``code``
  (nothing for 0: a process's exit 0 is seen as it happens)."""
  fd = os.environ.get(ENV)
  if code == 0 or fd is None:
    return
  with contextlib.suppress(OSError, ValueError):  # a launcher gone, or no such descriptor
    os.write(int(fd), f"{os.getpid()} {code}\n".encode())


def read(read_end: int, index_of_pid: dict[int, int], put) -> None:
  """Calls ``put((index, code))`` for each process's line in the pipe, in order, until every
  write end is closed."""
  with os.fdopen(read_end) as reports:
    for line in reports:
      pid, code = map(int, line.split())
      if pid in index_of_pid:
        put((index_of_pid[pid], code))
