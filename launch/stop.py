"""SIGTERM and SIGINT: the first asks the job to stop cleanly, a second stops it at once.

``StopRequest`` is installed before anything else the job does, so every
signal is answered: the job checks ``requested`` before it settles the run
folder and ``agreed()`` before each step (every process stops at the same
step). A second signal writes one line saying what it leaves behind, runs the
``on_abort`` actions (releasing the run folder's lock) and ends the process
with 128 + the signal number, without waiting for a save in flight.
jax is imported only by ``agreed``. jax's preemption service, which
``jax.distributed.initialize`` starts by default, installs a C++ SIGTERM
handler in place of this one: launch/processes.py turns it off before joining.
"""

import os
import signal

from launch import exit_report

__all__ = ["StopRequest"]

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_LEFT_UNFINISHED = ("a checkpoint being written is left unfinished (a *.orbax-checkpoint-tmp"
                    " folder, ignored and removed by the next run); the complete ones and the"
                    " metrics written so far are kept")


class StopRequest:
  """Remembers SIGTERM/SIGINT; ``agreed()`` is True on every process once any got one.

  ``signum``: this process's first signal; ``stopped_by``: the signal the processes agreed to
  stop on (another process's where this one got none), None until ``agreed()`` says so."""

  def __init__(self):
    self.signum = None
    self.stopped_by = None
    self._on_abort = []
    self._previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}

  @property
  def requested(self) -> bool:
    """Whether this process got a signal."""
    return self.signum is not None

  def on_abort(self, action) -> None:
    """Runs ``action()`` before a second signal ends the process, the last given first; a
    line an action returns says what it left, in place of the default (a save unfinished)."""
    self._on_abort.append(action)

  def _handle(self, signum, frame):
    if self.signum is None:
      self.signum = signum
      return
    notes = []
    for action in reversed(self._on_abort):
      try:
        notes.append(action())
      except Exception:  # noqa: BLE001  (nothing may keep the process from ending)
        pass
    left = "; ".join(note for note in notes if note) or _LEFT_UNFINISHED
    os.write(2, (f"error: stopped at once by a second signal ({signal.Signals(signum).name}) after"
                 f" {signal.Signals(self.signum).name}: {left}\n").encode())
    exit_report.send(128 + signum)
    os._exit(128 + signum)

  def agreed(self) -> bool:
    """Whether any process got a signal (a collective with several processes); sets
    ``stopped_by`` to the signal of the first process (by index) that got one."""
    import jax  # pylint: disable=import-outside-toplevel
    import numpy as np  # pylint: disable=import-outside-toplevel
    signals = np.array([self.signum or 0], np.int32)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
      signals = np.reshape(multihost_utils.process_allgather(signals), -1)
    got = [int(s) for s in signals if s]
    self.stopped_by = got[0] if got else None
    return bool(got)

  def restore(self) -> None:
    """Puts back the handlers found at construction."""
    for s, handler in self._previous.items():
      signal.signal(s, handler)
