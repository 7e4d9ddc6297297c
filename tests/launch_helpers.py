"""Shared by the launch tests: a tiny job config, bounded subprocesses, metrics."""

import os
import pathlib
import subprocess
import sys
import time

from launch import report, train

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Tiny model; constant schedule so runs with different --steps share their lr.
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--head-dim", "16",
        "--mlp", "64", "--batch", "8", "--seq-len", "17", "--mesh", "data=4,model=2",
        "--schedule", "constant", "--log-every", "1"]


_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def child_env() -> dict:
  """Environment for a job subprocess: conftest's XLA flags but the device
  count (the job sets its own), so it compiles as this process does; a
  shared compile cache."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                              if not flag.startswith(_DEVICE_COUNT_FLAG))
  env.update(JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
             JAX_COMPILATION_CACHE_DIR=str(ROOT / ".jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  return env


def start(args: list[str], log: pathlib.Path, cwd: pathlib.Path = ROOT,
          user: int | None = None) -> subprocess.Popen:
  """``python -m <args>`` in ``cwd`` (default the repository root; as ``user``
  if given), stdout to ``log`` and stderr to ``log`` + ".stderr" (apart, so
  C++ logging cannot split a line)."""
  env = child_env()
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
  with open(log, "w") as out, open(f"{log}.stderr", "w") as err:
    return subprocess.Popen([sys.executable, "-m", *args], cwd=cwd, env=env, user=user,
                            stdout=out, stderr=err, start_new_session=True)


def run(args: list[str], log: pathlib.Path, timeout: float, cwd: pathlib.Path = ROOT,
        user: int | None = None) -> int:
  """Runs ``python -m <args>`` to completion (killed after ``timeout``)."""
  proc = start(args, log, cwd, user)
  try:
    return proc.wait(timeout=timeout)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def run_in_process(out: pathlib.Path, *args: str) -> list[float]:
  """Runs the job here (the 8 devices of conftest) and returns its losses by step."""
  assert train.main([*TINY, "--cpu-devices", "0", "--out", str(out), *args]) == 0
  return losses(out)


def losses(out: pathlib.Path) -> list[float]:
  records = report.read_metrics(out / "metrics.jsonl")
  assert [r["step"] for r in records] == list(range(1, len(records) + 1))
  return [r["loss"] for r in records]


def _wait_until(ready, proc: subprocess.Popen, timeout: float, missing: str) -> None:
  """Polls ``ready()`` until it holds; fails if the job ends first or ``timeout`` passes."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert proc.poll() is None, f"the job ended early with {proc.returncode}"
    if ready():
      return
    time.sleep(0.2)
  raise AssertionError(f"{missing} within {timeout} s")


def wait_for_steps(out: pathlib.Path, steps: int, proc: subprocess.Popen,
                   timeout: float) -> None:
  """Blocks until ``out/metrics.jsonl`` has ``steps`` lines (fails if the job ends)."""
  path = out / "metrics.jsonl"
  _wait_until(lambda: path.exists() and len(path.read_text().splitlines()) >= steps,
              proc, timeout, f"no {steps} steps")


def wait_for_checkpoint(directory: pathlib.Path, proc: subprocess.Popen,
                        timeout: float) -> None:
  """Blocks until ``directory`` holds a finalized checkpoint (fails if the job ends)."""
  _wait_until(lambda: directory.is_dir() and bool(checkpoint_steps(directory)),
              proc, timeout, f"no finalized checkpoint in {directory}")


def checkpoint_steps(directory: pathlib.Path) -> list[int]:
  """Finalized checkpoint steps (orbax renames a step's tmp dir when complete)."""
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def stop(proc: subprocess.Popen) -> None:
  if proc.poll() is None:
    proc.kill()
    proc.wait()
