"""Shardings, sharded abstract params and memory plans, checked by hand and against real shards."""

import collections
import math

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardopt
from partitioning import (
    PartitionError,
    abstract_params,
    decoder_param_shapes,
    decoder_rules,
    format_bytes,
    make_abstract_mesh,
    make_mesh,
    memory_plan,
    named_shardings,
    sharded_abstract_params,
)


def resident_bytes_per_device(tree):
  per_device = collections.Counter()
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      per_device[shard.device] += shard.data.nbytes
  return per_device


def test_plan_on_a_real_mesh_matches_hand_count_and_resident_shards():
  mesh = make_mesh("data=2,model=4")
  params = {"w": jnp.ones((8, 16)), "b": jnp.ones((4,))}
  specs = {"w": P("data", "model"), "b": P()}
  sharded = jax.device_put(params, named_shardings(mesh, specs))
  plan = memory_plan(sharded)
  assert plan.num_devices == 8
  assert plan.params.total_bytes == 8 * 16 * 4 + 4 * 4
  assert plan.params.per_device_bytes == 8 * 16 * 4 // 8 + 4 * 4
  assert plan.params.ideal_bytes == (8 * 16 * 4 + 4 * 4) / 8
  assert plan.state is None and plan.per_device_bytes == 80
  assert set(resident_bytes_per_device(sharded).values()) == {80}
  # The same numbers from abstract params, without touching memory.
  assert memory_plan(abstract_params(params, named_shardings(mesh, specs))) == plan


def test_plan_on_256_abstract_devices_with_state_and_uneven_dims():
  mesh = make_abstract_mesh({"fsdp": 16, "model": 16})
  params = sharded_abstract_params(
      [("w", P("fsdp", "model")), ("v", P("fsdp"))],
      {"w": jax.ShapeDtypeStruct((256, 64), jnp.bfloat16), "v": jax.ShapeDtypeStruct((32,), jnp.float32)},
      mesh,
  )
  assert isinstance(params["w"].sharding.mesh, AbstractMesh) and params["w"].sharding.mesh.size == 256
  uneven = NamedSharding(mesh, P(("fsdp", "model")))
  state = {
      "mu": jax.ShapeDtypeStruct((300,), jnp.float32, sharding=uneven),  # ceil(300 / 256) = 2 on the first device
      "count": jax.ShapeDtypeStruct((), jnp.int32),  # no sharding: replicated
  }
  plan = memory_plan(params, state)
  assert plan.num_devices == 256
  assert plan.params.per_device_bytes == 16 * 4 * 2 + 2 * 4
  assert plan.params.total_bytes == 256 * 64 * 2 + 32 * 4
  assert plan.state.per_device_bytes == 2 * 4 + 4
  assert plan.state.total_bytes == 300 * 4 + 4
  assert plan.state.ideal_bytes == 1204 / 256
  assert plan.per_device_bytes == 136 + 12


@pytest.mark.parametrize("gated_mlp, count", [(False, 5_295_575_040), (True, 6_738_415_616)])
def test_7b_decoder_params_with_fsdp_tp_are_within_2_percent_of_ideal(gated_mlp, count):
  shapes = decoder_param_shapes(32000, 4096, 32, 11008, 32, gated_mlp=gated_mlp)
  mesh = make_abstract_mesh("fsdp=16,model=16")
  plan = memory_plan(sharded_abstract_params(decoder_rules("fsdp_tp"), shapes, mesh))
  assert plan.params.total_bytes == 4 * count
  assert plan.params.ideal_bytes == 4 * count / 256
  assert 1.0 <= plan.params.ratio < 1.02
  # Only the 65 replicated norm scales exceed the ideal.
  assert plan.params.per_device_bytes == 4 * ((count - 65 * 4096) // 256 + 65 * 4096)
  replicated = memory_plan(sharded_abstract_params(decoder_rules("replicated"), shapes, mesh))
  assert replicated.params.per_device_bytes == 4 * count and replicated.params.ratio == 256


def test_table_and_format_bytes():
  mesh = make_abstract_mesh("data=4")
  params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(mesh, P("data")))}
  lines = memory_plan(params, params).table().splitlines()
  assert lines[0] == "Memory plan on 4 devices"
  assert lines[1].split() == ["total", "per", "device", "ideal", "(total/N)", "per-device/ideal"]
  assert lines[3].split() == ["params", "4.00", "MiB", "1.00", "MiB", "1.00", "MiB", "1.000"]
  assert lines[5].split() == ["params+state", "8.00", "MiB", "2.00", "MiB", "2.00", "MiB", "1.000"]
  assert [format_bytes(n) for n in (512, 1536, 3 * 2**30)] == ["512 B", "1.50 KiB", "3.00 GiB"]


def test_plan_needs_a_device_count_and_matching_trees():
  with pytest.raises(PartitionError, match="No leaf carries a sharding: pass num_devices=... to memory_plan"):
    memory_plan({"w": jax.ShapeDtypeStruct((4,), jnp.float32)})
  plan = memory_plan({"w": jax.ShapeDtypeStruct((4,), jnp.float32)}, num_devices=2)
  assert (plan.params.per_device_bytes, plan.params.ratio) == (16, 2.0)
  with pytest.raises(PartitionError, match="The shardings tree does not match the params tree"):
    abstract_params({"w": jnp.ones(2), "b": jnp.ones(2)}, {"w": None})


def test_single_device_arrays_count_in_full():
  x = jax.device_put(jnp.ones((6, 2)), jax.devices()[3])
  plan = memory_plan({"x": x}, num_devices=8)
  assert plan.params.per_device_bytes == 48 == math.prod(x.shape) * 4


def test_typed_prng_keys_count_their_key_data():
  """A state holding PRNG keys (noisy_sgd's) is planned, each key counted as
  the bytes its key data holds on a device."""
  mesh = make_mesh("data=2,model=4")
  keys = jax.device_put(jax.random.split(jax.random.key(0), 8),
                        NamedSharding(mesh, P("data")))
  state = {"key": keys, "m": jnp.zeros((8, 16))}
  plan = memory_plan({"w": jnp.ones((8, 16))}, state, num_devices=8)
  key_bytes = jax.random.key_data(keys).nbytes
  assert plan.state.total_bytes == key_bytes + 8 * 16 * 4
  assert plan.state.per_device_bytes == max(
      resident_bytes_per_device(keys).values()) + 8 * 16 * 4


def test_state_in_host_memory_is_counted_apart():
  """An optimizer's state offloaded between steps (``state_memory_kind``): the plan of the
  real arrays says how much of each device's share is in host memory, and the table shows it."""
  mesh = make_mesh("data=2,model=4")
  shardings = {"w": NamedSharding(mesh, P(None, "model")), "b": NamedSharding(mesh, P())}
  params = jax.device_put({"w": jnp.ones((64, 128)), "b": jnp.ones(128)}, shardings)
  opt = shardopt.make_sharded_optimizer(shardopt.adam(1e-3), params, shardings,
                                        shard_state_over="data", state_memory_kind="pinned_host")
  state = opt.init(params)
  plan = memory_plan(params, state)
  on_a_device = max(resident_bytes_per_device(state).values())
  assert plan.state.host_bytes == plan.state.per_device_bytes == on_a_device
  assert plan.state.host_bytes == 2 * (64 * 128 * 4 // 8 + 128 * 4) + 4  # mu, nu split 8 ways; count
  assert plan.params.host_bytes == 0
  lines = plan.table().splitlines()
  assert lines[1].split()[-6:] == ["per-device/ideal", "of", "which", "in", "host", "memory"]
  assert lines[-2].split()[-2:] == format_bytes(plan.state.host_bytes).split()
  assert "host" not in memory_plan(params, params).table()
