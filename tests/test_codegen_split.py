"""The suite's two codegens (conftest): unmarked tests compile with XLA:CPU's
elemental emitter and each program's LLVM code in one part,
``default_codegen`` tests in a child pytest with XLA:CPU's defaults."""

import os
import pathlib
import subprocess
import sys

import pytest

from tests import junit_report

_FAST_CODEGEN = {"--xla_cpu_use_fusion_emitters=false",
                 "--xla_cpu_parallel_codegen_split_count=1"}


def test_unmarked_tests_compile_with_the_elemental_emitter_in_one_part():
  assert _FAST_CODEGEN <= set(os.environ["XLA_FLAGS"].split())


@pytest.mark.default_codegen
def test_marked_tests_run_in_a_child_with_the_default_emitters():
  assert os.environ["SHARDOPT_TESTS_DEFAULT_CODEGEN"] == "1"
  assert not _FAST_CODEGEN & set(os.environ["XLA_FLAGS"].split())
  assert "--xla_force_host_platform_device_count=8" in os.environ["XLA_FLAGS"].split()


_CHILD_OUTCOMES = '''
import pytest


@pytest.mark.default_codegen
def test_passes():
  pass


@pytest.mark.default_codegen
def test_fails():
  assert False


@pytest.mark.default_codegen
def test_skips():
  pytest.skip("skipped in the child")


@pytest.mark.default_codegen
@pytest.mark.xfail(strict=True, raises=ZeroDivisionError, reason="expected")
def test_xfails():
  1 / 0
'''


def test_a_marked_tests_outcome_in_the_child_is_its_outcome(tmp_path):
  """A suite of the conftest and four marked tests that pass, fail, skip and
  fail as expected in the child pytest: the parent reports each outcome as
  itself."""
  (tmp_path / "tests").mkdir()
  for helper in ("__init__.py", "conftest.py", "junit_report.py"):
    (tmp_path / "tests" / helper).write_text(
        (pathlib.Path(__file__).parent / helper).read_text())
  (tmp_path / "tests" / "test_outcomes.py").write_text(_CHILD_OUTCOMES)
  (tmp_path / "pytest.ini").write_text(
      "[pytest]\nmarkers =\n  default_codegen: runs in a child pytest\n")
  env = {k: v for k, v in os.environ.items()
         if k not in ("SHARDOPT_TESTS_DEFAULT_CODEGEN", "PYTEST_XDIST_WORKER",
                      "PYTEST_ADDOPTS")}
  report = tmp_path / "parent.xml"
  subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  f"--junitxml={report}", "tests/test_outcomes.py"],
                 cwd=tmp_path, env=env, capture_output=True, timeout=300)
  assert junit_report.outcomes(report) == {
      "test_passes": set(), "test_fails": {"failure"}, "test_skips": {"skipped"},
      "test_xfails": {"xfailed"}}
