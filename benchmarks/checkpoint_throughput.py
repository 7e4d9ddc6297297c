"""Save/restore time of checkpoints.CheckpointManager (with checksums) vs plain Orbax, side by side.

8 simulated CPU devices, a (2,4) mesh, 8 float32 arrays of 4096x4096 (512 MiB,
random normal values, sharded P('a','b')). Four managers on the same state,
in rotating order: plain Orbax (``ocp.CheckpointManager`` with
``args.StandardSave`` / ``args.StandardRestore``) with its default zstd
compression and without it, and ``checkpoints.CheckpointManager`` with its
default (uncompressed) and with ``compress=True``. Timed: a save until final
(``save`` + ``wait_until_finished``, both async; ``os.sync()`` before each),
the part of it that blocks the caller, and a restore onto the same shardings
(until the arrays are ready); also the checksums alone
(``integrity.checksums`` of the state) and the bytes on disk. Reports medians
over the repetitions after one warm-up, and ratios to plain Orbax. Writes
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
NAMES = {  # manager: what it is
    "plain": "plain Orbax, default (zstd)",
    "plain-raw": "plain Orbax, use_compression=False",
    "ours": "checkpoints, default (uncompressed)",
    "ours-zstd": "checkpoints, compress=True",
}
COMPARISONS = (  # (manager, baseline, why)
    ("ours", "plain", "the default against plain Orbax's default"),
    ("ours-zstd", "plain", "the same storage (zstd): what the checksums and record cost"),
    ("ours", "plain-raw", "the same storage (uncompressed): what the checksums and record cost"),
)


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
  """Plain Orbax, the newest step kept: StandardSave/StandardRestore (zstd, Orbax's default), or
  without compression PyTreeSave/PyTreeRestore of a PyTreeCheckpointHandler(use_compression=False)
  (StandardCheckpointHandler has no such option)."""

  def __init__(self, directory, compress):
    options = ocp.CheckpointManagerOptions(max_to_keep=1)
    handler = None if compress else ocp.PyTreeCheckpointHandler(use_compression=False)
    self.mngr = ocp.CheckpointManager(directory, options=options, item_handlers=handler)
    self.compress = compress

  def save(self, step, state):
    args = ocp.args.StandardSave(state) if self.compress else ocp.args.PyTreeSave(state)
    return _save_times(lambda: self.mngr.save(step, args=args), self.mngr.wait_until_finished)

  def restore(self, step, target):
    args = (ocp.args.StandardRestore(target) if self.compress else ocp.args.PyTreeRestore(
        target, restore_args=ocp.checkpoint_utils.construct_restore_args(target)))
    return _timed(lambda: jax.block_until_ready(self.mngr.restore(step, args=args)))


class _Ours:
  """checkpoints.CheckpointManager (checksums written and verified), the newest kept."""

  def __init__(self, directory, compress):
    self.mngr = ck.CheckpointManager(directory, ck.CheckpointPolicy(keep_last=1, compress=compress))

  def save(self, step, state):
    return _save_times(lambda: self.mngr.save(step, state), self.mngr.wait_until_finished)

  def restore(self, step, target):
    return _timed(lambda: jax.block_until_ready(self.mngr.restore(target, step).state))


def _interleaved(reps, run):
  """``run(rep, name)`` for every manager, ``reps`` + 1 times, the order rotating each time (the
  first repetition is a warm-up). Returns {name: [result per repetition]} without the warm-up."""
  names = list(NAMES)
  out = {name: [] for name in names}
  for rep in range(reps + 1):
    for name in names[rep % len(names):] + names[:rep % len(names)]:
      result = run(rep, name)
      if rep:
        out[name].append(result)
    if rep:
      print(f"rep {rep}: " + ", ".join(f"{n} {np.round(v[-1], 3).tolist()}" for n, v in out.items()), flush=True)
  return out


def _medians(times, clock):
  """Rows of medians per manager for one clock (0: wall, 1: CPU)."""
  lines = ["| operation | " + " | ".join(f"{NAMES[n]} s" for n in NAMES) + " |",
           "|---|" + "---:|" * len(NAMES)]
  for row in ROWS:
    lines.append(f"| {row} | " + " | ".join(f"{np.median([t[clock] for t in times[(row, n)]]):.3f}"
                                           for n in NAMES) + " |")
  return lines


def _ratios(times, clock):
  """Rows of ratios (of medians, and per repetition) for each comparison, one clock."""
  lines = ["| operation | comparison | ratio of medians | median of per-rep ratios | per-rep ratios |",
           "|---|---|---:|---:|---|"]
  for row in ROWS:
    for ours, base, why in COMPARISONS:
      a = np.array([t[clock] for t in times[(row, ours)]])
      b = np.array([t[clock] for t in times[(row, base)]])
      reps = " ".join(f"{r:.2f}" for r in a / b)
      lines.append(f"| {row} | {NAMES[ours]} / {NAMES[base]} ({why}) | {np.median(a) / np.median(b):.3f} | "
                   f"{np.median(a / b):.3f} | {reps} |")
  return lines


def _bytes(directory: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--reps", type=int, default=11, help="repetitions of the saves (~1-3 s each)")
  parser.add_argument("--restore-reps", type=int, default=21, help="repetitions of the restores (~0.2-1 s each)")
  args = parser.parse_args()
  reps, restore_reps = args.reps, args.restore_reps
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  state = _state(mesh)
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
  gib = sum(a.nbytes for a in state.values()) / 2**30
  load = os.getloadavg()[0]
  work = pathlib.Path(tempfile.mkdtemp(prefix="ckpt_bench_"))
  times, sizes = {}, {}
  try:
    pair = {"plain": _Plain(work / "plain", True), "plain-raw": _Plain(work / "plain-raw", False),
            "ours": _Ours(work / "ours", False), "ours-zstd": _Ours(work / "ours-zstd", True)}
    saves = _interleaved(reps, lambda rep, name: pair[name].save(rep, state))
    sizes = {name: _bytes(work / name / str(reps)) for name in pair}
    restores = _interleaved(restore_reps, lambda rep, name: pair[name].restore(reps, target))
    saveable = layout.to_saveable(state)
    checksum_s = [_timed(lambda: integrity.checksums(saveable, 1)) for _ in range(reps)]
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
      (f"Command: `python benchmarks/checkpoint_throughput.py --reps {reps} --restore-reps {restore_reps}`. "
       f"State: {N_ARRAYS} float32 arrays {SHAPE} of random normal values, {gib:.2f} GiB, sharded P('a','b') "
       f"on a (2,4) mesh of 8 simulated CPU devices; local disk (page cache). {reps} repetitions of the saves, "
       f"then {restore_reps} of the restores (of the last step saved), each after one warm-up, the order of "
       f"the four managers rotating; medians. Load average when it started: {load:.1f} on {os.cpu_count()} "
       "cores."),
      "",
      "Bytes on disk of one step: " + ", ".join(
          f"{NAMES[n]} {sizes[n] / 2**20:.1f} MiB ({sizes[n] / sizes['plain']:.3f}x)" for n in NAMES) + ".",
      "",
      "Wall-clock seconds:",
      "",
      *_medians(times, 0),
      "",
      *_ratios(times, 0),
      "",
      ("CPU seconds of the process (all its threads, Orbax's and TensorStore's included; less disturbed by "
       "other jobs on the machine than wall time):"),
      "",
      *_medians(times, 1),
      "",
      *_ratios(times, 1),
      "",
      (f"Checksums alone (every leaf's shards, as `save` computes them before writing and `restore` after "
       f"reading): median {np.median([t[0] for t in checksum_s]) * 1e3:.0f} ms wall, "
       f"{np.median([t[1] for t in checksum_s]) * 1e3:.0f} ms CPU for {gib:.2f} GiB."),
      "",
      ("Plain Orbax: `ocp.CheckpointManager` with `args.StandardSave` / `args.StandardRestore`, async, newest "
       "step kept. checkpoints: `CheckpointManager(policy=CheckpointPolicy(keep_last=1))`, async, which also "
       "writes the layout/checksum record and the metadata item and checks every leaf's checksum on restore. "
       "The CPU cores and the disk are shared with other jobs: single repetitions vary by tens of percent, "
       "which is why the managers are interleaved and the per-repetition ratios are listed."),
      "",
  ]
  OUT.write_text("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
