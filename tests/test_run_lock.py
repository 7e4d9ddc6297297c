"""launch/run_lock.py with real processes and real files: a stale lock taken over by two runs at
once, and a lock file the disk has no room for."""

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from launch import cli
from launch import run_lock
from tests import launch_helpers as h

# A run taking a folder's lock at the time argv[2]; with argv[3] == "slow" it waits 0.5 s
# between judging the stale lock and moving it away (a slow /proc or NFS read). It holds the
# lock 1.5 s and prints what it got.
_TAKER = textwrap.dedent("""
    import os, sys, time
    from launch import cli, run_lock
    folder, at, slow = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "slow"
    if slow:
      judged = run_lock.Holder.gone
      def gone(self, age):
        why = judged(self, age)
        time.sleep(0.5)
        return why
      run_lock.Holder.gone = gone
    while time.time() < at:
      time.sleep(0.001)
    try:
      lock = run_lock.RunLock.acquire(folder, warn=lambda line: None)
    except cli.UsageError as e:
      print("REFUSED", str(e), flush=True)
    else:
      print("ACQUIRED", os.getpid(), flush=True)
      time.sleep(1.5)
      lock.release()
""")


def _stale_lock(folder: pathlib.Path) -> None:
  dead = subprocess.Popen(["true"])  # a pid that has ended
  dead.wait()
  (folder / run_lock.LOCK_NAME).write_text(json.dumps(
      {"host": socket.gethostname(), "pid": dead.pid, "started": None, "since": time.time()}))


def test_of_two_runs_taking_over_a_stale_lock_only_one_gets_it(tmp_path):
  """The slow run judged the stale lock before the other took it over: its move takes the
  other's fresh lock, which it puts back, and it is refused naming the other (before, both
  printed ACQUIRED: the slow run renamed the other's lock away and created its own)."""
  _stale_lock(tmp_path)
  at = time.time() + 3  # both imported by then
  env = {**os.environ, "PYTHONPATH": str(h.ROOT)}
  slow = subprocess.Popen([sys.executable, "-c", _TAKER, str(tmp_path), str(at), "slow"],
                          env=env, stdout=subprocess.PIPE, text=True)
  fast = subprocess.Popen([sys.executable, "-c", _TAKER, str(tmp_path), str(at + 0.2), "fast"],
                          env=env, stdout=subprocess.PIPE, text=True)
  said = {}
  for name, proc in (("slow", slow), ("fast", fast)):
    out, _ = proc.communicate(timeout=60)
    said[name] = out.strip()
  assert said["fast"] == f"ACQUIRED {fast.pid}", said
  assert said["slow"].startswith("REFUSED") and f"pid {fast.pid}" in said["slow"], said
  assert not (tmp_path / run_lock.LOCK_NAME).exists()  # released by the one that got it
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing moved aside is left


def test_a_lock_taken_since_it_was_judged_stale_is_put_back(tmp_path, monkeypatch):
  """The move takes another run's fresh lock: it is put back whole (same file and content)."""
  _stale_lock(tmp_path)
  path = tmp_path / run_lock.LOCK_NAME
  judged = run_lock.Holder.gone
  other = {}

  def gone(self, age):  # another run takes the stale lock over once this one has judged it
    why = judged(self, age)
    if not other:
      path.unlink()
      other["lock"] = run_lock.RunLock.acquire(tmp_path)
      other["inode"], other["text"] = path.stat().st_ino, path.read_text()
    return why
  monkeypatch.setattr(run_lock.Holder, "gone", gone)
  try:
    with pytest.raises(cli.UsageError, match=f"in use by another run .*pid {os.getpid()}"):
      run_lock.RunLock.acquire(tmp_path)
    assert (path.stat().st_ino, path.read_text()) == (other["inode"], other["text"])
  finally:
    other["lock"].release()
  assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def _full_disk(where: pathlib.Path):
  """A 1 MiB tmpfs at ``where``, filled (root only; else the test is skipped)."""
  where.mkdir()
  mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                         check=False, capture_output=True)
  if mount.returncode:
    pytest.skip(f"no tmpfs to fill: {mount.stderr!r}")
  try:
    with contextlib.suppress(OSError), open(where / "filler", "wb") as f:
      while True:
        f.write(b"\0" * 4096)
        f.flush()
    yield where
  finally:
    subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_lock_file_the_disk_has_no_room_for_is_a_storage_error_leaving_nothing(tmp_path):
  """Disk full at the lock's draft: StorageError naming the lock file, no draft left (it was
  OSError, exit 1, and an empty .run.lock.<uuid> stayed)."""
  with _full_disk(tmp_path / "disk") as disk:
    folder = disk / "run"
    folder.mkdir()
    with pytest.raises(cli.StorageError, match=f"^--out {folder}: cannot write its lock file"
                       f" {folder / run_lock.LOCK_NAME} \\(No space left on device\\)"):
      run_lock.RunLock.acquire(folder)
    assert list(folder.iterdir()) == []


def test_a_lock_whose_holder_has_exited_unreaped_is_taken_over(tmp_path):
  """A run killed whose parent has not waited for it yet (a zombie: ``kill(pid, 0)`` and its
  start time still answer, for seconds after a launcher's kill -9, or for good under a first
  process that never reaps) held the folder: the restart was refused as 'in use'."""
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
      import sys
      from launch import run_lock
      run_lock.RunLock.acquire(sys.argv[1], warn=lambda line: None)
      print("held", flush=True)
      sys.stdin.read()""").strip(), str(tmp_path)],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=h.child_env())
  try:
    assert holder.stdout.readline() == "held\n"
    holder.kill()
    deadline = time.monotonic() + 10
    while open(f"/proc/{holder.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
      assert time.monotonic() < deadline
      time.sleep(0.01)
    said = []
    lock = run_lock.RunLock.acquire(tmp_path, warn=said.append)
    lock.release()
  finally:
    holder.kill()
    holder.wait()
  assert len(said) == 1
  assert said[0].startswith(f"warning: --out {tmp_path}: took over the lock of a run that is"
                            f" gone (host {socket.gethostname()}, pid {holder.pid}, since ")
  assert said[0].endswith(f": process {holder.pid} has exited (not yet reaped))")


def test_a_lock_deleted_while_the_run_lives_is_written_again(tmp_path, monkeypatch):
  """A run's lock file deleted while it runs (a clean-up script, a user): a second run entered
  the folder and both wrote it. The heartbeat writes the lock again, and the second run is
  refused; a lock another run took meanwhile is left to it."""
  monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
  lock = run_lock.RunLock.acquire(tmp_path, warn=pytest.fail)
  try:
    lock.path.unlink()
    deadline = time.monotonic() + 30
    while not lock.path.exists() and time.monotonic() < deadline:
      time.sleep(0.01)
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    with pytest.raises(cli.UsageError, match=f"--out {tmp_path} is in use by another run"):
      run_lock.RunLock.acquire(tmp_path, warn=pytest.fail)
    lock.path.unlink()
    lock.path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": None,
                                     "since": time.time()}))
    time.sleep(0.3)  # several heartbeats
    assert json.loads(lock.path.read_text())["host"] == "elsewhere"
  finally:
    lock.release()
  assert lock.path.exists()  # another run's: not released by this one
