"""Optimizer state in host memory: make_sharded_optimizer(state_memory_kind=...).

Truths: each leaf's sharding after init and after steps; the same optimizer
with its state in device memory (the numbers); the state's bytes read from
``addressable_shards``; a checkpoint read back.
"""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import checkpoints
import shardopt

LAYOUT = {
    "embed": ((256, 64), P("model", None)),
    "wi": ((64, 256), P(None, "model")),
    "norm": ((64,), P()),
}
_KINDS = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _mesh(kind="auto", shape=(2, 4)):
  """A mesh of ``shape`` on the first of the 8 devices."""
  return jax.make_mesh(shape, ("data", "model"), axis_types=(_KINDS[kind],) * 2,
                       devices=jax.devices()[:shape[0] * shape[1]])


def _shardings(mesh):
  return {name: NamedSharding(mesh, spec) for name, (_, spec) in LAYOUT.items()}


def _params(mesh):
  keys = jax.random.split(jax.random.key(0), len(LAYOUT))
  host = {name: jax.random.normal(k, shape) for k, (name, (shape, _)) in
          zip(keys, LAYOUT.items())}
  return jax.device_put(host, _shardings(mesh))


def _loss(params, batch):
  return sum(jnp.sum(jnp.sin(p) * batch) for p in jax.tree.leaves(params))


def _memory_kinds(state) -> set[str]:
  return {leaf.sharding.memory_kind for leaf in jax.tree.leaves(state)}


def _run(tx, mesh, memory_kind):
  """(state after init, after 3 updates, after 3 train steps), each with
  its params; ZeRO over data."""
  opt = shardopt.make_sharded_optimizer(tx, _params(mesh), _shardings(mesh),
                                        shard_state_over="data",
                                        state_memory_kind=memory_kind)
  params = _params(mesh)
  state = opt.init(params)
  initial = jax.device_get(state)
  kinds = [_memory_kinds(state)]
  grad = jax.jit(jax.grad(_loss))
  through_update = (params, state)
  for i in range(3):
    p, s = through_update
    through_update = opt.update(grad(p, jnp.float32(i + 1)), s, p)
  kinds.append(_memory_kinds(through_update[1]))
  train_step = opt.train_step(_loss)
  through_train_step = (_params(mesh), opt.init(_params(mesh)))
  for i in range(3):
    through_train_step = train_step(*through_train_step, jnp.float32(i + 1))[:2]
  kinds.append(_memory_kinds(through_train_step[1]))
  return opt, initial, kinds, jax.device_get(through_update), jax.device_get(through_train_step)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["auto", "explicit"])
@pytest.mark.parametrize("bits", [None, 8])
def test_host_state_stays_on_host_and_equals_device_state(kind, bits):
  """Every state leaf in pinned_host memory after init and after 3 steps
  of update and of train_step; params and state equal to the same run with
  the state in device memory within 1e-6."""
  mesh = _mesh(kind)
  tx = shardopt.adamw(1e-2, weight_decay=0.1, state_bits=bits)
  opt, initial, kinds, update, train = _run(tx, mesh, "pinned_host")
  assert kinds == [{"pinned_host"}] * 3
  assert all(s.memory_kind == "pinned_host" for s in jax.tree.leaves(opt.state_shardings))
  _, want_initial, want_kinds, want_update, want_train = _run(tx, mesh, None)
  assert want_kinds == [{"device"}] * 3
  for got, want in ((initial, want_initial), (update, want_update), (train, want_train)):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64),
                                 rtol=1e-6, atol=1e-6 * float(np.max(np.abs(b), initial=0)))


def _state_bytes(state, skip="") -> int:
  """Bytes of the state over all devices (what a step moves each way),
  leaving out leaves whose path names ``skip``."""
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  return sum(shard.data.nbytes for path, leaf in leaves
             if not skip or skip not in jax.tree_util.keystr(path)
             for shard in leaf.addressable_shards)


def test_eight_bit_state_moves_a_quarter_of_the_bytes():
  """A step reads the state from host memory and writes it back: its bytes
  each way. 8-bit moments of the matrices (codes and scales) are 0.254x
  float32's; with the norm's moments (64 elements, kept float32 by
  min_size, replicated) 0.265x."""
  mesh = _mesh()
  moved, matrices = {}, {}
  for bits in (None, 8):
    opt = shardopt.make_sharded_optimizer(
        shardopt.adamw(1e-2, state_bits=bits), _params(mesh), _shardings(mesh),
        shard_state_over="data", state_memory_kind="pinned_host")
    state = opt.init(_params(mesh))
    moved[bits], matrices[bits] = _state_bytes(state), _state_bytes(state, skip="norm")
  assert 0.25 <= matrices[8] / matrices[None] <= 0.255, matrices
  assert moved[8] / moved[None] <= 0.27, moved


@pytest.mark.parametrize("tx", [shardopt.adamw(1e-2), shardopt.sgd(1e-2)], ids=["adamw", "sgd"])
@pytest.mark.parametrize("kind", ["hbm", "PINNED_HOST"])
def test_a_memory_kind_the_devices_lack_is_an_error_naming_theirs(tx, kind):
  """Checked against the params' devices: sgd's state has no leaves to carry a mesh, and an
  unknown kind was accepted for it."""
  mesh = _mesh()
  with pytest.raises(ValueError, match=f"state_memory_kind='{kind}'.*pinned_host"):
    shardopt.make_sharded_optimizer(tx, _params(mesh), _shardings(mesh), state_memory_kind=kind)


def test_host_state_checkpoint_restores_into_host_memory(tmp_path):
  mesh = _mesh()
  opt = shardopt.make_sharded_optimizer(shardopt.adamw(1e-2, state_bits=8), _params(mesh),
                                        _shardings(mesh), shard_state_over="data",
                                        state_memory_kind="pinned_host")
  params = _params(mesh)
  params, state = opt.update(jax.tree.map(jnp.ones_like, params), opt.init(params), params)
  saved = jax.device_get(state)
  with checkpoints.CheckpointManager(tmp_path) as manager:
    manager.save(1, {"opt_state": state}, force=True)
    manager.wait_until_finished()
    target = jax.tree.map(lambda t, s: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s),
                          jax.eval_shape(opt.init, params), opt.state_shardings)
    restored = manager.restore({"opt_state": target}).state["opt_state"]
  assert _memory_kinds(restored) == {"pinned_host"}
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _restore_target(opt, params):
  return jax.tree.map(lambda t, s: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s),
                      jax.eval_shape(opt.init, params), opt.state_shardings)


@pytest.mark.parametrize("kind", ["auto", "explicit"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_host_state_restores_onto_a_mesh_with_other_blocks(tmp_path, kind, bits):
  """Saved on (2, 4), restored onto (2, 2) (4 devices) with the state in host
  memory: the leaves whose blocks differ there are re-tiled (listed), every leaf
  lands in pinned_host memory, and the state equals, bit for bit, the same
  checkpoint restored into device memory (whose re-tiled values
  ``test_quantized_state`` checks against the saved ones)."""
  tx = shardopt.adamw(1e-2, state_bits=bits)
  mesh = _mesh(kind)
  opt = shardopt.make_sharded_optimizer(tx, _params(mesh), _shardings(mesh),
                                        shard_state_over="data", state_memory_kind="pinned_host")
  params = _params(mesh)
  params, state = opt.update(jax.tree.map(jnp.ones_like, params), opt.init(params), params)
  with checkpoints.CheckpointManager(tmp_path) as manager:
    manager.save(1, {"opt_state": state}, force=True)
    manager.wait_until_finished()
  other = _mesh(kind, shape=(2, 2))
  restored = {}
  for memory_kind in ("pinned_host", None):
    opt = shardopt.make_sharded_optimizer(tx, _params(other), _shardings(other),
                                          shard_state_over="data", state_memory_kind=memory_kind)
    with checkpoints.CheckpointManager(tmp_path, read_only=True) as manager:
      restored[memory_kind] = manager.restore({"opt_state": _restore_target(opt, _params(other))})
  on_host, on_device = restored["pinned_host"], restored[None]
  assert on_host.retiled and on_host.retiled == on_device.retiled
  assert _memory_kinds(on_host.state) == {"pinned_host"}
  for a, b in zip(jax.tree.leaves(on_host.state), jax.tree.leaves(on_device.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
