"""Killed saves, corrupted checkpoints, retention order and save intervals."""

import asyncio
import os
import pathlib
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import checkpoints as ck
from checkpoints.failures import newest_phrase
from tests import checkpoint_worker

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(checkpoint_worker.__file__)


def _mesh(shape):
  return jax.make_mesh(shape, ("a", "b"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _target(mesh):
  abstract = jax.eval_shape(lambda: checkpoint_worker.state_at(0, mesh))
  rep = NamedSharding(mesh, P())
  shardings = {"params": {"w": NamedSharding(mesh, P("a", "b"))}, "opt_state": {"m": NamedSharding(mesh, P("b", "a"))},
               "step": rep, "rng": rep}
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def _assert_state(got, step, mesh):
  expected = checkpoint_worker.state_at(step, mesh)
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      x, y = jax.random.key_data(x), jax.random.key_data(y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _steps_on_disk(directory):
  return sorted(int(p.name) for p in pathlib.Path(directory).iterdir() if p.name.isdigit())


def _tmp_dirs(directory):
  return [p.name for p in pathlib.Path(directory).iterdir() if "tmp" in p.name]


def _run_until(cmd, marker, timeout_s=120):
  """Starts ``cmd``, waits for a stdout line starting with ``marker``, SIGKILLs it; returns its output."""
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  # Logs go to a file of their own: C++ logging on a shared pipe can split a marker line.
  with tempfile.TemporaryFile("w+") as err:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=ROOT)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + timeout_s
    try:
      while True:
        line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        seen.append(line)
        if line.startswith(marker):
          os.kill(proc.pid, signal.SIGKILL)
          return seen
    except queue.Empty:
      err.seek(0)
      pytest.fail(f"worker never printed {marker!r}:\n" + "".join(seen) + err.read()[-3000:])
    finally:
      proc.kill()
      proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["mid_write", "before_finalize"])
def test_save_killed_by_sigkill_leaves_previous_checkpoint_restorable(tmp_path, mode):
  marker = "FINALIZING" if mode == "before_finalize" else "SAVING 2"
  out = _run_until([sys.executable, str(WORKER), str(tmp_path), mode], marker)
  assert any(l.startswith("SAVED 1") for l in out)
  if mode == "before_finalize":  # every byte of step 2 written, not renamed: must not count
    assert _steps_on_disk(tmp_path) == [1] and _tmp_dirs(tmp_path)
  mesh = _mesh((4, 2))
  with ck.CheckpointManager(tmp_path, ck.CheckpointPolicy(keep_last=1)) as mngr:
    # keep_last=1 deletes step 1 only once step 2 is final: one of them is always there.
    assert mngr.all_steps() in ([1], [2]) if mode == "mid_write" else mngr.all_steps() == [1]
    restored = mngr.restore(_target(mesh))
    _assert_state(restored.state, restored.step, mesh)
    assert restored.metadata == {"data_position": restored.step}
    nxt = restored.step + 1
    assert mngr.save(nxt, checkpoint_worker.state_at(nxt, mesh))
  assert not _tmp_dirs(tmp_path)  # the half-written save was cleaned up (in the background)
  with ck.CheckpointManager(tmp_path) as mngr:
    assert mngr.all_steps() == [nxt]
    _assert_state(mngr.restore(_target(mesh)).state, nxt, mesh)


def _small(step):
  return {"w": jnp.full((512, 1024), step, jnp.float32), "n": jnp.int32(step)}


def _small_target():
  rep = NamedSharding(_mesh((8, 1)), P())
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep), jax.eval_shape(lambda: _small(0)))


def test_keep_last_deletes_oldest_only_after_the_newer_save_is_final(tmp_path):
  with ck.CheckpointManager(tmp_path, ck.CheckpointPolicy(keep_last=2)) as mngr:
    for step in range(1, 6):
      assert mngr.save(step, _small(step))
      while step not in (on_disk := _steps_on_disk(tmp_path)):  # poll during the background write
        assert on_disk == list(range(max(1, step - 2), step)), on_disk
      mngr.wait_until_finished()
      assert _steps_on_disk(tmp_path) == list(range(max(1, step - 1), step + 1))
    assert mngr.all_steps() == [4, 5] and mngr.latest_step() == 5


def test_keep_best_keeps_best_metric_and_latest(tmp_path):
  policy = ck.CheckpointPolicy(keep_last=1, keep_best=1, best_metric="loss", best_mode="min")
  with ck.CheckpointManager(tmp_path, policy) as mngr:
    for step, loss in zip(range(1, 5), [3.0, 1.0, 2.0, 4.0]):
      mngr.save(step, _small(step), metrics={"loss": jnp.float32(loss)})
    mngr.wait_until_finished()
    assert mngr.all_steps() == [2, 4]


def test_save_interval_skips_unless_forced(tmp_path):
  with ck.CheckpointManager(tmp_path, ck.CheckpointPolicy(save_interval_steps=2, async_save=False)) as mngr:
    # the manager's first save always writes (orbax's initial-save rule), later ones on the interval
    assert [mngr.save(s, _small(s)) for s in (3, 4, 5)] == [True, True, False]
    assert mngr.save(5, _small(5), force=True)
    assert mngr.all_steps() == [3, 4, 5]


def _truncate_data(step_dir):
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  assert files
  for p in files:
    p.write_bytes(p.read_bytes()[:7])


def _delete_layout(step_dir):
  for p in (step_dir / "layout").iterdir():
    p.unlink()


@pytest.mark.parametrize("corrupt", [_truncate_data, _delete_layout], ids=["truncated-data", "deleted-layout"])
def test_corrupted_checkpoint_is_reported_and_previous_one_restored(tmp_path, corrupt):
  with ck.CheckpointManager(tmp_path, ck.CheckpointPolicy(async_save=False)) as mngr:
    mngr.save(1, _small(1), metadata={"pos": 1})
    mngr.save(2, _small(2), metadata={"pos": 2})
  corrupt(tmp_path / "2")
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CorruptCheckpointError, match="step 2"):
      mngr.restore(_small_target())
    restored = mngr.restore_latest_valid(_small_target())
  assert restored.step == 1 and restored.metadata == {"pos": 1}
  np.testing.assert_array_equal(np.asarray(restored.state["w"]), np.full((512, 1024), 1, np.float32))


def test_restore_with_nothing_saved_is_clear(tmp_path):
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.NoCheckpointError, match="No finalized checkpoint"):
      mngr.restore(_small_target())
    with pytest.raises(ck.NoCheckpointError, match="No readable checkpoint"):
      mngr.restore_latest_valid(_small_target())


def test_async_save_survives_donating_the_state_right_after(tmp_path):
  step = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
  state = jax.device_put(_small(3), NamedSharding(_mesh((2, 4)), P()))
  with ck.CheckpointManager(tmp_path) as mngr:
    assert mngr.save(3, state)
    state = step(state)  # the buffers being saved are donated while the write goes on
    mngr.wait_until_finished()
    restored = mngr.restore(_small_target()).state
  np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((512, 1024), 3, np.float32))
  np.testing.assert_array_equal(np.asarray(state["w"]), np.full((512, 1024), 4, np.float32))


def test_saving_arrays_a_jitted_call_consumed_names_them(tmp_path):
  """The state given to a donating step is deleted: saving it raised jax's bare 'Array has
  been deleted with shape=float32[512,1024]' from inside the checksums, naming no leaf. Now
  an error naming each leaf and what to save instead, raised before anything is written."""
  step = jax.jit(lambda s: jax.tree.map(lambda x: x + 1, s), donate_argnums=0)
  old = jax.device_put({"params": _small(3), "count": jnp.int32(3)},
                       NamedSharding(_mesh((2, 4)), P()))
  new = step(old)
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CheckpointError, match=r"save\(4\): the arrays of 'count',"
                       r" 'params\.n', 'params\.w' were deleted: donated to a jitted call .* Save the params"
                       " and state that call returned"):
      mngr.save(4, {"params": old["params"], "count": old["count"]})
    assert mngr.all_steps() == [] and not list(tmp_path.iterdir())
    assert mngr.save(4, new)


def test_close_waits_for_the_clean_up_of_temporary_folders(tmp_path, monkeypatch):
  """Opening a manager starts orbax's clean-up of temporary folders in a thread; close()
  returns once it has ended, and its threads end (a job refusing its input right after opening exited with that
  thread running, and printed its traceback). The clean-up is slowed to 0.5 s here."""
  from orbax.checkpoint._src.path import temporary_paths  # pylint: disable=import-outside-toplevel
  real, finished = temporary_paths.cleanup_temporary_paths, []

  async def slow_cleanup(*args, **kwargs):
    await asyncio.sleep(0.5)
    await real(*args, **kwargs)
    finished.append(True)

  monkeypatch.setattr(temporary_paths, "cleanup_temporary_paths", slow_cleanup)
  before = set(threading.enumerate())
  ck.CheckpointManager(tmp_path / "ckpt").close()
  assert finished == [True]
  # What is left is the clean-up's event loop shutting its executor down: it ends on its own.
  for thread in set(threading.enumerate()) - before:
    thread.join(timeout=10)
  assert not [t for t in threading.enumerate() if t not in before and t.is_alive()]


def test_a_restore_while_a_save_is_written_keeps_the_steps_right(tmp_path):
  """restore() during a background save reloaded the steps from storage, where the step being
  written is a temporary folder: orbax dropped it from its list and never listed it again once
  finalized (all_steps() [1] with step 2 on disk), and a later save(2) wrote over it. Now the
  steps listed are the finalized ones, before and after the save ends."""
  big = lambda value: {"w": jnp.full((4096, 4096), value, jnp.float32)}  # 64 MiB: seconds
  one = NamedSharding(_mesh((8, 1)), P())
  target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                        jax.eval_shape(lambda: big(0.0)))
  with ck.CheckpointManager(tmp_path, ck.CheckpointPolicy(keep_last=2)) as mngr:
    mngr.save(1, big(1.0))
    mngr.wait_until_finished()
    mngr.save(2, big(2.0))
    assert _steps_on_disk(tmp_path) == [1]  # step 2 still being written
    assert mngr.all_steps() == [1] and mngr.latest_step() == 1
    assert mngr.restore(target).step == 1
    mngr.wait_until_finished()
    assert mngr.all_steps() == [1, 2] and mngr.latest_step() == 2
    with pytest.warns(UserWarning, match=r"save\(2\) skipped: step 2 is saved already"):
      assert not mngr.save(2, big(22.0))
    restored = mngr.restore(target)
  assert restored.step == 2 and float(restored.state["w"][0, 0]) == 2.0


def test_a_failure_names_the_newest_step_seen_where_the_storage_lists_it_no_more(tmp_path):
  """A filesystem gone mid-run leaves the checkpoint folder missing, or empty where a save in
  flight created it again: a failed write's account then said there was no complete checkpoint.
  ``newest_finalized`` names the newest step seen finalized before, marked as not listed now,
  and again as listed once the storage is back."""
  folder, away = tmp_path / "ckpt", tmp_path / "away"
  with ck.CheckpointManager(folder) as mngr:
    assert mngr.newest_finalized() == (None, True)
    for step in (1, 2):
      mngr.save(step, _small(step))
    mngr.wait_until_finished()
    assert mngr.newest_finalized() == (2, True)
    folder.rename(away)
    assert mngr.newest_finalized() == (2, False)  # missing
    folder.mkdir()
    assert mngr.newest_finalized() == (2, False)  # made again, empty
    (away / "1").rename(folder / "1")
    assert mngr.newest_finalized() == (2, False)  # an older step only
    (folder / "1").rename(away / "1")
    folder.rmdir()
    away.rename(folder)
    assert mngr.newest_finalized() == (2, True)
  assert newest_phrase(2, False, folder) == (
      f"the newest complete checkpoint seen in {folder} before the failure is step 2; the"
      " folder does not list it now")
  assert newest_phrase(None, False, folder) == (
      f"{folder} cannot be listed now, and no complete checkpoint was seen there before")


def test_saving_a_saved_step_with_force_is_refused_naming_it(tmp_path):
  """force=True on a step already saved raised orbax's StepAlreadyExistsError, after the
  skipped save's warning had advised force=True."""
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, _small(1))
    mngr.wait_until_finished()
    with pytest.raises(ck.CheckpointError, match=r"save\(1, force=True\): step 1 is saved"
                       r" already, and a finalized checkpoint is never written over"):
      mngr.save(1, _small(2), force=True)
    mngr.save(2, _small(2))
    mngr.wait_until_finished()
    assert mngr.all_steps() == [1, 2]
    assert int(mngr.restore(_small_target(), 1).state["n"]) == 1


def test_keep_best_refuses_metrics_without_its_metric_before_writing(tmp_path):
  """A save whose metrics lacked best_metric was written, then it and every later save raised
  a bare KeyError from orbax's ranking, and keep_last kept nothing away."""
  policy = ck.CheckpointPolicy(keep_last=1, keep_best=1, best_metric="loss")
  with ck.CheckpointManager(tmp_path, policy) as mngr:
    assert mngr.save(1, _small(1), metrics={"loss": 1.0})
    with pytest.raises(ValueError, match=r"save\(2, metrics=\['acc'\]\): the metrics lack"
                       r" 'loss', by which keep_best=1 ranks the checkpoints"):
      mngr.save(2, _small(2), metrics={"acc": 0.5})
    for step, loss in ((3, 0.5), (4, 2.0)):
      assert mngr.save(step, _small(step), metrics={"loss": loss})
    mngr.wait_until_finished()
    assert mngr.all_steps() == [3, 4]
  assert _steps_on_disk(tmp_path) == [3, 4] and _tmp_dirs(tmp_path) == []


def test_a_state_with_no_data_is_refused_naming_its_leaves(tmp_path):
  """Orbax refused it from the background write ('Found empty item.'), naming nothing."""
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CheckpointError, match=re.escape(
        "save(1): the state holds no data to write (only arrays with no elements:"
        " opt.mu (0, 3), w (0, 3))")):
      mngr.save(1, {"w": jnp.zeros((0, 3)), "opt": {"mu": jnp.zeros((0, 3))}})
    with pytest.raises(ck.CheckpointError, match=re.escape("(no leaves)")):
      mngr.save(1, {})
    assert mngr.save(1, {"w": jnp.zeros((0, 3)), "n": jnp.int32(1)})
    mngr.wait_until_finished()
  assert _steps_on_disk(tmp_path) == [1]
