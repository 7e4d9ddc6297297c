"""The job's metrics: one record per step, to metrics.jsonl, TensorBoard and
the progress line.

Each step's statistics (loss and norms, ``steps.STATS``) stay on the device
until the next logging point, where ``fetch`` gets all of them with one host
sync and closes the timing window (``throughput.Window``). Every record
holds ``step``, ``loss``, ``lr``, ``grad_norm``, ``update_norm``,
``param_norm``, the window's ``step_time`` (seconds), ``tokens_per_s`` and
``mfu`` (a fraction of the peak, null when the peak is unknown), ``time``,
and ``eval_loss`` at the steps where the held-out loss was computed.
"""

import time

import jax

from launch import report
from launch import steps
from launch import tensorboard

__all__ = ["MetricsLog", "TENSORBOARD_TAGS"]

# metrics.jsonl field -> TensorBoard tag
TENSORBOARD_TAGS = {
    "loss": "train/loss", "eval_loss": "eval/loss", "lr": "train/lr",
    "grad_norm": "train/grad_norm", "update_norm": "train/update_norm",
    "param_norm": "train/param_norm", "step_time": "perf/step_time_s",
    "tokens_per_s": "perf/tokens_per_s", "mfu": "perf/mfu",
}


class MetricsLog:
  """Turns fetched step statistics into records and writes them (process 0)."""

  def __init__(self, out, schedule, tokens_per_step: int, flops_per_step, peak, progress,
               guard, start: int, is_main: bool):
    """``start``: the step the run continues from (0 when fresh)."""
    self.path = out / "metrics.jsonl"
    self._schedule, self._tokens, self._progress, self._guard = (
        schedule, tokens_per_step, progress, guard)
    self._flops = flops_per_step
    self._peak = peak.flops_per_s
    self._is_main = is_main
    self._guard_extra = {}  # step -> what the guard fetched with it
    self._out, self._start = out, start
    self._events = None  # opened with the first record: a run stopped before it writes none

  def fetch(self, pending: list, window, last_step: int) -> list[dict]:
    """The records of the ``pending`` steps (``(step, stats, *guard_extra)``,
    fetched with one host sync), timed by ``window`` up to ``last_step``."""
    if not pending:
      return []
    fetched = jax.device_get([entry[1:] for entry in pending])
    count, seconds = window.stop(last_step)
    step_time = seconds / count if count else None
    speed = self._tokens / step_time if step_time else None
    mfu = (self._flops / step_time / self._peak
           if step_time and self._flops and self._peak else None)
    records = []
    for (step, *_), (stats, *extra) in zip(pending, fetched):
      stats = {name: float(stats[name]) for name in steps.STATS}
      records.append({"step": step, **stats, "lr": float(self._schedule(step - 1)),
                      "step_time": step_time, "tokens_per_s": speed, "mfu": mfu,
                      "time": time.time()})
      self._guard_extra[step] = extra
    pending.clear()
    return records

  def write(self, records: list[dict]) -> None:
    """Appends ``records`` to metrics.jsonl and TensorBoard and shows the
    progress line; a non-finite loss stops the job at its step, after the
    records before it are written (``guard``)."""
    try:
      for record in records:
        extra = self._guard_extra.pop(record["step"])
        record.update(self._guard.fields(record["step"], record["loss"], extra))
        if self._is_main:
          report.append_metrics(self.path, record)
          if self._events is None:  # its first event drops later points of earlier files
            self._events = tensorboard.EventWriter(self._out, self._start + 1)
          self._events.scalars(record["step"], {tag: record.get(field) for field, tag
                                                in TENSORBOARD_TAGS.items()}, record["time"])
        self._progress.show(record)
    finally:
      if self._events is not None:
        self._events.flush()

  def close(self) -> None:
    if self._events is not None:
      self._events.close()
