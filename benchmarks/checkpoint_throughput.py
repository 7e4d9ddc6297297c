"""Save/restore throughput of ~1 GiB of sharded state vs a plain sequential write/read.

8 simulated CPU devices, a (2,4) mesh, 8 float32 arrays of 8192x4096 (1 GiB).
Measures: checkpoints.CheckpointManager sync save, async save (time the step
loop is blocked in ``save`` and the time until the write is final), restore onto
the same shardings; against numpy ``tofile`` + fsync and ``fromfile`` of the same
bytes; and the step time of a donated jitted update while an async save is
being written. Writes benchmarks/results/checkpoint_throughput.md.

Run: python benchmarks/checkpoint_throughput.py
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pathlib  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import checkpoints as ck  # noqa: E402

N_ARRAYS, SHAPE = 8, (8192, 4096)  # even sizes (odd lengths are slow on XLA:CPU)
OUT = pathlib.Path(__file__).resolve().parent / "results" / "checkpoint_throughput.md"


def _state(mesh):
  spec = NamedSharding(mesh, P("a", "b"))
  make = jax.jit(lambda i: jnp.full(SHAPE, i, jnp.float32) + jnp.arange(SHAPE[1], dtype=jnp.float32),
                 out_shardings=spec)
  return {f"w{i}": make(jnp.float32(i)) for i in range(N_ARRAYS)}


def _timed(fn):
  t = time.perf_counter()
  out = fn()
  return time.perf_counter() - t, out


def _plain_io(host, directory):
  path = directory / "plain.bin"

  def write():
    with open(path, "wb") as f:
      for a in host.values():
        a.tofile(f)
      f.flush()
      os.fsync(f.fileno())

  def read():
    with open(path, "rb") as f:
      return [np.fromfile(f, np.float32, count=a.size) for a in host.values()]

  tw, _ = _timed(write)
  tr, _ = _timed(read)
  path.unlink()
  return tw, tr


def _step_times(state, step, n):
  times = []
  for _ in range(n):
    t, state = _timed(lambda s=state: jax.block_until_ready(step(s)))
    times.append(t)
  return state, times


def main():
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  state = _state(mesh)
  nbytes = sum(a.nbytes for a in state.values())
  gib = nbytes / 2**30
  work = pathlib.Path(tempfile.mkdtemp(prefix="ckpt_bench_"))
  rows = []
  try:
    host = {k: np.asarray(v) for k, v in state.items()}
    tw, tr = _plain_io(host, work)
    del host
    rows += [("numpy tofile + fsync (sequential write)", tw), ("numpy fromfile (sequential read)", tr)]

    with ck.CheckpointManager(work / "sync", ck.CheckpointPolicy(async_save=False)) as mngr:
      mngr.save(0, state)  # warm-up (first save pays set-up costs)
      ts, _ = _timed(lambda: mngr.save(1, state))
      target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
      trs, restored = _timed(lambda: jax.block_until_ready(mngr.restore(target, 1).state))
    assert all(np.array_equal(np.asarray(restored[k]), np.asarray(state[k])) for k in state)
    del restored
    rows += [("checkpoints save, sync", ts), ("checkpoints restore (same shardings)", trs)]

    step = jax.jit(lambda s: jax.tree.map(lambda x: x * 1.0001 + 1.0, s), donate_argnums=0)
    state, base = _step_times(state, step, 6)
    with ck.CheckpointManager(work / "async") as mngr:
      mngr.save(0, state)
      mngr.wait_until_finished()
      t0 = time.perf_counter()
      blocked, _ = _timed(lambda: mngr.save(1, state))
      state, during = _step_times(state, step, 3)
      mngr.wait_until_finished()
      total = time.perf_counter() - t0
    rows += [("checkpoints save, async: blocking part", blocked),
             ("checkpoints save, async: until final (3 steps run meanwhile)", total)]
  finally:
    shutil.rmtree(work, ignore_errors=True)

  lines = [
      "# Checkpoint throughput (benchmarks/checkpoint_throughput.py)",
      "",
      f"Command: `python benchmarks/checkpoint_throughput.py`. State: {N_ARRAYS} float32 arrays {SHAPE}, "
      f"{gib:.2f} GiB, sharded P('a','b') on a (2,4) mesh of 8 simulated CPU devices; local disk; one run.",
      "",
      "| operation | seconds | GiB/s |",
      "|---|---:|---:|",
  ]
  lines += [f"| {name} | {t:.3f} | {gib / t:.2f} |" for name, t in rows]
  lines += [
      "",
      f"Step loop (donated jitted update of the whole state): median step {np.median(base[1:]) * 1e3:.0f} ms "
      f"without a save; {np.median(during) * 1e3:.0f} ms per step while the async save was being written "
      f"(the loop was blocked {blocked * 1e3:.0f} ms inside `save`).",
      "",
      "Notes: the plain write calls fsync, orbax/tensorstore does not (its save ends in the page cache), so the",
      "write rows are not like for like; the disk and the 2 CPU cores are shared with other jobs, so figures vary",
      "run to run by a factor of ~2. The async save returns after copying the arrays off the devices; the update",
      "donates the state right after `save` returns (tests/test_checkpoint_safety.py checks the saved values).",
      "",
  ]
  OUT.write_text("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
