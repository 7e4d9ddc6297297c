"""``--profile-steps A:B``: a ``jax.profiler`` trace of training steps A to B.

The trace starts before the first step of the window this invocation trains
is dispatched (step A, or the first step of a resume that starts inside the
window) and stops once step B (or the last step trained) has run on the
device. A window that holds no step this invocation trains (a resume that
starts after it, or a run that ends before it) gets a one-line warning.
``jax.profiler`` writes the trace into the run folder as
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
    self._steps, self._out, self._say = steps, pathlib.Path(out), say
    self._waiting = steps is not None  # neither traced nor warned about yet
    self._active, self._first = False, None  # the trace runs, from step ``_first``

  def before(self, step: int) -> None:
    """Call before dispatching ``step`` (counted from 1)."""
    if self._waiting and step > self._steps[1]:
      self._missed(f"this invocation starts at step {step}, after the window")
    elif self._waiting and step >= self._steps[0]:
      jax.profiler.start_trace(str(self._out), create_perfetto_trace=True)
      self._waiting, self._active, self._first = False, True, step

  def after(self, step: int, result) -> None:
    """Call after dispatching ``step``; ``result`` is its output."""
    if self._active and step >= self._steps[1]:
      jax.block_until_ready(result)
      self.stop(step)

  def stop(self, step: int) -> None:
    """Stops a trace still running (the run ended before the window did), or warns that the
    window held no step of this invocation, which ended at ``step``."""
    if self._waiting:
      self._missed(f"this invocation ended at step {step} and trained no step of the window")
    if not self._active:
      return
    jax.profiler.stop_trace()
    self._active = False
    runs = sorted((self._out / "plugins" / "profile").iterdir())
    self._say(f"profile of steps {self._first}-{step}: {runs[-1]} (tensorboard --logdir"
              f" {self._out}, Profile tab; or its .trace.json.gz in ui.perfetto.dev)")

  def _missed(self, where: str) -> None:
    first, last = self._steps
    self._say(f"warning: --profile-steps {first}:{last}: {where}: no trace")
    self._waiting = False
