"""Test set-up: 8 simulated CPU devices, configured before jax is imported."""

import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The suite compiles thousands of small programs, and XLA's compile is most of
# its time. LLVM at -O0 cut the suite's CPU time by a third (a harness subset:
# 175 -> 112 CPU-seconds); XLA:CPU's elemental emitter
# (--xla_cpu_use_fusion_emitters=false) halves it again (the harness's sharded
# step cells, cold cache: 348 -> 175 s; `bash .ci/run` on a fresh clone with 2
# cores: 1897 -> 787 s, pytest's own count 762 s). Compiling each program's
# LLVM code in one part (--xla_cpu_parallel_codegen_split_count=1), not in
# parts on threads that two workers on two cores cannot run side by side, cuts
# a fifth of a harness subset's CPU time (its adamw and lion sharded-step
# cells, cold cache, one process, 4 paired runs: 51-56 -> 41-45 s) and about a
# tenth of the suite's (a fresh clone's summed test time: 3645-4044 s in 3
# runs -> 3430 and 3543 s in 2). All three change how XLA:CPU generates each
# kernel's code, not the partitioned program: its shardings and collectives
# are the ones users get. What they can change is rounding (with the
# elemental emitter, one part instead of several moved one array of 30 by one
# ulp after 3 steps of 4 optimizers): tests marked ``default_codegen`` assert
# results that hold under XLA:CPU's default emitters only (two different
# programs equal bit for bit, or optax's numbers to 1e-6 through a line search
# or Newton-Schulz iterations, which amplify a last-bit difference), and run
# in a child pytest with the default emitters and parts
# (``pytest_pyfunc_call`` below). The flags reach every subprocess a
# test starts (launch_helpers.child_env), so in-process references and jobs
# compile alike.
_DEFAULT_CODEGEN_ENV = "SHARDOPT_TESTS_DEFAULT_CODEGEN"
_DEFAULT_CODEGEN = os.environ.get(_DEFAULT_CODEGEN_ENV) == "1"
# XLA:CPU aborts the process when a simulated device reaches a collective's
# rendezvous 40 s after the others (its default): on 2 loaded cores, with a
# job or a multi-process test running beside, a worker aborted so in CI
# ("Fatal Python error: Aborted" in a sharded step). 600 s bounds a real hang.
_SUITE_FLAGS = ("--xla_force_host_platform_device_count=8",
                "--xla_backend_optimization_level=0",
                "--xla_cpu_collective_call_terminate_timeout_seconds=600")
_FAST_CODEGEN = ("--xla_cpu_use_fusion_emitters=false",
                 "--xla_cpu_parallel_codegen_split_count=1")
# The user's flags without the suite's (xdist's workers inherit the flags this
# file set in their controller).
_USER_XLA_FLAGS = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
                   if flag not in (*_SUITE_FLAGS, *_FAST_CODEGEN)]
os.environ["XLA_FLAGS"] = " ".join(
    [*_USER_XLA_FLAGS, *_SUITE_FLAGS]
    + ([] if _DEFAULT_CODEGEN else list(_FAST_CODEGEN)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

from tests import junit_report  # noqa: E402

# Every program in the persistent cache, however quick to compile: the two
# xdist workers and the jobs tests start compile many of the same programs
# (an entry's unsharded reference, a job and its resume); the job tests took
# 102 s instead of 121 s with it than with a 0.5 s threshold.
_CACHE = ROOT / ".jax_cache"
jax.config.update("jax_compilation_cache_dir", str(_CACHE))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

_CHILD_TIMEOUT_S = 900


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  """Runs a ``default_codegen`` test in a child pytest with XLA:CPU's default
  emitters (this process compiles with the elemental one) and reports its
  outcome, read from the child's JUnit XML report, as this test's."""
  if _DEFAULT_CODEGEN or pyfuncitem.get_closest_marker("default_codegen") is None:
    return None
  env = dict(os.environ, XLA_FLAGS=" ".join(_USER_XLA_FLAGS),
             **{_DEFAULT_CODEGEN_ENV: "1"})
  with tempfile.TemporaryDirectory() as tmp:
    report = pathlib.Path(tmp) / "report.xml"
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}", pyfuncitem.nodeid],
        cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=_CHILD_TIMEOUT_S)
    outcomes = list(junit_report.outcomes(report).values())
  if outcomes == [{"skipped"}]:
    pytest.skip("skipped under XLA:CPU's default emitters (a child pytest)")
  if outcomes == [{"xfailed"}]:
    pytest.xfail("failed as expected under XLA:CPU's default emitters (a child "
                 "pytest)")
  if child.returncode != 0 or outcomes != [set()]:  # one case, passed
    pytest.fail(f"under XLA:CPU's default emitters (a child pytest, exit "
                f"{child.returncode}):\n{child.stdout[-6000:]}{child.stderr[-2000:]}",
                pytrace=False)
  return True
