"""The suite's two codegens (conftest): unmarked tests compile with XLA:CPU's
elemental emitter, ``default_codegen`` tests in a child pytest with the
default emitters."""

import os

import pytest

_ELEMENTAL = "--xla_cpu_use_fusion_emitters=false"


def test_unmarked_tests_compile_with_the_elemental_emitter():
  assert _ELEMENTAL in os.environ["XLA_FLAGS"].split()


@pytest.mark.default_codegen
def test_marked_tests_run_in_a_child_with_the_default_emitters():
  assert os.environ["SHARDOPT_TESTS_DEFAULT_CODEGEN"] == "1"
  assert _ELEMENTAL not in os.environ["XLA_FLAGS"].split()
  assert "--xla_force_host_platform_device_count=8" in os.environ["XLA_FLAGS"].split()
