"""State leaves with no elements (GaLore keeps a (0, 0) projector for every
param it does not project): ZeRO plans them and checkpoints save and restore
them, onto another mesh too.

Truths: the same optimizer without ZeRO (the numbers), the arrays saved
(read back bit for bit), the target's shapes, dtypes and shardings.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import checkpoints
import partitioning
import shardopt

SPECS = {"w": P(None, "model"), "b": P()}


def _params(mesh):
  k1, k2 = jax.random.split(jax.random.key(0))
  params = {"w": jax.random.normal(k1, (16, 64)), "b": jax.random.normal(k2, (64,))}
  return jax.device_put(params, partitioning.named_shardings(mesh, SPECS))


def _mesh(shape):
  return partitioning.make_mesh({"data": shape[0], "model": shape[1]},
                                devices=jax.devices()[:shape[0] * shape[1]])


def _galore():
  return shardopt.contrib.galore(1e-2, rank=4, update_proj_gap=2)


def _trained(mesh, zero):
  opt = shardopt.make_sharded_optimizer(_galore(), _params(mesh),
                                        partitioning.named_shardings(mesh, SPECS),
                                        shard_state_over=zero, min_shard_bytes=0)
  params = _params(mesh)
  state = opt.init(params)
  for step in range(3):
    grads = jax.tree.map(lambda p: jnp.sin(p * (step + 1)), params)
    params, state = opt.update(grads, state, params)
  return opt, params, state


def test_zero_plans_an_empty_leaf_and_trains_as_without():
  """Within 1e-4 (GaLore's projection sums its products in another order
  when ZeRO splits them)."""
  mesh = _mesh((4, 2))
  opt, params, state = _trained(mesh, "data")
  empty = [leaf for leaf in opt.plan.leaves if 0 in leaf.shape]
  assert [tuple(leaf.shape) for leaf in empty] == [(0, 0)]  # b's projector
  _, want_params, want_state = _trained(mesh, None)
  for got, want in zip(jax.tree.leaves((params, state)), jax.tree.leaves((want_params, want_state))):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def _with_empties(mesh):
  """A state holding empty leaves of every kind a checkpoint takes: a
  sharded array, a numpy array, a PRNG key array."""
  return {"sharded": jax.device_put(jnp.zeros((0, 8)), NamedSharding(mesh, P(None, "model"))),
          "numpy": np.zeros((3, 0), np.int32),
          "keys": jax.random.split(jax.random.key(1), 0),
          "full": jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("data")))}


def _target(tree):
  return jax.tree.map(lambda x: x if isinstance(x, np.ndarray) else
                      jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


@pytest.mark.parametrize("restored_on", [(2, 4), (4, 2), (1, 1)])
def test_empty_leaves_save_and_restore_onto_other_meshes(tmp_path, restored_on):
  """GaLore's state and hand-made empty leaves, saved on (2, 4): the layout
  lists the empty ones, the restore makes them in the target's shape, dtype
  and sharding, and every other leaf reads back bit for bit."""
  mesh = _mesh((2, 4))
  _, params, state = _trained(mesh, "data")
  saved = {"params": params, "opt_state": state, "extra": _with_empties(mesh)}
  with checkpoints.CheckpointManager(tmp_path) as manager:
    manager.save(3, saved, force=True)
    manager.wait_until_finished()
    layout = manager.saved_layout(3)
  assert layout["extra.sharded"]["shape"] == [0, 8]
  assert layout["opt_state.0.projector.b"]["shape"] == [0, 0]
  other = _mesh(restored_on)
  opt = shardopt.make_sharded_optimizer(_galore(), _params(other),
                                        partitioning.named_shardings(other, SPECS),
                                        shard_state_over="data", min_shard_bytes=0)
  target = {"params": _target(_params(other)),
            "opt_state": jax.tree.map(lambda t, s: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s),
                                      jax.eval_shape(opt.init, _params(other)), opt.state_shardings),
            "extra": _target(_with_empties(other))}
  with checkpoints.CheckpointManager(tmp_path, read_only=True) as manager:
    restored = manager.restore(target).state
  assert jax.tree.structure(restored) == jax.tree.structure(target)
  for got, want, like in zip(jax.tree.leaves(restored), jax.tree.leaves(saved),
                             jax.tree.leaves(target)):
    assert (got.shape, got.dtype) == (like.shape, like.dtype)
    if not isinstance(like, np.ndarray):
      assert got.sharding == like.sharding
    if jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
      got, want = jax.random.key_data(got), jax.random.key_data(want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
