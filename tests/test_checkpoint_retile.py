"""Quantized optimizer state restored onto a mesh that lays it out otherwise.

``quantized_state`` fits its blocks in one device's shard, so a moment that
is 8-bit codes on one mesh may be kept in float on another (no block fits
its shard there), or be codes in other blocks. Truths: the state as saved
(its codes decoded on the mesh that saved them, or its float moments), the
8-bit codes' step sizes (shardopt/_src/quantization/codes.py's docstring),
and the uninterrupted run's next step on the mesh that saved.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import checkpoints as ck
import partitioning
import shardopt

# (8, 520) split over 'model' on its first dimension: on data=8,model=1 its
# moments are 8-bit codes in (8, 8) blocks, on data=1,model=8 their (1, 520)
# shards fit no block of 32 to 256 elements and stay float32.
_PARAMS = {"w": jnp.linspace(-1.0, 1.0, 8 * 520).reshape(8, 520)}
_QUANTIZED_ON, _FLOAT_ON = "data=8,model=1", "data=1,model=8"
_MOMENTS = ("mu", "nu")


def _tx():
  return shardopt.quantized_state(shardopt.adam(1e-2), bits=8)


def _grads(params, step):
  return jax.tree.map(lambda p: jnp.sin(7.0 * p + step), params)


def _optimizer(mesh_shape, axis_types):
  mesh = partitioning.make_mesh(mesh_shape, axis_types=axis_types)
  shardings = partitioning.named_shardings(mesh, {"w": P("model", None)})
  opt = shardopt.make_sharded_optimizer(_tx(), _PARAMS, shardings)
  return opt, jax.device_put(jax.tree.map(jnp.copy, _PARAMS), shardings)


def _trained(mesh_shape, axis_types):
  """(opt, params, state) after 2 steps on ``mesh_shape``."""
  opt, params = _optimizer(mesh_shape, axis_types)
  state = opt.init(params)
  for step in range(2):
    params, state = opt.update(_grads(params, step), state, params)
  return opt, params, state


def _moment(state, name):
  return getattr(state[0], name)["w"]


def _as_float(leaf) -> np.ndarray:
  return np.asarray(leaf.decode() if isinstance(leaf, shardopt.QuantizedArray) else leaf)


def _within_one_step(got, want, signed):
  """Each value within one step of the 8-bit code it was encoded in: signed
  (companded), ``2 / 127`` of its block's largest magnitude at the coarsest,
  bounded here by the leaf's largest; non-negative (e5m3 minifloat), an
  eighth of the value's octave, so at most ``1/8`` of the value."""
  if signed:
    np.testing.assert_allclose(got, want, rtol=0, atol=2 * np.max(np.abs(want)) / 127)
  else:
    np.testing.assert_allclose(got, want, rtol=1 / 8, atol=0)


def _save_and_continue(directory, saved_on, axis_types):
  """Saves 2 steps trained on ``saved_on``; returns the saved state (on the
  host) and the params of the uninterrupted run's third step."""
  opt, params, state = _trained(saved_on, axis_types)
  with ck.CheckpointManager(directory) as mngr:
    mngr.save(2, {"params": params, "opt_state": state})
    mngr.wait_until_finished()
  saved = jax.device_get({"params": params, "opt_state": state})
  params, _ = opt.update(_grads(params, 2), state, params)
  return saved, jax.device_get(params)


def _restore_and_continue(directory, restored_on, axis_types):
  """(Restored, its target, the params of a third step taken from it)."""
  opt, params = _optimizer(restored_on, axis_types)
  target = {"params": params, "opt_state": opt.init.eval_shape(params)}
  with ck.CheckpointManager(directory, read_only=True) as mngr:
    restored = mngr.restore(target)
  got = jax.tree.map(jnp.copy, restored.state)  # the update donates what it is given
  next_params, _ = opt.update(_grads(got["params"], 2), got["opt_state"], got["params"])
  return restored, target, jax.device_get(next_params)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_codes_saved_on_one_mesh_restore_as_float_where_the_target_keeps_float(tmp_path, axis_types):
  """Saved as 8-bit codes on data=8,model=1, restored onto data=1,model=8
  where the moments stay float32: each moment is the saved codes' values,
  in the target's dtype and sharding, listed as re-encoded, and the next
  step gives the uninterrupted run's params."""
  saved, want_next = _save_and_continue(tmp_path, _QUANTIZED_ON, axis_types)
  restored, target, got_next = _restore_and_continue(tmp_path, _FLOAT_ON, axis_types)
  assert sorted(restored.retiled) == [f"opt_state.0.{m}.w" for m in _MOMENTS]
  for name in _MOMENTS:
    was, like, got = (_moment(s, name) for s in (saved["opt_state"], target["opt_state"],
                                                  restored.state["opt_state"]))
    assert isinstance(was, shardopt.QuantizedArray) and was.tile == (8, 8)
    assert not isinstance(got, shardopt.QuantizedArray)
    assert (got.shape, got.dtype, got.sharding) == (like.shape, like.dtype, like.sharding)
    np.testing.assert_array_equal(np.asarray(got), _as_float(was))
  np.testing.assert_allclose(got_next["w"], want_next["w"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_float_saved_on_one_mesh_restores_as_codes_where_the_target_quantizes(tmp_path, axis_types):
  """Saved in float32 on data=1,model=8, restored onto data=8,model=1 where
  the moments are 8-bit codes: each is encoded in the target's blocks and
  shardings, within one code step of the saved value, listed, and the next
  step's params are the uninterrupted run's within a tenth of the learning
  rate (each moment moved by less than one code step)."""
  saved, want_next = _save_and_continue(tmp_path, _FLOAT_ON, axis_types)
  restored, target, got_next = _restore_and_continue(tmp_path, _QUANTIZED_ON, axis_types)
  assert sorted(restored.retiled) == [f"opt_state.0.{m}.w" for m in _MOMENTS]
  for name in _MOMENTS:
    was, like, got = (_moment(s, name) for s in (saved["opt_state"], target["opt_state"],
                                                  restored.state["opt_state"]))
    assert not isinstance(was, shardopt.QuantizedArray)
    assert isinstance(got, shardopt.QuantizedArray) and got.tile == like.tile == (8, 8)
    assert (got.codes.sharding, got.scales.sharding) == (like.codes.sharding, like.scales.sharding)
    _within_one_step(_as_float(got), np.asarray(was), signed=got.signed)
  np.testing.assert_allclose(got_next["w"], want_next["w"], rtol=0, atol=1e-3)


def _adamw_8bit(mesh_shape, zero, devices=None):
  """(opt, params) of 8-bit AdamW on a (256, 256) param split over 'model'
  on its columns; ZeRO over 'data' where ``zero``; on all devices or
  ``devices``."""
  mesh = partitioning.make_mesh(mesh_shape, devices=devices)
  shardings = partitioning.named_shardings(mesh, {"w": P(None, "model")})
  params = {"w": jax.random.normal(jax.random.key(0), (256, 256))}
  opt = shardopt.make_sharded_optimizer(shardopt.adamw(1e-2, state_bits=8), params, shardings,
                                        shard_state_over="data" if zero else None)
  return opt, jax.device_put(params, shardings)


def test_restore_subtree_restores_quantized_state_onto_another_mesh_as_restore_does(tmp_path):
  """The optimizer state alone (``restore_subtree(..., "opt_state")``),
  saved on data=2,model=4 with ZeRO: onto data=2,model=2 (4 devices), whose
  blocks differ, it is re-tiled and listed as a whole-state ``restore`` re-tiles
  it (bit-equal to that), each value within one code step of the saved
  one; onto the saving mesh it is read bit for bit and nothing is listed."""
  opt, params = _adamw_8bit("data=2,model=4", zero=True)
  state = opt.init(params)
  params, state = opt.update(_grads(params, 0), state, params)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, {"params": params, "opt_state": state})
    mngr.wait_until_finished()
  saved = jax.device_get(state)
  other, other_params = _adamw_8bit("data=2,model=2", zero=False, devices=jax.devices()[:4])
  target = other.init.eval_shape(other_params)
  with ck.CheckpointManager(tmp_path, read_only=True) as mngr:
    alone = mngr.restore_subtree(target, "opt_state")
    whole = mngr.restore({"params": other_params, "opt_state": target})
    same = mngr.restore_subtree(opt.init.eval_shape(params), "opt_state")
    moment = mngr.restore_subtree(_moment(target, "mu"), "opt_state.0.mu.w")  # one leaf alone
  assert sorted(alone.retiled) == sorted(whole.retiled) == [f"opt_state.0.{m}.w" for m in _MOMENTS]
  assert moment.retiled == ("opt_state.0.mu.w",)
  for got, want in zip(jax.tree.leaves(moment.state), jax.tree.leaves(_moment(alone.state, "mu"))):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  assert jax.tree.structure(alone.state) == jax.tree.structure(target)
  for got, want, like in zip(jax.tree.leaves(alone.state), jax.tree.leaves(whole.state["opt_state"]),
                             jax.tree.leaves(target)):
    assert got.sharding == like.sharding
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for name in _MOMENTS:
    got, was = _moment(alone.state, name), _moment(saved, name)
    assert got.tile != was.tile
    _within_one_step(_as_float(got), _as_float(was), signed=got.signed)
  assert same.retiled == ()
  for got, want in zip(jax.tree.leaves(same.state), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_reinit_keeps_the_targets_fresh_quantized_state_whose_blocks_differ(tmp_path):
  """``optimizer_changed="reinit"`` into a target holding its own fresh
  8-bit state in other blocks than the saved one: the params are read, the
  optimizer state is the target's (the re-tiling stand-ins of the state it
  does not read made it refuse the target as abstract)."""
  opt, params = _adamw_8bit("data=2,model=4", zero=True)
  state = opt.init(params)
  params, state = opt.update(_grads(params, 0), state, params)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, {"params": params, "opt_state": state})
    mngr.wait_until_finished()
  other, other_params = _adamw_8bit("data=2,model=2", zero=False, devices=jax.devices()[:4])
  fresh = other.init(other_params)
  assert _moment(fresh, "mu").tile != _moment(state, "mu").tile
  with ck.CheckpointManager(tmp_path, read_only=True) as mngr:
    restored = mngr.restore({"params": other_params, "opt_state": fresh}, optimizer_changed="reinit")
  np.testing.assert_array_equal(np.asarray(restored.state["params"]["w"]), np.asarray(params["w"]))
  assert restored.retiled == ()
  assert jax.tree.structure(restored.state["opt_state"]) == jax.tree.structure(fresh)
  for got, want in zip(jax.tree.leaves(restored.state["opt_state"]), jax.tree.leaves(fresh)):
    assert got is want
