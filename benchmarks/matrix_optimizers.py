"""Optimizers on the LM demo: a learning-rate sweep, final loss and time per step.

Each optimizer (muon, shampoo, soap from ``shardopt.contrib``; adamw,
adafactor, sgd, lion) runs ``python -m launch.train`` with its defaults apart
from a 3-value learning-rate sweep, all with the same steps, seed, model and
batches (the demo's defaults: 2 layers, d_model 64, batch 32 x 64 bytes, mesh
data=4 x model=2 of 8 simulated CPU devices, warmup-cosine schedule, clipping
at 1.0). From each run's metrics.jsonl it reports the final loss, the mean
loss of the last 10 steps (the ranking), the held-out loss at the last step,
and the median of the job's step time after the first 10 steps. The runs go
one after another, cycling through the optimizers per learning-rate rank, so
slow phases of a shared machine spread over all of them; the load average
at the start and at the last run is written beside the numbers, and the file
is rewritten after every run. Then each optimizer runs once more with no
--lr: the job's default learning rate (launch/defaults.py, taken from this
sweep), against the sweep's best.

Run from the repository root:  python -m benchmarks.matrix_optimizers [--steps N] [--keep]
Writes benchmarks/results/matrix_optimizers.md; with --keep, the sweep's runs
already in that file (same steps and seed) are taken from it, not run again.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from launch import defaults

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "matrix_optimizers.md"
# The job fetches losses every --log-every steps; with more steps in flight a
# loaded 2-core machine overran XLA:CPU's 40 s collective rendezvous (abort).
LOG_EVERY = 10

# optimizer -> learning rates. A first sweep one step of 3x lower
# (adamw, shampoo, soap 1e-3..1e-2; muon 3e-3..3e-2) found every optimizer
# best at its highest rate, so the sweep was moved up by one step.
# Shampoo and SOAP at their default block_size (64): on this model d_model
# (64), the heads and the head dimension are whole blocks, the 256-long
# vocabulary and mlp dimensions 4 blocks of 64.
# With blocks fixed by block_size (64), soap was best at its highest rate,
# 0.03, so 0.1 was added.
# adafactor, sgd and lion were added later (launch/defaults.py takes every best),
# with 4 rates: their first runs lost most to the others at the lower rates;
# adafactor was best at its highest, 0.1, so 0.3 and 1.0 were added.
SWEEPS = {
    "muon": (1e-2, 3e-2, 1e-1),
    "adafactor": (3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
    "sgd": (0.1, 0.3, 1.0, 3.0),
    "lion": (3e-4, 1e-3, 3e-3, 1e-2),
    "adamw": (3e-3, 1e-2, 3e-2),
    "soap": (3e-3, 1e-2, 3e-2, 1e-1),
    "shampoo": (3e-3, 1e-2, 3e-2),
}


def _run(optimizer: str, lr: float | None, steps: int, seed: int, out: pathlib.Path) -> dict:
  """One run; ``lr`` None: the job's default for ``optimizer``."""
  cmd = [sys.executable, "-m", "launch.train", "--optimizer", optimizer,
         *([] if lr is None else ["--lr", str(lr)]), "--steps", str(steps), "--seed", str(seed),
         "--out", str(out), "--checkpoint-every", "0", "--log-every", str(LOG_EVERY)]
  done = subprocess.run(cmd, check=False, capture_output=True, text=True)
  if done.returncode:
    lines = (done.stderr or done.stdout).strip().splitlines()
    fatal = [l for l in lines if "Error" in l or l.startswith("F")] or lines
    return {"error": f"exit {done.returncode}: {fatal[-1][:200]}"}
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  return {"final": rows[-1]["loss"],
          "last10": statistics.fmean(r["loss"] for r in rows[-10:]),
          "held_out": rows[-1].get("eval_loss"),
          "ms_per_step": 1e3 * statistics.median(r["step_time"] for r in rows
                                                 if r["step"] > LOG_EVERY)}


def _kept(steps: int, seed: int) -> dict:
  """The sweep rows of the results file, if it was written with ``steps`` and ``seed``."""
  text = RESULTS.read_text() if RESULTS.exists() else ""
  if not any(f"{steps} steps each, seed {seed}{end}" in text for end in ",;") or (
      "## Every run" not in text):
    return {}
  rows = text.split("## Every run", 1)[1].split("\n## ", 1)[0]
  kept = {}
  for line in rows.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if len(cells) == 6 and cells[0] in SWEEPS and not cells[2].startswith("failed"):
      held_out = None if cells[4] == "-" else float(cells[4])
      kept[(cells[0], float(cells[1]))] = {"final": float(cells[2]), "last10": float(cells[3]),
                                           "held_out": held_out, "ms_per_step": float(cells[5])}
  return kept


def _held_out(r: dict) -> str:
  return "-" if r.get("held_out") is None else f"{r['held_out']:.4f}"


def _table(results: dict) -> list[str]:
  lines = ["| optimizer | lr | final loss | mean loss, last 10 steps | held-out loss |"
           " ms / step (median) |", "|---|---|---|---|---|---|"]
  for (optimizer, lr), r in results.items():
    if "error" in r:
      lines.append(f"| {optimizer} | {lr:g} | failed: {r['error']} | | | |")
    else:
      lines.append(f"| {optimizer} | {lr:g} | {r['final']:.4f} | {r['last10']:.4f} |"
                   f" {_held_out(r)} | {r['ms_per_step']:.1f} |")
  return lines


def _bests(results: dict) -> dict:
  """optimizer -> (best lr, its result), by the mean loss of the last 10 steps."""
  bests = {}
  for optimizer in SWEEPS:
    runs = [(lr, r) for (o, lr), r in results.items() if o == optimizer and "error" not in r]
    if runs:
      bests[optimizer] = min(runs, key=lambda x: x[1]["last10"])
  return bests


def _best(results: dict) -> list[str]:
  lines = ["| optimizer | best lr | mean loss, last 10 steps | held-out loss | ms / step |",
           "|---|---|---|---|---|"]
  ranked = sorted((r["last10"], optimizer, lr, r) for optimizer, (lr, r)
                  in _bests(results).items())
  for loss, optimizer, lr, r in ranked:
    edge = " (edge of the sweep)" if lr in (min(SWEEPS[optimizer]), max(SWEEPS[optimizer])) else ""
    lines.append(f"| {optimizer} | {lr:g}{edge} | {loss:.4f} | {_held_out(r)} |"
                 f" {r['ms_per_step']:.1f} |")
  if ranked:
    best, winner = ranked[0][:2]
    lines += ["", f"Lowest loss at this scale: {winner} ({best:.4f}); the others' best, relative:"
              + ";".join(f" {o} {100 * (l / best - 1):+.1f}%" for l, o, *_ in ranked[1:])
              + ". One seed, a 0.13M-parameter model: no claim beyond this scale."]
  return lines


def _defaults(results: dict, runs: dict) -> list[str]:
  lines = ["| optimizer | default lr (launch/defaults.py) | mean loss, last 10 steps |"
           " sweep's best | relative |", "|---|---|---|---|---|"]
  bests = _bests(results)
  for optimizer, r in runs.items():
    if "error" in r or optimizer not in bests:
      lines.append(f"| {optimizer} | {defaults.learning_rate(optimizer):g} |"
                   f" {r.get('error', '-')} | | |")
      continue
    best = bests[optimizer][1]["last10"]
    lines.append(f"| {optimizer} | {defaults.learning_rate(optimizer):g} | {r['last10']:.4f} |"
                 f" {best:.4f} | {100 * (r['last10'] / best - 1) + 0.0:+.2f}% |")
  return lines


def _write(args, results: dict, default_runs: dict, planned: int, started: float,
           load_before, kept: int) -> str:
  """The results file as it stands (rewritten after every run)."""
  results = dict(sorted(results.items(), key=lambda kv: list(SWEEPS).index(kv[0][0])))
  command = "python -m benchmarks.matrix_optimizers" + (
      f" --steps {args.steps}" if args.steps != 200 else "") + (
      f" --seed {args.seed}" if args.seed else "") + (" --keep" if args.keep else "")
  done = len(results) + len(default_runs)
  partial = "" if done == planned else f" Partial: {done} of {planned} runs so far."
  text = [
      "# Optimizers on the LM demo",
      "",
      (f"Command: `{command}` (repository root; {done} runs of"
       f" `python -m launch.train`, {args.steps} steps each, seed {args.seed};"
       + (f" {kept} of them taken from the file by --keep, as earlier invocations wrote"
          " them, with the code of their time (the default-lr runs below are all from"
          " this invocation);" if kept else "")
       + f" {(time.time() - started) / 60:.1f} min for the runs of this invocation).{partial}"),
      "",
      ("Same model, batches (from the training slice of the corpus), schedule"
       " (warmup-cosine to 0.1 x lr) and clipping for all; each optimizer otherwise at its"
       " defaults. Losses are next-byte cross-entropy (nats); the ranking is by the mean"
       " training loss of the last 10 steps; the held-out loss is the job's at the last"
       " step (8 batches of the held-out slice, never trained on). Time per step is the"
       " median of the job's step time after step 10 (compilation excluded), 8 simulated"
       " devices on a 2-core CPU."),
      "",
      (f"Machine load (1-minute load average) at the start: {load_before[0]:.1f}, at the"
       f" last run: {os.getloadavg()[0]:.1f} on 2 cores: other engineers' processes shared"
       " the CPU, so the times are noisy (compare them only within this file, roughly)."),
      "",
      ("Shampoo and SOAP run with their default block_size (64): on this model"
       " d_model (64), the heads and the head dimension are whole blocks, the"
       " 256-long vocabulary and mlp dimensions 4 blocks of 64"
       " (`shardopt.contrib.block_layout` states them)."),
      "",
      "## Every run", "", *_table(results), "",
      "## Best learning rate of each (lowest mean loss over the last 10 steps)", "",
      *_best(results), "",
      "## The job's default learning rate (no --lr) against the sweep's best", "",
      *_defaults(results, default_runs), "",
  ]
  RESULTS.write_text("\n".join(text))
  return "\n".join(text)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--keep", action="store_true",
                      help="take the sweep's runs already in the results file from it")
  args = parser.parse_args(argv)
  load_before, started = os.getloadavg(), time.time()
  results = _kept(args.steps, args.seed) if args.keep else {}
  default_runs = {}
  planned = sum(len(rates) for rates in SWEEPS.values()) + len(SWEEPS)
  kept = len(results)
  write = lambda: _write(args, results, default_runs, planned, started, load_before, kept)
  with tempfile.TemporaryDirectory() as tmp:
    for rank in range(max(len(rates) for rates in SWEEPS.values())):
      for optimizer, rates in SWEEPS.items():
        if rank < len(rates) and (optimizer, rates[rank]) not in results:
          lr = rates[rank]
          out = pathlib.Path(tmp) / f"{optimizer}-{lr:g}"
          results[(optimizer, lr)] = _run(optimizer, lr, args.steps, args.seed, out)
          print(optimizer, lr, results[(optimizer, lr)], flush=True)
          write()
    for optimizer in SWEEPS:
      out = pathlib.Path(tmp) / f"{optimizer}-default"
      default_runs[optimizer] = _run(optimizer, None, args.steps, args.seed, out)
      print(optimizer, "default", default_runs[optimizer], flush=True)
      write()
  print(write())


if __name__ == "__main__":
  main()
