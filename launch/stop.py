"""SIGTERM and SIGINT: the first asks the job to stop cleanly, a second stops it at once.

``StopRequest`` is installed before anything else the job does, so every
signal is answered: the job checks ``requested`` before it settles the run
folder and ``agreed()`` before each step (every process stops at the same
step). A second signal writes one line saying what it leaves behind, runs the
``on_abort`` actions (releasing the run folder's lock) and ends the process
with 128 + the signal number, without waiting for a save in flight.
jax is imported only by ``agreed`` with several processes.
"""

import os
import signal

__all__ = ["StopRequest"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
  """Remembers SIGTERM/SIGINT; ``agreed()`` is True on every process once any got one."""

  def __init__(self):
    self.signum = None
    self._on_abort = []
    self._previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}

  @property
  def requested(self) -> bool:
    """Whether this process got a signal."""
    return self.signum is not None

  def on_abort(self, action) -> None:
    """Runs ``action()`` before a second signal ends the process."""
    self._on_abort.append(action)

  def _handle(self, signum, frame):
    if self.signum is None:
      self.signum = signum
      return
    os.write(2, (f"error: stopped at once by a second signal ({signal.Signals(signum).name}) after"
                 f" {signal.Signals(self.signum).name}: a checkpoint being written is left"
                 " unfinished (a *.orbax-checkpoint-tmp folder, ignored and removed by the next"
                 " run); the complete ones and the metrics written so far are kept\n").encode())
    for action in reversed(self._on_abort):
      try:
        action()
      except Exception:  # noqa: BLE001  (nothing may keep the process from ending)
        pass
    os._exit(128 + signum)

  def agreed(self) -> bool:
    """Whether any process got a signal (a collective with several processes)."""
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    mine = np.array(self.requested)
    if jax.process_count() == 1:
      return bool(mine)
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    return bool(np.any(multihost_utils.process_allgather(mine)))

  def restore(self) -> None:
    """Puts back the handlers found at construction."""
    for s, handler in self._previous.items():
      signal.signal(s, handler)
