"""``--profile-steps A:B``: a ``jax.profiler`` trace of training steps A to B.

The trace starts before step A is dispatched and stops once step B has run
on the device. ``jax.profiler`` writes it into the run folder as
``plugins/profile/<time>/<host>.xplane.pb`` (TensorBoard's profile plugin,
``tensorboard --logdir OUT``) and ``<host>.trace.json.gz`` (Perfetto,
ui.perfetto.dev). The steps traced run slower than the others (their
``step_time`` in the metrics includes the tracing).
"""

import pathlib

import jax

__all__ = ["ProfileWindow"]


class ProfileWindow:
  """Starts and stops the trace around the steps ``steps`` (first, last), if given."""

  def __init__(self, steps: tuple[int, int] | None, out: pathlib.Path, say):
    self._steps, self._out, self._say, self._active = steps, pathlib.Path(out), say, False

  def before(self, step: int) -> None:
    """Call before dispatching ``step`` (counted from 1)."""
    if self._steps and step == self._steps[0]:
      jax.profiler.start_trace(str(self._out), create_perfetto_trace=True)
      self._active = True

  def after(self, step: int, result) -> None:
    """Call after dispatching ``step``; ``result`` is its output."""
    if self._active and step >= self._steps[1]:
      jax.block_until_ready(result)
      self.stop(step)

  def stop(self, step: int) -> None:
    """Stops a trace still running (the run ended before the window did)."""
    if not self._active:
      return
    jax.profiler.stop_trace()
    self._active = False
    runs = sorted((self._out / "plugins" / "profile").iterdir())
    self._say(f"profile of steps {self._steps[0]}-{step}: {runs[-1]} (tensorboard --logdir"
              f" {self._out}, Profile tab; or its .trace.json.gz in ui.perfetto.dev)")
