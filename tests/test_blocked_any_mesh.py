"""Shampoo and SOAP are the same optimizer on any number of devices.

Their blocks come from ``block_size`` and the params alone: the state has the
same shapes on 1, 4 and 8 devices, the steps the same numbers, a checkpoint
written on 8 devices resumes on 4, and a plan for 256 abstract devices
traces. Every block's work runs whole on the device holding it, so where the
blocks tile the shards the compiled step has the collectives of an
elementwise optimizer's step and no other. Newton's inverse roots stay finite
on rank-1 statistics.
"""

import collections

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import checkpoints
import partitioning
from partitioning import collectives
import shardopt
from shardopt.contrib import _matrix_roots
from tests import blocked_layout
from tests import test_memory_plan_7b

_SHAPES = {"w": (16, 32), "k": (8, 4, 32), "b": (32,)}
_SPECS = {"w": P("data", "model"), "k": P("data", None, "model"), "b": P("model")}
_BLOCK = 8  # w: 2 x 4 blocks of 8 x 8; k: 1 x 1 x 4 of 8 x 4 x 8 (dim 0 straddles)

_OPTIMIZERS = {
    "shampoo": lambda: shardopt.contrib.shampoo(0.01, block_size=_BLOCK,
                                                precondition_frequency=2),
    "shampoo_newton": lambda: shardopt.contrib.shampoo(
        0.01, block_size=_BLOCK, precondition_frequency=2,
        inverse_root_method="newton"),
    "soap": lambda: shardopt.contrib.soap(0.01, block_size=_BLOCK,
                                          precondition_frequency=2),
}


@pytest.fixture(autouse=True)
def _fail_on_hang():
  with blocked_layout.exit_after(300):
    yield


def _mesh(devices: int, axis_type="Auto"):
  shape = {4: (2, 2), 8: (2, 4)}[devices]
  return jax.make_mesh(shape, ("data", "model"), devices=jax.devices()[:devices],
                       axis_types=(getattr(jax.sharding.AxisType, axis_type),) * 2)


def _host_params():
  keys = jax.random.split(jax.random.PRNGKey(0), len(_SHAPES))
  return {k: np.asarray(jax.random.normal(key, s))
          for key, (k, s) in zip(keys, _SHAPES.items())}


def _grads(params, step):
  return jax.tree.map(lambda p: np.sin(3.0 * p + step).astype(np.float32), params)


def _run(tx, devices: int, steps: int):
  """(state shapes, updates of each step) of ``tx.update`` jitted on
  ``devices`` devices (1: no mesh; else params, grads and state in their
  planned shardings); the grads come from the host, the same on every mesh."""
  params = _host_params()
  if devices == 1:
    place, update = (lambda tree: tree), jax.jit(tx.update)
    state = jax.jit(tx.init)(params)
  else:
    shardings = {k: NamedSharding(_mesh(devices), s) for k, s in _SPECS.items()}
    opt = shardopt.make_sharded_optimizer(tx, params, shardings, donate=False)
    place = lambda tree: jax.device_put(tree, shardings)
    update = jax.jit(tx.update, in_shardings=(shardings, opt.state_shardings, shardings),
                     out_shardings=(shardings, opt.state_shardings))
    state = opt.init(place(params))
  shapes = jax.tree.map(jnp.shape, state)
  history = []
  for t in range(steps):
    updates, state = update(place(_grads(params, t)), state, place(params))
    updates = jax.tree.map(np.asarray, updates)
    params = jax.tree.map(np.add, params, updates)
    history.append(updates)
  return shapes, history


@pytest.mark.default_codegen
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_same_state_shapes_and_updates_on_1_4_and_8_devices(name):
  """Refreshes at steps 1 and 3; every update equal to the one-device
  update, bit for bit (each block's work is the same compiled code on any
  number of devices)."""
  tx = _OPTIMIZERS[name]()
  shapes, want = _run(tx, 1, 4)
  for devices in (4, 8):
    got_shapes, got = _run(tx, devices, 4)
    assert got_shapes == shapes, devices
    for step, (g, w) in enumerate(zip(got, want), start=1):
      for k in w:
        np.testing.assert_array_equal(g[k], w[k], err_msg=f"{devices} devices, step {step}, {k}")


def test_shampoo_resumes_from_8_devices_onto_4(tmp_path):
  """Two steps on 8 devices, saved; restored onto a 4-device mesh, the third
  step equals the third step of the run that went on on 8 devices."""
  tx = _OPTIMIZERS["shampoo"]()

  def optimizer(devices):
    shardings = {k: NamedSharding(_mesh(devices), s) for k, s in _SPECS.items()}
    return shardopt.make_sharded_optimizer(tx, _host_params(), shardings, donate=False)

  eight, four = optimizer(8), optimizer(4)
  params = jax.device_put(_host_params(), eight.param_shardings)
  state = eight.init(params)
  for t in range(2):
    params, state = eight.update(jax.device_put(_grads(jax.device_get(params), t),
                                                eight.param_shardings), state, params)
  with checkpoints.CheckpointManager(tmp_path / "ckpt") as manager:
    manager.save(2, {"params": params, "opt_state": state})
    manager.wait_until_finished()
    target = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        {"params": params, "opt_state": state},
        {"params": four.param_shardings, "opt_state": four.state_shardings})
    restored = manager.restore(target).state
  grads = _grads(jax.device_get(params), 2)
  want, _ = eight.update(jax.device_put(grads, eight.param_shardings), state, params)
  got, _ = four.update(jax.device_put(grads, four.param_shardings),
                       restored["opt_state"], restored["params"])
  assert {s.device_set.__len__() for s in jax.tree.leaves(
      jax.tree.map(lambda x: x.sharding, got))} == {4}
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=0,
                               atol=1e-6 * float(np.abs(np.asarray(want[k])).max()),
                               err_msg=k)


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_plan_for_7b_on_256_abstract_devices(name):
  """LLaMA-7B laid out fsdp_tp on fsdp=64 x model=4 abstract devices, the
  default blocks of 64 (which tile the 64-long d_model shards and the mlp's
  2752-long ones): the state has the shapes it has unsharded, no leaf is
  less sharded than its param, and the most bytes on a device are within 5%
  of the total over 256."""
  mesh = partitioning.make_abstract_mesh({"fsdp": 64, "model": 4})
  shapes = test_memory_plan_7b.llama_7b()
  abstract = partitioning.sharded_abstract_params(
      partitioning.decoder_rules("fsdp_tp"), shapes, mesh)
  tx = getattr(shardopt.contrib, name)(1e-4)
  plan = blocked_layout.plan_without_warnings(
      tx, abstract, jax.tree.map(lambda p: p.sharding, abstract))
  unsharded = jax.eval_shape(tx.init, shapes)
  assert [l.shape for l in plan.leaves] == [l.shape for l in jax.tree.leaves(unsharded)]
  stats = [l for l in plan.leaves if "['layers_0']['mlp']['wi_0']" in l.path
           and ".stats" in l.path]
  assert [l.shape for l in stats] == [(64, 172, 64, 64)] * 2
  assert {l.spec for l in stats} == {P("fsdp", "model", None, None)}
  total = sum(np.prod(l.shape) * l.dtype.itemsize for l in plan.leaves)
  assert plan.bytes_per_device <= 1.05 * total / 256


def test_newton_stays_finite_on_rank_one_gradients():
  """400 blocks of rank-1 statistics, scales 1e-11 to 1e5, at the default
  eps: every inverse root finite and within 2% of float64's (eigh in
  float32 is 5% off here); then Shampoo with Newton on rank-1 gradients for
  6 steps: every update and every state leaf finite."""
  rng = np.random.default_rng(0)
  b, count = 16, 400
  u = rng.standard_normal((count, b)) * np.exp(rng.uniform(-9, 9, (count, 1)))
  stats = (1e-3 * u[:, :, None] * u[:, None, :]).astype(np.float32)
  got = np.asarray(jax.jit(lambda a: _matrix_roots.inverse_root(a, 4, 1e-6, "newton"))(stats))
  assert np.isfinite(got).all()
  for a, root in zip(stats.astype(np.float64), got):
    values, vectors = np.linalg.eigh(a)
    values = np.maximum(values, 0.0) + 1e-6 * values.max()
    want = (vectors * values ** -0.25) @ vectors.T
    np.testing.assert_allclose(root, want, atol=0.02 * np.abs(want).max())

  tx = shardopt.contrib.shampoo(0.1, block_size=b, precondition_frequency=1,
                                inverse_root_method="newton", grafting="none")
  params = {"w": jnp.zeros((20 * b, b))}
  state, update = tx.init(params), jax.jit(tx.update)
  for _ in range(6):
    u = rng.standard_normal((20, b, 1)) * np.exp(rng.uniform(-9, 9, (20, 1, 1)))
    v = rng.standard_normal((20, 1, b))
    grads = {"w": (u * v).reshape(20 * b, b).astype(np.float32)}
    updates, state = update(grads, state, params)
    for leaf in jax.tree.leaves((updates, state)):
      assert np.isfinite(np.asarray(leaf)).all()


def test_newton_keeps_the_previous_root_where_it_fails():
  """A statistic with a NaN: its block keeps the previous preconditioner,
  the other block gets its root."""
  stats = np.stack([np.eye(4) * 2.0, np.full((4, 4), np.nan)]).astype(np.float32)
  previous = np.stack([np.eye(4) * 5.0] * 2).astype(np.float32)
  got = np.asarray(_matrix_roots.inverse_root(jnp.asarray(stats), 2, 1e-6, "newton",
                                              previous=jnp.asarray(previous)))
  np.testing.assert_allclose(got[0], np.eye(4) * (2.0 * (1 + 1e-6)) ** -0.5, rtol=1e-5)
  np.testing.assert_array_equal(got[1], previous[1])


def _collectives(tx, axis_type, spec, zero):
  the_mesh = _mesh(8, axis_type)
  params = {"w": jax.ShapeDtypeStruct((16, 32), jnp.float32)}
  shardings = {"w": NamedSharding(the_mesh, spec)}
  opt = shardopt.make_sharded_optimizer(tx, params, shardings, shard_state_over=zero,
                                        min_shard_bytes=0)  # the 2 KiB matrix split too
  state = jax.tree.map(lambda l, s: jax.ShapeDtypeStruct(l.shape, l.dtype, sharding=s),
                       jax.eval_shape(tx.init, params), opt.state_shardings)
  params = {"w": jax.ShapeDtypeStruct((16, 32), jnp.float32, sharding=shardings["w"])}
  text = opt.update.lower(params, state, params).compile().as_text()
  return collections.Counter(c.kind for c in collectives.collectives(text))


@pytest.mark.parametrize("axis_type", ["Auto", "Explicit"])
@pytest.mark.parametrize("spec, zero", [(P("data", "model"), None),
                                        (P(None, "model"), "data")],
                         ids=["fsdp_tp", "tp_zero"])
@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_no_collective_beyond_an_elementwise_step(name, spec, zero, axis_type):
  """A (16, 32) matrix in blocks of 8 (which tile its shards), eigh and
  Newton refreshes compiled in: the step's collectives, kind by kind, are
  those of AdamW's step on the same layout (none without ZeRO)."""
  got = _collectives(_OPTIMIZERS[name](), axis_type, spec, zero)
  want = _collectives(shardopt.adamw(0.01), axis_type, spec, zero)
  assert got == want
  if zero is None:
    assert not got


@pytest.mark.filterwarnings("ignore::shardopt.ReplicatedStateWarning")  # ZeRO: 2 blocks
@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_blocks_straddling_zero_shards_on_auto_axes(name):
  """data=4 x model=2 Auto axes, ZeRO over data: the update layout splits a
  (64, 32) matrix's rows 16 per device, across its blocks of 32 (the
  partitioner proposes part of 'data' for the block grid, which no spec
  names: that grid is gathered). Two steps equal the unsharded ones."""
  mesh = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  shardings = {"w": NamedSharding(mesh, P(None, "model"))}
  host = {"w": np.asarray(jax.random.normal(jax.random.PRNGKey(1), (64, 32)))}
  tx = getattr(shardopt.contrib, name)(0.01, block_size=32, precondition_frequency=1)
  opt = shardopt.make_sharded_optimizer(tx, host, shardings, shard_state_over="data",
                                        donate=False)
  params = jax.device_put(host, shardings)
  state = opt.init(params)
  plain_params, plain_state, update = host, tx.init(host), jax.jit(tx.update)
  for t in range(2):
    grads = _grads(plain_params, t)
    params, state = opt.update(jax.device_put(grads, shardings), state, params)
    updates, plain_state = update(grads, plain_state, plain_params)
    plain_params = shardopt.apply_updates(plain_params, updates)
  np.testing.assert_allclose(np.asarray(params["w"]), np.asarray(plain_params["w"]),
                             rtol=0, atol=1e-6 * float(np.abs(np.asarray(plain_params["w"])).max()))
