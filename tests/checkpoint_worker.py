"""Subprocess workers for checkpoint tests.

Killed save: ``python tests/checkpoint_worker.py DIR MODE``. It saves step 1 and
waits for it, then starts saving step 2 and prints ``SAVING 2``; the test
SIGKILLs it there. MODE ``mid_write`` is killed while the arrays are being
written; ``before_finalize`` blocks at orbax's final atomic rename (all data
written, not yet committed) so the kill lands at the last possible moment.

Two processes: ``python tests/checkpoint_worker.py DIR multihost PORT PID ROLE``
(4 devices each, 127.0.0.1). ROLE ``both`` saves on (2,4) and restores on (4,2);
ROLE ``absent`` has process 1 skip the save, so process 0 must time out; ROLE ``damaged``
also saves step 2, damages one of process 1's data files, and restores the latest valid step.
"""

import os
import sys

if __name__ == "__main__":
  DEVICES = 4 if sys.argv[2] == "multihost" else 8
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
  os.environ["JAX_PLATFORMS"] = "cpu"
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

SHAPE = (2048, 2048)  # 16 MiB per array: a save takes long enough to be killed mid-write


def state_at(step: int, mesh) -> dict:
  """The (deterministic) training state after ``step`` steps, sharded on ``mesh``."""
  w = jax.jit(lambda: jnp.arange(SHAPE[0] * SHAPE[1], dtype=jnp.float32).reshape(SHAPE) * step,
              out_shardings=NamedSharding(mesh, P("a", "b")))()
  m = jax.jit(lambda: jnp.full(SHAPE, step, jnp.float32), out_shardings=NamedSharding(mesh, P("b", "a")))()
  return {"params": {"w": w}, "opt_state": {"m": m}, "step": jnp.int32(step), "rng": jax.random.key(step)}


def _block_at_final_rename():
  from orbax.checkpoint._src.path import atomicity  # pylint: disable=import-outside-toplevel

  async def rename(src, dst):
    print("FINALIZING", src, dst, flush=True)
    time.sleep(600)

  atomicity.async_path.rename = rename


def main(directory: str, mode: str) -> None:
  import checkpoints as ck  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  mngr = ck.CheckpointManager(directory, ck.CheckpointPolicy(keep_last=1))
  mngr.save(1, state_at(1, mesh), metadata={"data_position": 1})
  mngr.wait_until_finished()
  print("SAVED 1", flush=True)
  if mode == "before_finalize":
    _block_at_final_rename()
  mngr.save(2, state_at(2, mesh), metadata={"data_position": 2})
  print("SAVING 2", flush=True)
  time.sleep(600)


def _damaged_newest_falls_back(mngr, mesh, pid: int) -> None:
  """Saves step 2, flips 64 bytes in the middle of process 1's largest data file, restores the latest valid."""
  import pathlib  # pylint: disable=import-outside-toplevel

  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  mngr.save(2, state_at(2, mesh), metadata={"processes": 2})
  mngr.wait_until_finished()
  if pid == 1:
    files = list((pathlib.Path(mngr.directory) / "2" / "state" / "ocdbt.process_1" / "d").iterdir())
    path = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(b ^ 0xFF for b in data[mid:mid + 64])
    path.write_bytes(bytes(data))
  multihost_utils.sync_global_devices("damaged")
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state_at(0, mesh))
  restored = mngr.restore_latest_valid(target)
  print("FELL_BACK", pid, restored.step, [s.step for s in restored.skipped], flush=True)


def multihost(directory: str, port: int, pid: int, role: str) -> None:
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                             initialization_timeout=60, heartbeat_timeout_seconds=10)
  import checkpoints as ck  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  mesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  mngr = ck.CheckpointManager(directory, ck.CheckpointPolicy(timeout_s=5))
  if role == "absent":
    if pid == 0:
      try:
        mngr.save(1, state_at(1, mesh))
      except ck.BarrierTimeoutError as e:
        print("TIMEOUT", str(e).replace("\n", " "), flush=True)
    else:
      time.sleep(12)
    os._exit(0)
  mngr.save(1, state_at(1, mesh), metadata={"processes": 2})
  mngr.wait_until_finished()
  if role == "damaged":
    _damaged_newest_falls_back(mngr, mesh, pid)
    mngr.close()
    os._exit(0)
  other = jax.make_mesh((4, 2), ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=jax.sharding.NamedSharding(
      other, P("b", "a") if a.ndim else P())), jax.eval_shape(lambda: state_at(0, other)))
  restored = mngr.restore(target)
  got = multihost_utils.process_allgather(restored.state["params"]["w"], tiled=True)
  want = multihost_utils.process_allgather(state_at(1, mesh)["params"]["w"], tiled=True)
  print("RESTORED", pid, restored.step, bool((got == want).all()), restored.metadata, flush=True)
  mngr.close()
  os._exit(0)


if __name__ == "__main__":
  if sys.argv[2] == "multihost":
    multihost(sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
  else:
    main(sys.argv[1], sys.argv[2])
