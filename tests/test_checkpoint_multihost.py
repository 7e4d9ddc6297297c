"""Two jax.distributed processes on 127.0.0.1: save/restore across topologies, barrier timeouts."""

import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

from tests.test_checkpoint_safety import ROOT, WORKER


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_pair(directory, role, timeout_s=120):
  port, env = _free_port(), dict(os.environ, PYTHONPATH=str(ROOT))
  env.pop("XLA_FLAGS", None)
  # stdout carries the workers' markers; stderr (jax/gloo logs, written by C++
  # at any moment) stays apart so it cannot split a marker line.
  procs = [subprocess.Popen([sys.executable, str(WORKER), str(directory), "multihost", str(port), str(i), role],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
           for i in range(2)]
  outs = []
  try:
    for p in procs:
      out, err = p.communicate(timeout=timeout_s)
      outs.append(f"{out}\n--- stderr ---\n{err[-2000:]}")
  finally:
    for p in procs:
      p.kill()
      p.wait(timeout=30)
  return outs


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_save_on_2x4_and_restore_on_4x2(tmp_path):
  outs = _run_pair(tmp_path, "both")
  for pid, out in enumerate(outs):
    assert f"RESTORED {pid} 1 True {{'processes': 2}}" in out, out[-3000:]
  assert sorted(p.name for p in pathlib.Path(tmp_path).iterdir()) == ["1"]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_missing_process_times_out_naming_it(tmp_path):
  out = _run_pair(tmp_path, "absent")[0]
  line = next((l for l in out.splitlines() if l.startswith("TIMEOUT")), None)
  assert line is not None, out[-3000:]
  assert re.search(r"Process 0: barrier 'save_1/\d+' timed out after 5.0 s; process\(es\) \[1\] did not arrive", line)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_agree_to_skip_a_step_damaged_in_one_process_files(tmp_path):
  outs = _run_pair(tmp_path, "damaged")
  for pid, out in enumerate(outs):
    assert f"FELL_BACK {pid} 1 [2]" in out, out[-3000:]
