"""benchmarks/minimal_quantized.py times working AdamW updates: its minimal
forms, written directly in jax.numpy, against shardopt's AdamW."""

import functools
import types

import jax
import numpy as np
import pytest

from benchmarks import minimal_quantized as bench
from benchmarks import one_device
import shardopt


@functools.cache
def _problem():
  """(params, the check's noisy gradients, shardopt float32's moves on them),
  built once: the tests copy what they update."""
  args = types.SimpleNamespace(leaves=2, rows=8, cols=512)
  params, grads, shardings = one_device.problem(args)
  gradients = bench._check_gradients(grads)
  reference = bench._moves(shardopt.make_sharded_optimizer(
      one_device.optimizer(None), params, shardings), params, gradients)
  return params, gradients, reference


def _minimal_moves(name, params, gradients):
  form, block = bench.MINIMAL[name]
  return bench._moves(bench._Minimal(form, block), params, gradients)


def test_minimal_float32_moves_the_params_as_shardopts_adamw():
  params, gradients, reference = _problem()
  moves = _minimal_moves("minimal float32", params, gradients)
  # A move is a difference of params near 1: float32 rounds it to within
  # one of their ulps (1.2e-7), moves are near 1e-3.
  for got, want in zip(jax.tree.leaves(moves), jax.tree.leaves(reference)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-7)


def test_minimal_quantized_forms_follow_float32_within_their_codes():
  params, gradients, reference = _problem()
  eight = _minimal_moves("minimal 8-bit", params, gradients)
  assert bench._move_error(eight, reference) < 0.1
  four = _minimal_moves("minimal 4-bit", params, gradients)
  assert bench._move_error(four, reference) < 0.5
  # The same codes in one byte per element: the same params, bit for bit.
  joint = _minimal_moves("minimal 4-bit, one byte per element", params, gradients)
  for a, b in zip(jax.tree.leaves(four), jax.tree.leaves(joint)):
    np.testing.assert_array_equal(a, b)


_BOUNDED = ["minimal 4-bit, scales bounded from the last scales",
            "minimal 4-bit, scales bounded from the stored maxima"]


@pytest.mark.parametrize("name", _BOUNDED)
def test_bounded_scales_hold_the_moments_they_store(name):
  """The scales set before the moments are updated are at least the
  updated moments' block maxima: no value is clipped."""
  params, gradients, _ = _problem()
  form, block = bench.MINIMAL[name]
  opt = bench._Minimal(form, block)
  own = jax.tree.map(np.copy, params)
  state = opt.init(own)
  for noisy in gradients:
    before = {k: bench._joint_decode(*s) for k, s in state[1].items()}
    own, state = opt.update(noisy, state, own)
    for k, (_, m_scale, v_scale) in state[1].items():
      m, v = bench._moments(bench._blocks(noisy[k], block), *before[k])
      assert np.all(np.abs(m) <= m_scale * (1 + 1e-6))
      assert np.all(v <= v_scale * (1 + 1e-6))


def test_a_looser_bound_costs_resolution():
  """Scales bounded from the last scales drift loose under noisy
  gradients; the stored maxima keep the error near the exact scales'."""
  params, gradients, reference = _problem()
  exact, tight, loose = (
      bench._move_error(_minimal_moves(name, params, gradients), reference)
      for name in ["minimal 4-bit, one byte per element", *reversed(_BOUNDED)])
  assert exact < tight < 1.2 * exact < loose


def test_the_results_table_has_a_row_per_update(tmp_path):
  args = types.SimpleNamespace(leaves=1, rows=8, cols=256, rounds=1, steps=1)
  rows = bench.measure(args)
  results = tmp_path / "minimal.md"
  bench.write_results(results, "python -m benchmarks.minimal_quantized",
                      args, rows)
  text = results.read_text()
  table = [line for line in text.splitlines() if line.startswith("| ")]
  names = [row.split(" | ")[0].removeprefix("| ") for row in table[1:]]
  assert names == ["shardopt float32", "shardopt 8-bit companded",
                   "shardopt 4-bit companded", *bench.MINIMAL]
  assert "Command: `python -m benchmarks.minimal_quantized`" in text
