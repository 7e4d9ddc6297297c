"""What the job tells its user: progress lines, metrics (JSON lines), a loss-curve PNG."""

import json
import math
import os
import pathlib
import sys
import time

__all__ = ["Progress", "append_metrics", "plot_losses", "read_metrics", "truncate_metrics"]


def _strict(value):
  """Non-finite floats as None: the file stays strict JSON (no NaN, Infinity)."""
  return None if isinstance(value, float) and not math.isfinite(value) else value


def _line(record: dict) -> str:
  return json.dumps({k: _strict(v) for k, v in record.items()}, allow_nan=False) + "\n"


def append_metrics(path: pathlib.Path, record: dict) -> None:
  """Appends one JSON object as a line (a resumed run extends the same file);
  a non-finite number is written as null."""
  with open(path, "a") as f:
    f.write(_line(record))


def read_metrics(path: pathlib.Path) -> list[dict]:
  """Every record written so far; for a step logged twice (a run resumed from
  an earlier checkpoint) the later record wins."""
  by_step = {}
  for line in pathlib.Path(path).read_text().splitlines():
    record = json.loads(line)
    by_step[record["step"]] = record
  return [by_step[step] for step in sorted(by_step)]


def truncate_metrics(path: pathlib.Path, last_step: int) -> None:
  """Drops the records of steps after ``last_step`` (a run restored at it).

  Call it only once the restore has succeeded. The file is replaced
  atomically (written beside it, then renamed), so a crash leaves either the
  old or the new file; without records past ``last_step`` it is left alone.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return
  records = read_metrics(path)
  if all(r["step"] <= last_step for r in records):
    return
  partial = path.with_name(path.name + ".partial")
  partial.write_text("".join(_line(r) for r in records if r["step"] <= last_step))
  os.replace(partial, path)


def plot_losses(metrics_path: pathlib.Path, png_path: pathlib.Path) -> None:
  """Writes the loss curve of every step in ``metrics_path`` to ``png_path``."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = read_metrics(metrics_path)
  fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
  losses = [math.nan if r["loss"] is None else r["loss"] for r in records]
  ax.plot([r["step"] for r in records], losses)
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats / byte)")
  ax.set_title("training loss")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(png_path)
  plt.close(fig)


class Progress:
  """One line per ``every`` steps: step, loss, learning rate, tokens/s."""

  def __init__(self, total_steps: int, tokens_per_step: int, every: int,
               stream=sys.stdout, quiet: bool = False):
    self.total, self.tokens, self.every, self.stream, self.quiet = (
        total_steps, tokens_per_step, every, stream, quiet)
    self._t0, self._s0 = time.perf_counter(), None

  def tokens_per_s(self, step: int) -> float:
    """Throughput since the first reported step (compile time excluded)."""
    if self._s0 is None:
      self._s0, self._t0 = step, time.perf_counter()
      return 0.0
    elapsed = time.perf_counter() - self._t0
    return (step - self._s0) * self.tokens / max(elapsed, 1e-9)

  def show(self, step: int, loss: float, lr: float, tokens_per_s: float) -> None:
    if self.quiet or (step % self.every and step != self.total):
      return
    width = 24
    done = int(width * step / self.total)
    bar = "#" * done + "." * (width - done)
    print(f"[{bar}] step {step:>5}/{self.total}  loss {loss:7.4f}  lr {lr:.2e}"
          f"  {tokens_per_s:9.0f} tok/s", file=self.stream, flush=True)
