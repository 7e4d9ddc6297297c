"""scale_by_sm3 against optax and by hand, and the shardings of its covers."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle
from tests.test_factorized import (
    abstract_init, assert_update_keeps_specs, spec_of)


def _tree_without_scalar():
  """optax's SM3 raises IndexError on scalar params: make it a (1,) vector."""
  params = oracle.mixed_tree()
  params["scalar"] = params["scalar"].reshape(1)
  return params


CASES = [dict(), dict(b1=0.5, b2=0.9, eps=1e-6), dict(b1=0.0)]


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("kwargs", CASES)
def test_matches_optax(kwargs, jit):
  oracle.assert_matches_optax(
      shardopt.scale_by_sm3(**kwargs), optax.scale_by_sm3(**kwargs),
      params=_tree_without_scalar(), jit=jit, with_params=jit)


def test_state_equals_optax():
  params = _tree_without_scalar()
  ours, theirs = shardopt.scale_by_sm3(), optax.scale_by_sm3()
  our_state, their_state = ours.init(params), theirs.init(params)
  for grads in oracle.gradient_stream(params, 3):
    _, our_state = ours.update(grads, our_state)
    _, their_state = theirs.update(grads, their_state)
  assert type(our_state).__name__ == "ScaleBySM3State"
  oracle.assert_trees_close(tuple(our_state), tuple(their_state))


def test_matrix_and_scalar_by_hand():
  """Two steps of SM3-II with b1=0 on a 2x2 matrix and on a scalar."""
  tx = shardopt.scale_by_sm3(b1=0.0, eps=0.0)
  params = {"m": jnp.zeros((2, 2)), "s": jnp.zeros(())}
  g1 = {"m": jnp.array([[1.0, 2.0], [0.0, 3.0]]), "s": jnp.array(2.0)}
  g2 = {"m": jnp.array([[1.0, 1.0], [1.0, 1.0]]), "s": jnp.array(1.0)}
  state = tx.init(params)
  u1, state = tx.update(g1, state)
  # First step: accumulator = g**2, update = sign(g) (0 where g == 0).
  np.testing.assert_allclose(u1["m"], [[1.0, 1.0], [0.0, 1.0]])
  np.testing.assert_allclose(u1["s"], 1.0)
  np.testing.assert_allclose(state.mu["m"][0], [4.0, 9.0])  # row maxima
  np.testing.assert_allclose(state.mu["m"][1], [1.0, 9.0])  # column maxima
  u2, state = tx.update(g2, state)
  # min(row cover, col cover) + g**2 = [[1, 4], [1, 9]] + 1.
  np.testing.assert_allclose(
      u2["m"], 1 / np.sqrt([[2.0, 5.0], [2.0, 10.0]]), rtol=1e-6)
  np.testing.assert_allclose(u2["s"], 1 / np.sqrt(5.0), rtol=1e-6)


def test_covers_keep_mesh_axes():
  tx = shardopt.scale_by_sm3()
  params, state = abstract_init(tx, {
      "wide": ((8, 16), ("data", "model")),
      "conv": ((3, 8, 16), (None, "model", "data")),
      "bias": ((16,), ("model",)),
  })
  assert [spec_of(c) for c in state.mu["wide"]] == [("data",), ("model",)]
  assert [c.shape for c in state.mu["conv"]] == [(3,), (8,), (16,)]
  assert [spec_of(c) for c in state.mu["conv"]] == [
      (None,), ("model",), ("data",)]
  assert [spec_of(c) for c in state.mu["bias"]] == [("model",)]
  assert spec_of(state.nu["wide"]) == ("data", "model")
  assert_update_keeps_specs(tx, params, state, ["mu", "nu"])


def test_complex_params_rejected_with_path():
  params = {"layer": {"w": jnp.ones((2, 2), jnp.complex64)}}
  with pytest.raises(ValueError, match=r"\['layer'\]\['w'\]"):
    shardopt.scale_by_sm3().init(params)
