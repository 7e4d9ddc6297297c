"""Real multi-process jobs: 2 processes x 4 CPU devices joined by jax.distributed.

Checked against 1 process x 8 devices run in this process: per-step losses
agree within 4 ulp of float32 (not bit for bit: the cross-process reductions
add in another order; 1 to 2 ulp measured, 2 at step 3 of the adam job), a
checkpoint written by 2 processes resumed by 1, and
the launcher stopping a job whose process was killed with SIGKILL, then a
--resume from the last complete checkpoint. gloo's connection lines
("[Gloo] Rank ...") do not reach the output. Stopping: a signal to the launcher
or to one process, the launcher's --timeout, the launcher killed, a process
failing with an error (each bounded in time, no process left behind).
"""

import os
import pathlib
import re
import signal
import time

import numpy as np
import pytest

from tests import launch_helpers as h

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def assert_within_four_ulp(losses, reference) -> None:
  """The per-step float32 losses differ by at most 4 units in the last place."""
  np.testing.assert_array_max_ulp(np.float32(losses), np.float32(reference), maxulp=4)

LAUNCH = ["launch.local_multihost", "--processes", "2", "--devices", "4",
          "--timeout", "240", "--grace", "5", "--heartbeat-timeout", "10", "--"]


@pytest.fixture(scope="module")
def adam_reference(tmp_path_factory):
  """Losses of 16 adam steps on 1 process x 8 devices (ZeRO state)."""
  return h.run_in_process(tmp_path_factory.mktemp("ref"), "--optimizer", "adam",
                          "--steps", "16")


def test_adafactor_two_processes_match_one_and_each_writes_its_profile(tmp_path):
  args = [*h.TINY, "--optimizer", "adafactor", "--steps", "3", "--checkpoint-every", "0"]
  out = tmp_path / "mh"
  assert h.run([*LAUNCH, *args, "--profile-steps", "2:2", "--out", str(out)],
               tmp_path / "log", 240) == 0
  assert "[Gloo]" not in (tmp_path / "log").read_text()
  one = h.run_in_process(tmp_path / "one", *args[len(h.TINY):])
  assert_within_four_ulp(h.losses(out), one)
  # One trace per process: process 1's beside process 0's, in process-1/ (in
  # one folder both wrote the same <host> files and one trace was lost).
  traces = {p.relative_to(out).parts[0] for p in out.rglob("*.xplane.pb")}
  assert traces == {"plugins", "process-1"}, sorted(out.rglob("*.xplane.pb"))


def test_adam_two_processes_match_one_and_resume_in_one(tmp_path, adam_reference):
  out = tmp_path / "mh"
  args = ["--optimizer", "adam", "--checkpoint-every", "2", "--out", str(out)]
  assert h.run([*LAUNCH, *h.TINY, *args, "--steps", "4"], tmp_path / "log", 240) == 0
  assert_within_four_ulp(h.losses(out), adam_reference[:4])
  assert h.checkpoint_steps(out / "checkpoints") == [2, 4]
  resumed = h.run_in_process(out, *args, "--steps", "6", "--resume")
  assert_within_four_ulp(resumed, adam_reference[:6])


def test_the_launcher_resumes_the_newest_run_with_resume_equals_auto(tmp_path):
  """'--resume=auto' after -- continues the newest run, as python -m launch.train --resume=auto
  does: the launcher gave the processes a new run folder, and they started afresh there."""
  work = tmp_path / "work"
  work.mkdir()
  assert h.run(["launch.train", *h.TINY, "--steps", "2"], tmp_path / "first", 240, cwd=work) == 0
  runs = sorted((work / "runs").iterdir())
  assert h.run([*LAUNCH, *h.TINY, "--steps", "3", "--resume=auto"], tmp_path / "log", 240,
               cwd=work) == 0
  assert "resumed from step 2" in (tmp_path / "log").read_text()
  assert sorted((work / "runs").iterdir()) == runs and len(runs) == 1
  assert len(h.losses(runs[0])) == 3


def test_quantized_state_two_processes_resume_in_one_on_another_mesh(tmp_path, capsys):
  """8-bit state saved by 2 processes on data=4,model=2, resumed by 1 on
  data=8,model=1: the blocks fit both meshes' shards, so nothing is
  re-encoded."""
  out, args = tmp_path / "mh", ["--state-bits", "8", "--checkpoint-every", "2"]
  assert h.run([*LAUNCH, *h.TINY, *args, "--steps", "2", "--out", str(out)],
               tmp_path / "log", 240) == 0
  one = h.run_in_process(tmp_path / "one", *args, "--steps", "2")
  np.testing.assert_allclose(h.losses(out), one, rtol=1e-5)
  capsys.readouterr()
  resumed = h.run_in_process(out, *args, "--steps", "4", "--resume",
                             "--mesh", "data=8,model=1")
  said = capsys.readouterr().out
  assert "resumed from step 2" in said
  assert "re-encoded" not in said, said
  assert len(resumed) == 4 and np.all(np.isfinite(resumed))


def _child_with_process_id(launcher_pid: int, index: int) -> int:
  children = open(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read().split()
  for pid in map(int, children):
    argv = open(f"/proc/{pid}/cmdline").read().split("\0")
    if argv[argv.index("--process-id") + 1] == str(index):
      return pid
  raise AssertionError(f"no child with --process-id {index} among {children}")


def test_kill9_stops_the_job_and_resume_continues(tmp_path, adam_reference):
  out, log = tmp_path / "mh", tmp_path / "log"
  args = [*h.TINY, "--optimizer", "adam", "--checkpoint-every", "2", "--out", str(out)]
  launcher = h.start([*LAUNCH, *args, "--steps", "400"], log)
  try:
    h.wait_for_steps(out, 4, launcher, timeout=150)
    h.wait_for_checkpoint(out / "checkpoints", launcher, timeout=150)  # saves are asynchronous
    victim = _child_with_process_id(launcher.pid, 1)
    survivor = _child_with_process_id(launcher.pid, 0)
    os.kill(victim, signal.SIGKILL)
    start = time.monotonic()
    code = launcher.wait(timeout=60)
    assert time.monotonic() - start < 60
  finally:
    h.stop(launcher)
  assert code != 0
  assert "process 1 exited with -9" in log.read_text()
  assert not os.path.exists(f"/proc/{survivor}/cmdline") or _is_zombie_or_gone(survivor)

  last = h.checkpoint_steps(out / "checkpoints")[-1]
  assert last + 2 <= len(adam_reference)
  assert h.run([*LAUNCH, *args, "--steps", str(last + 2), "--resume"], log, 240) == 0
  assert f"resumed from step {last}" in log.read_text()
  np.testing.assert_allclose(h.losses(out), adam_reference[:last + 2], rtol=1e-5)


def _is_zombie_or_gone(pid: int) -> bool:
  try:
    return open(f"/proc/{pid}/stat").read().split()[2] in "ZX"
  except FileNotFoundError:
    return True



def _children(launcher_pid: int) -> list[int]:
  return [int(pid) for pid in
          open(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read().split()]


def _wait_gone(pids: list[int], timeout: float) -> float:
  """Seconds until every process of ``pids`` ended (gone or a zombie); fails after ``timeout``,
  killing by PID what is left."""
  start = time.monotonic()
  while not all(_is_zombie_or_gone(pid) for pid in pids):
    if time.monotonic() - start > timeout:
      left = [pid for pid in pids if not _is_zombie_or_gone(pid)]
      for pid in left:
        os.kill(pid, signal.SIGKILL)
      raise AssertionError(f"processes {left} still alive {timeout} s later (killed now)")
    time.sleep(0.05)
  return time.monotonic() - start


def _start_training(tmp_path, *args):
  """(the launcher of a long 2-process run, its processes, the run folder, the log) once 3
  steps are logged."""
  out, log = tmp_path / "mh", tmp_path / "log"
  launcher = h.start([*LAUNCH, *h.TINY, "--steps", "2000", *args, "--out", str(out)], log)
  try:
    h.wait_for_steps(out, 3, launcher, timeout=150)
  except BaseException:
    h.stop(launcher)
    raise
  return launcher, _children(launcher.pid), out, log


def _exit_after(launcher, children, act, timeout: float):
  """Runs ``act()``, then waits up to ``timeout`` s for the launcher to exit: (its exit code,
  seconds from ``act`` to the exit, what ``act`` returned). The launcher is stopped and every
  process of it gone when this returns or raises."""
  try:
    acted = act()
    start = time.monotonic()
    code = launcher.wait(timeout=timeout)
    return code, time.monotonic() - start, acted
  finally:
    h.stop(launcher)
    _wait_gone(children, 10)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_launcher_stops_every_process_at_one_step_and_saves(tmp_path, signum):
  """jax's preemption service took SIGTERM from the job's handler, so the job trained on to
  --steps; SIGHUP ended the launcher and left both processes. The launcher passes each on as
  SIGTERM: every process stops at the same step a few after the signal, saves it, exits 0."""
  launcher, children, out, log = _start_training(tmp_path, "--checkpoint-every", "1000")

  def signal_the_launcher():
    seen = len(h.losses(out))
    launcher.send_signal(signum)
    return seen

  code, took, seen = _exit_after(launcher, children, signal_the_launcher, 60)
  text, stopped = log.read_text(), len(h.losses(out))
  assert code == 0, (code, text[-1500:], pathlib.Path(f"{log}.stderr").read_text()[-1500:])
  assert f"[0] stopped by signal 15 after step {stopped}; checkpoint saved" in text
  assert seen <= stopped <= seen + 5, (seen, stopped)
  assert h.checkpoint_steps(out / "checkpoints") == [stopped]  # written by both processes
  assert not (out / "run.lock").exists()
  print(f"{signal.Signals(signum).name}: stopped at step {stopped} (signal after step {seen}),"
        f" the launcher exited {took:.1f} s after it")


def test_killing_the_launcher_ends_every_process(tmp_path):
  """SIGKILL to the launcher left both processes running (then stuck ~300 s holding the run
  folder's lock): their parent-death signal is SIGKILL."""
  launcher, children, _, _ = _start_training(tmp_path)
  try:
    launcher.kill()
    launcher.wait()
    took = _wait_gone(children, 10)
  finally:
    h.stop(launcher)
  print(f"both processes ended {took:.2f} s after the launcher was killed")


def test_a_process_failing_with_an_error_stops_the_job_within_seconds(tmp_path):
  """Process 0's write of samples.jsonl fails (exit 4): it waited in jax's shutdown barrier
  while process 1 waited in the next collective, both aborted 300 s later and the launcher
  exited 134. Now it leaves without the barrier and process 1's collective fails at once."""
  launcher, children, out, log = _start_training(tmp_path, "--checkpoint-every", "2",
                                                 "--sample-every", "8")
  # The sample of step 8 cannot be written.
  code, took, _ = _exit_after(launcher, children, (out / "samples.jsonl").mkdir, 90)
  err = pathlib.Path(f"{log}.stderr").read_text()
  assert code == 4, (code, err[-2000:])
  assert "[launcher] process 0 exited with 4: stopping the others" in log.read_text()
  assert re.search(r"^\[0\] error: .*samples\.jsonl", err, re.M), err[-2000:]
  print(f"the launcher exited {took:.1f} s after samples.jsonl was made a folder (at step"
        f" {len(h.losses(out))}; the sample is due at step 8)")


def test_the_launchers_timeout_stops_every_process_cleanly(tmp_path):
  """--timeout sends SIGTERM, which the processes ignored (jax's preemption service) until
  SIGKILL --grace seconds later: the save in flight lost, run.lock left. Now they stop, save,
  exit 0 within the grace; the launcher exits 124."""
  out, log = tmp_path / "mh", tmp_path / "log"
  launch = [arg if arg != "240" else "30" for arg in LAUNCH]  # --timeout 30
  launcher = h.start([*launch, *h.TINY, "--steps", "100000", "--checkpoint-every", "50000",
                      "--out", str(out)], log)
  try:
    code = launcher.wait(timeout=90)
  finally:
    h.stop(launcher)
  text, stopped = log.read_text(), len(h.losses(out))
  assert code == 124, (code, text[-1500:])
  assert f"[0] stopped by signal 15 after step {stopped}; checkpoint saved" in text, text[-1500:]
  assert h.checkpoint_steps(out / "checkpoints") == [stopped]
  assert not (out / "run.lock").exists()


def test_sigterm_to_one_process_stops_every_process_and_says_so(tmp_path):
  """SIGTERM to process 1 alone: every process stops after the same step and saves it; process
  0, which got no signal, said `done: N steps` where N was far below --steps."""
  launcher, children, out, log = _start_training(tmp_path, "--checkpoint-every", "1000")
  code, _, _ = _exit_after(
      launcher, children,
      lambda: os.kill(_child_with_process_id(launcher.pid, 1), signal.SIGTERM), 60)
  text, stopped = log.read_text(), len(h.losses(out))
  assert code == 0, (code, text[-1500:])
  assert f"[0] stopped by signal 15 after step {stopped}; checkpoint saved" in text, text[-1500:]
  assert h.checkpoint_steps(out / "checkpoints") == [stopped]


def test_a_signal_before_step_1_leaves_nothing_the_multi_process_run_created(tmp_path):
  """SIGTERM to the launcher before step 1 of a new run whose --out lies in new folders: the run
  folder and every folder made above it are removed, whichever process made them (those made
  by process 1 were left, e.g. mh/np and mh/np/sub of mh/np/sub/run)."""
  out, log = tmp_path / "np" / "sub" / "run", tmp_path / "log"
  launcher = h.start([*LAUNCH, *h.TINY, "--steps", "4", "--out", str(out)], log)
  try:
    deadline = time.monotonic() + 150
    while "per-device memory plan" not in log.read_text():  # step 1 is seconds away
      assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
      time.sleep(0.02)
    launcher.send_signal(signal.SIGTERM)
    code = launcher.wait(timeout=60)
  finally:
    h.stop(launcher)
  text = log.read_text()
  assert code == 0, (code, text[-1500:])
  assert (f"[0] stopped by signal 15 before step 1: nothing trained; removed the new run folder"
          f" {out} and the folders created for it: {out.parent}, {out.parent.parent}") in text
  assert sorted(p.name for p in tmp_path.iterdir()) == ["log", "log.stderr"]
