"""quantized_state: state layout, updates, the sharded step and checkpoints.

Truths: optax's Adam (first step exact, later steps within the code's
rounding), collective counts of the float32 program compiled on the same
mesh, bytes read from ``addressable_shards``, checkpoints read back.
"""

import collections
import re

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import checkpoints
import partitioning
import shardopt

# Matrices shaped like the LM demo's, with its 'tp' specs on (data, model).
LAYOUT = {
    "embed": ((256, 64), P("model", None)),
    "query": ((64, 4, 16), P(None, "model", None)),
    "out": ((4, 16, 64), P("model", None, None)),
    "wi": ((64, 256), P(None, "model")),
}


def _mesh(shape=(2, 4)):
  devices = jax.devices()[: shape[0] * shape[1]]
  return partitioning.make_mesh({"data": shape[0], "model": shape[1]},
                                devices=devices)


def _params(mesh):
  keys = jax.random.split(jax.random.key(0), len(LAYOUT))
  return {name: jax.device_put(jax.random.normal(k, shape),
                               NamedSharding(mesh, spec))
          for k, (name, (shape, spec)) in zip(keys, LAYOUT.items())}


def _shardings(mesh):
  return {name: NamedSharding(mesh, spec) for name, (_, spec) in LAYOUT.items()}


def _grads(params, step):
  """A pull towards 0 plus noise (as tests/oracle.gradient_stream)."""
  return jax.tree.map(lambda p: 0.5 * p + 0.1 * jax.random.normal(
      jax.random.key(100 + step), p.shape), params)


def test_large_param_shaped_moments_become_codes_and_scales():
  params = {"w": jnp.ones((64, 128)), "b": jnp.ones((8,))}
  state = shardopt.quantized_state(shardopt.adam(0.1), bits=4).init(params)
  adam_state = state[0]
  for moment in (adam_state.mu, adam_state.nu):
    assert isinstance(moment["w"], shardopt.QuantizedArray)
    assert moment["w"].codes.dtype == jnp.uint8
    assert moment["w"].codes.shape == (64, 64)  # two 4-bit codes per byte
    assert moment["w"].scales.shape == (64, 1)  # blocks of 128
    assert moment["b"].dtype == jnp.float32  # under min_size
  assert adam_state.count.dtype == jnp.int32


def test_second_moments_get_the_unsigned_code_by_name():
  params = {"w": jnp.ones((64, 128))}
  report = shardopt.describe_quantized_state(
      shardopt.quantized_state(shardopt.adam(0.1)), params)
  stored = {l.path: l.stored for l in report.leaves}
  assert stored == {"[0].mu['w']": "dynamic-signed-8",
                    "[0].nu['w']": "dynamic-unsigned-8"}
  custom = shardopt.quantized_state(shardopt.adam(0.1),
                                    nonnegative=lambda path: False)
  stored = {l.stored for l in shardopt.describe_quantized_state(
      custom, params).leaves}
  assert stored == {"dynamic-signed-8"}


@pytest.mark.parametrize("bits,tolerance", [(8, 0.05), (4, 0.35)])
def test_updates_follow_optax_adam(bits, tolerance):
  params = {"w": jax.random.normal(jax.random.key(1), (64, 128))}
  ours = shardopt.quantized_state(shardopt.adam(1e-2), bits=bits)
  theirs = optax.adam(1e-2)
  state, expected_state = ours.init(params), theirs.init(params)
  update = jax.jit(ours.update)
  for step in range(10):
    grads = _grads(params, step)
    got, state = update(grads, state, params)
    want, expected_state = theirs.update(grads, expected_state, params)
    if step == 0:  # decoded from an exact zero state: identical
      np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)
    # Mean error relative to the mean update; measured at most 0.026 (8-bit)
    # and 0.25 (4-bit) over these 10 steps.
    error = jnp.mean(jnp.abs(got["w"] - want["w"])) / jnp.mean(jnp.abs(want["w"]))
    assert float(error) <= tolerance, (step, float(error))


def test_alias_state_bits_quantizes_the_moments():
  params = {"w": jnp.ones((64, 128))}
  state = shardopt.adamw(0.1, state_bits=8).init(params)
  assert isinstance(state[0].mu["w"], shardopt.QuantizedArray)
  assert shardopt.adamw(0.1).init(params)[0].mu["w"].dtype == jnp.float32


def test_a_shard_no_tile_fits_stays_float32_and_is_reported():
  mesh = _mesh()
  params = {"w": jnp.ones((3, 4096)), "v": jnp.ones((64, 128))}
  shardings = {"w": NamedSharding(mesh, P(None, ("data", "model"))),
               "v": NamedSharding(mesh, P())}
  tx = shardopt.quantized_state(shardopt.adam(0.1), block_size=1024,
                                param_shardings=shardings)
  report = shardopt.describe_quantized_state(tx, params)
  assert [l.path for l in report.fallbacks] == ["[0].mu['w']", "[0].nu['w']"]
  assert "no tile of 1024 elements" in report.fallbacks[0].reason
  assert "(3, 512)" in report.fallbacks[0].reason
  state = tx.init(params)
  assert state[0].mu["w"].dtype == jnp.float32
  assert isinstance(state[0].mu["v"], shardopt.QuantizedArray)


def test_bad_arguments_say_what_to_do():
  with pytest.raises(ValueError, match="bits=3"):
    shardopt.quantized_state(shardopt.adam(0.1), bits=3)
  with pytest.raises(ValueError, match="power of two"):
    shardopt.quantized_state(shardopt.adam(0.1), block_size=100)
  tx = shardopt.quantized_state(shardopt.adam(0.1),
                                param_shardings={"a": None, "b": None})
  with pytest.raises(ValueError, match="one NamedSharding per param"):
    tx.init({"w": jnp.ones((64, 128))})
  with pytest.raises(TypeError, match="not built by"):
    shardopt.describe_quantized_state(shardopt.adam(0.1), {})


def _collectives(compiled_text) -> collections.Counter:
  kinds = r"all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all"
  return collections.Counter(re.findall(rf"\b({kinds})(?:-start)?\(", compiled_text))


def _sharded(bits, mesh, **kwargs):
  shardings = _shardings(mesh)
  tx = shardopt.adamw(1e-2)
  if bits:
    tx = shardopt.quantized_state(tx, bits=bits, param_shardings=shardings,
                                  shard_state_over="data")
  return shardopt.make_sharded_optimizer(
      tx, _params(mesh), shardings, shard_state_over="data", **kwargs)


def _per_device_bytes(state) -> collections.Counter:
  per_device = collections.Counter()
  for leaf in jax.tree.leaves(state):
    for shard in leaf.addressable_shards:
      per_device[shard.device] += shard.data.nbytes
  return per_device


@pytest.mark.parametrize("bits", [8, 4])
def test_sharded_update_adds_no_collective_and_zero_splits_evenly(bits):
  mesh = _mesh()
  params = _params(mesh)
  float_opt, opt = _sharded(None, mesh), _sharded(bits, mesh)
  baseline = _collectives(float_opt.update.lower(
      params, float_opt.init(params), params).compile().as_text())
  state = opt.init(params)
  quantized = _collectives(opt.update.lower(params, state, params)
                           .compile().as_text())
  assert all(quantized[k] <= baseline[k] for k in quantized), (quantized, baseline)
  per_device = _per_device_bytes(state)
  total = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
  assert len(per_device) == 8
  assert max(per_device.values()) <= 1.05 * total / 8
  n_params = sum(p.size for p in params.values())
  assert total / n_params <= (2.1 if bits == 8 else 1.1)


def test_checkpoint_restores_bit_equal_on_other_meshes(tmp_path):
  mesh = _mesh()
  opt = _sharded(4, mesh)
  params = _params(mesh)
  state = opt.init(params)
  for step in range(3):
    params, state = opt.update(_grads(params, step), state, params)
  saved = jax.device_get(state)
  with checkpoints.CheckpointManager(tmp_path) as manager:
    manager.save(3, {"opt_state": state}, force=True)
    manager.wait_until_finished()
    layout = manager.saved_layout(3)
  codes = [v["dtype"] for k, v in layout.items() if k.endswith("codes")]
  assert codes and set(codes) == {"uint8"}  # integers on disk
  tx = shardopt.quantized_state(  # as trained: tiles of the (2, 4) layout
      shardopt.adamw(1e-2), bits=4, param_shardings=_shardings(mesh),
      shard_state_over="data")
  for shape in [(4, 2), (8, 1), (1, 1)]:
    other = _mesh(shape)
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, (s, _) in
                LAYOUT.items()}
    plan = shardopt.plan_state_shardings(tx, abstract, _shardings(other),
                                         shard_state_over="data")
    target = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                    sharding=sharding),
        saved, plan.shardings)
    with checkpoints.CheckpointManager(tmp_path, read_only=True) as manager:
      restored = manager.restore({"opt_state": target}).state["opt_state"]
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(saved)):
      assert got.sharding.mesh.shape == other.shape
      np.testing.assert_array_equal(np.asarray(got), want)
      assert got.dtype == want.dtype


def test_launch_state_bits_flag_quantizes_with_the_job_layout():
  from launch import cli
  from launch import optim
  mesh = _mesh()
  args = cli.parser().parse_args(["--state-bits", "4"])
  tx = optim.with_state_bits(args, shardopt.adamw(1e-2), _shardings(mesh), "data")
  state = tx.init(_params(mesh))
  assert isinstance(state[0].nu["wi"], shardopt.QuantizedArray)
  assert state[0].nu["wi"].codes.shape == (64, 128)
  plain = cli.parser().parse_args([])
  assert optim.with_state_bits(plain, shardopt.adamw(1e-2), None, None).init(
      _params(mesh))[0].nu["wi"].dtype == jnp.float32
