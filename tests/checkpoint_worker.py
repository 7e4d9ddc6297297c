"""A training process that gets killed during an async checkpoint save.

Run as ``python tests/checkpoint_worker.py DIR MODE``. It saves step 1 and
waits for it, then starts saving step 2 and prints ``SAVING 2``; the test
SIGKILLs it there. MODE ``mid_write`` is killed while the arrays are being
written; ``before_finalize`` blocks at orbax's final atomic rename (all data
written, not yet committed) so the kill lands at the last possible moment.
"""

import os
import sys

if __name__ == "__main__":
  os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
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


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
