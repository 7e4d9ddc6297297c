"""What the job tells its user: progress lines, metrics (JSON lines), a loss-curve PNG."""

import errno
import json
import math
import os
import pathlib
import sys

__all__ = ["Progress", "append_metrics", "plot_losses", "read_metrics", "truncate_metrics"]


def _strict(value):
  """Non-finite floats as None: the file stays strict JSON (no NaN, Infinity)."""
  return None if isinstance(value, float) and not math.isfinite(value) else value


def _line(record: dict) -> str:
  return json.dumps({k: _strict(v) for k, v in record.items()}, allow_nan=False) + "\n"


def append_metrics(path: pathlib.Path, record: dict) -> None:
  """Appends one JSON object as a line (a resumed run extends the same file);
  a non-finite number is written as null. The line goes to the kernel whole, in
  one write to a file opened for appending (nothing buffered here), so a crash
  leaves whole lines or at most a torn last one (set aside on resume)."""
  data = _line(record).encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    if os.write(fd, data) != len(data):  # the disk filled up within the line
      raise OSError(errno.ENOSPC, "only part of a line was written", str(path))
  finally:
    os.close(fd)


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


def _smoothed(values: list[float], weight: float = 0.9) -> list[float]:
  """Exponential moving average, debiased as TensorBoard's (NaN skipped)."""
  out, average, total = [], 0.0, 0.0
  for value in values:
    if math.isfinite(value):
      average, total = weight * average + (1 - weight) * value, weight * total + (1 - weight)
    out.append(average / total if total else math.nan)
  return out


def plot_losses(metrics_path: pathlib.Path, png_path: pathlib.Path, title: str = "") -> None:
  """Writes the run's curves to ``png_path``: the training loss raw and
  smoothed (EMA 0.9, about 10 steps) and the held-out loss on a log axis;
  below it the learning rate on its own linear axis; ``title`` above."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  records = read_metrics(metrics_path)
  steps = [r["step"] for r in records]
  losses = [math.nan if r["loss"] is None else r["loss"] for r in records]
  evals = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
  fig, (ax, lr_ax) = plt.subplots(2, 1, sharex=True, figsize=(7, 4.8), dpi=100,
                                  gridspec_kw={"height_ratios": (3, 1)})
  ax.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="train (raw)")
  ax.plot(steps, _smoothed(losses), color="tab:blue", label="train (smoothed)")
  if evals:
    ax.plot(*zip(*evals), "o-", color="tab:orange", markersize=4, label="held-out")
  ax.set_yscale("log")
  for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
    axis(matplotlib.ticker.FormatStrFormatter("%.3g"))
  ax.set_ylabel("loss (nats / byte)")
  ax.grid(alpha=0.3, which="both")
  ax.legend(loc="upper right", fontsize=8)
  lr_ax.plot(steps, [r.get("lr") for r in records], color="tab:green")
  lr_ax.set_ylabel("learning rate")
  lr_ax.set_xlabel("step")
  lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
  lr_ax.grid(alpha=0.3)
  fig.suptitle(title, fontsize=8)
  fig.tight_layout()
  fig.savefig(png_path)
  plt.close(fig)


def _number(value, spec: str, unit: str = "", scale: float = 1) -> str:
  return "-" if value is None else f"{value * scale:{spec}}{unit}"


class Progress:
  """One line per ``every`` steps (and at each held-out loss and the last
  step): step, loss, held-out loss, learning rate, gradient norm, tokens/s,
  step time and MFU."""

  def __init__(self, total_steps: int, every: int, stream=None, quiet: bool = False):
    """``stream``: default the current ``sys.stdout``."""
    self.total, self.every, self.stream, self.quiet = total_steps, every, stream, quiet

  def show(self, record: dict) -> None:
    step = record["step"]
    evaluated = record.get("eval_loss") is not None
    if self.quiet or (step % self.every and step != self.total and not evaluated):
      return
    width = 24
    done = int(width * step / self.total)
    bar = "#" * done + "." * (width - done)
    held_out = f"  eval {record['eval_loss']:7.4f}" if evaluated else ""
    mfu = record.get("mfu")
    print(f"[{bar}] step {step:>5}/{self.total}  loss {_number(record['loss'], '7.4f')}"
          f"{held_out}  lr {record['lr']:.2e}  |g| {_number(record.get('grad_norm'), '.3g')}"
          f"  {_number(record.get('tokens_per_s'), '9.0f')} tok/s"
          f"  {_number(record.get('step_time'), '.1f', ' ms/step', scale=1e3)}"
          f"  MFU {_number(None if mfu is None else 100 * mfu, '.2f', '%')}",
          file=self.stream or sys.stdout, flush=True)
