"""Save/restore time of checkpoints.CheckpointManager (with checksums) vs plain Orbax, side by side.

8 simulated CPU devices, a (2,4) mesh, 8 float32 arrays of 4096x4096 (512 MiB,
random normal values, sharded P('a','b')). Saves, then restores, are
repeated in alternating order for plain Orbax (``ocp.CheckpointManager`` with
``args.StandardSave`` / ``args.StandardRestore``) and ``checkpoints.CheckpointManager``
on the same state: a save until final (``save`` + ``wait_until_finished``, both
async; ``os.sync()`` before each), the part of it that blocks the caller, and a restore onto the same
shardings (until the arrays are ready). Also times the checksums alone
(``integrity.checksums`` of the state). Reports medians over the repetitions
after one warm-up, and the ratio manager / plain Orbax. Writes
benchmarks/results/checkpoint_throughput.md.

Run: python benchmarks/checkpoint_throughput.py [--reps N] [--restore-reps M]
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import pathlib
import shutil
import tempfile
import time

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import orbax.checkpoint as ocp

import checkpoints as ck
from checkpoints import integrity
from checkpoints import layout

N_ARRAYS, SHAPE = 8, (4096, 4096)  # even sizes (odd lengths are slow on XLA:CPU)
OUT = pathlib.Path(__file__).resolve().parent / "results" / "checkpoint_throughput.md"
ROWS = ("save until final", "save, blocking part", "restore")


def _state(mesh):
  make = jax.jit(lambda key: jax.random.normal(key, SHAPE, np.float32), out_shardings=NamedSharding(mesh, P("a", "b")))
  return jax.block_until_ready({f"w{i}": make(jax.random.key(i)) for i in range(N_ARRAYS)})


def _clocks():
  return np.array([time.perf_counter(), time.process_time()])


def _timed(fn):
  """(wall seconds, CPU seconds of all this process's threads) of ``fn()``."""
  start = _clocks()
  fn()
  return tuple(_clocks() - start)


def _save_times(save, wait):
  os.sync()  # each save starts with no dirty pages left by the one before (writeback is charged to the writer)
  start = _clocks()
  save()
  blocked = _clocks() - start
  wait()
  return tuple(_clocks() - start), tuple(blocked)


class _Plain:
  """Plain Orbax: one StandardSave item per step, the newest kept."""

  def __init__(self, directory):
    self.mngr = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(max_to_keep=1))

  def save(self, step, state):
    return _save_times(lambda: self.mngr.save(step, args=ocp.args.StandardSave(state)), self.mngr.wait_until_finished)

  def restore(self, step, target):
    return _timed(lambda: jax.block_until_ready(self.mngr.restore(step, args=ocp.args.StandardRestore(target))))


class _Ours:
  """checkpoints.CheckpointManager (checksums written and verified), the newest kept."""

  def __init__(self, directory):
    self.mngr = ck.CheckpointManager(directory, ck.CheckpointPolicy(keep_last=1))

  def save(self, step, state):
    return _save_times(lambda: self.mngr.save(step, state), self.mngr.wait_until_finished)

  def restore(self, step, target):
    return _timed(lambda: jax.block_until_ready(self.mngr.restore(target, step).state))


def _interleaved(reps, run):
  """``run(name)`` for both managers, ``reps`` + 1 times in alternating order (the first is a warm-up).

  Returns {name: [result per repetition]} without the warm-up.
  """
  out = {"plain": [], "ours": []}
  for rep in range(reps + 1):
    for name in ("plain", "ours") if rep % 2 else ("ours", "plain"):
      result = run(rep, name)
      if rep:
        out[name].append(result)
    if rep:
      print(f"rep {rep}: " + ", ".join(f"{n} {np.round(v[-1], 3).tolist()}" for n, v in out.items()), flush=True)
  return out


def _table(times, gib, clock):
  """Rows of medians for one clock (0: wall, 1: CPU)."""
  lines = ["| operation | plain Orbax s | checkpoints s | ratio of medians | median of per-rep ratios | per-rep ratios |",
           "|---|---:|---:|---:|---:|---|"]
  for row in ROWS:
    plain = np.array([t[clock] for t in times[(row, "plain")]])
    ours = np.array([t[clock] for t in times[(row, "ours")]])
    reps = " ".join(f"{r:.2f}" for r in ours / plain)
    lines.append(f"| {row} | {np.median(plain):.3f} | {np.median(ours):.3f} | "
                 f"{np.median(ours) / np.median(plain):.3f} | {np.median(ours / plain):.3f} | {reps} |")
  return lines


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--reps", type=int, default=15, help="repetitions of the saves (~3 s each)")
  parser.add_argument("--restore-reps", type=int, default=25, help="repetitions of the restores (~1 s each)")
  args = parser.parse_args()
  reps, restore_reps = args.reps, args.restore_reps
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  state = _state(mesh)
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
  gib = sum(a.nbytes for a in state.values()) / 2**30
  load = os.getloadavg()[0]
  work = pathlib.Path(tempfile.mkdtemp(prefix="ckpt_bench_"))
  times = {}
  try:
    pair = {"plain": _Plain(work / "plain"), "ours": _Ours(work / "ours")}
    saves = _interleaved(reps, lambda rep, name: pair[name].save(rep, state))
    restores = _interleaved(restore_reps, lambda rep, name: pair[name].restore(reps, target))
    checksum_s = _interleaved(reps, lambda rep, name: _timed(lambda: integrity.checksums(layout.to_saveable(state))))
    checksum_s = checksum_s["plain"] + checksum_s["ours"]
    for name, manager in pair.items():
      times[("save until final", name)] = [final for final, _ in saves[name]]
      times[("save, blocking part", name)] = [blocked for _, blocked in saves[name]]
      times[("restore", name)] = restores[name]
      manager.mngr.close()
  finally:
    shutil.rmtree(work, ignore_errors=True)

  lines = [
      "# Checkpoint save/restore: checkpoints.CheckpointManager vs plain Orbax",
      "",
      (f"Command: `python benchmarks/checkpoint_throughput.py --reps {reps} --restore-reps {restore_reps}`. State: {N_ARRAYS} float32 arrays "
       f"{SHAPE} of random normal values, {gib:.2f} GiB, sharded P('a','b') on a (2,4) mesh of 8 simulated CPU "
       f"devices; local disk (page cache). {reps} interleaved repetitions of the saves, then {restore_reps} of the "
       f"restores (of the last step saved), each after one warm-up, alternating which manager goes first; medians. Load average when it started: {load:.1f} on {os.cpu_count()} cores."),
      "",
      "Wall-clock seconds:",
      "",
      *_table(times, gib, 0),
      "",
      ("CPU seconds of the process (all its threads, Orbax's and TensorStore's included; less disturbed by "
       "other jobs on the machine than wall time):"),
      "",
      *_table(times, gib, 1),
      "",
      (f"Checksums alone (every leaf's shards, as `save` computes them before writing and `restore` after "
       f"reading): median {np.median([t[0] for t in checksum_s]) * 1e3:.0f} ms wall, "
       f"{np.median([t[1] for t in checksum_s]) * 1e3:.0f} ms CPU for {gib:.2f} GiB."),
      "",
      ("Plain Orbax: `ocp.CheckpointManager` with `args.StandardSave` / `args.StandardRestore`, async, newest "
       "step kept. checkpoints: `CheckpointManager(policy=CheckpointPolicy(keep_last=1))`, async, which also "
       "writes the layout/checksum record and the metadata item and checks every leaf's checksum on restore. "
       "The CPU cores and the disk are shared with other jobs: single repetitions vary by tens of percent, "
       "which is why the two are interleaved and the per-repetition ratios are listed."),
      "",
  ]
  OUT.write_text("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
