"""Memory plans on abstract devices: a 7B decoder's optimizer state on 256,
and params, gradients and ZeRO state of 7B on 256 and 70B on 2,048."""

import jax
import pytest

from benchmarks import memory_plans
import partitioning
import shardopt

MESH = {"fsdp": 16, "model": 16}


def llama_7b():
  """LLaMA-7B shapes: untied embeddings, gated MLP, 6.74e9 params."""
  return partitioning.decoder_param_shapes(32000, 4096, 32, 11008, 32,
                                           gated_mlp=True)


def state_memory(tx, abstract_params):
  """Sharded abstract state from the derived shardings, and its memory plan."""
  param_shardings = jax.tree.map(lambda p: p.sharding, abstract_params)
  plan = shardopt.plan_state_shardings(tx, abstract_params, param_shardings)
  state = jax.tree.map(
      lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s),
      jax.eval_shape(tx.init, abstract_params), plan.shardings)
  memory = partitioning.memory_plan(abstract_params, state)
  assert memory.state.per_device_bytes == plan.bytes_per_device
  return state, memory


def test_7b_adam_state_is_ideally_sharded_and_adafactor_tiny():
  mesh = partitioning.make_abstract_mesh(MESH)
  params = llama_7b()
  assert 6.7e9 < sum(p.size for p in jax.tree.leaves(params)) < 6.8e9
  abstract = partitioning.sharded_abstract_params(
      partitioning.decoder_rules("fsdp_tp"), params, mesh)

  adam_state, adam = state_memory(shardopt.adam(1e-4), abstract)
  print("\n7B decoder, Adam:\n" + adam.table())
  assert adam.num_devices == 256 and adam.params.ratio < 1.02
  assert adam.state.total_bytes == 2 * 4 * 6_738_415_616 + 4
  assert adam.state.ratio < 1.02  # within 2% of total / 256
  mu = adam_state[0].mu["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert mu.sharding.spec == jax.sharding.PartitionSpec("fsdp", "model")
  assert mu.sharding.mesh == mesh

  _, adafactor = state_memory(shardopt.adafactor(1e-4), abstract)
  print("7B decoder, Adafactor:\n" + adafactor.table())
  assert adafactor.state.per_device_bytes < 0.01 * adam.state.per_device_bytes


@pytest.mark.parametrize("name,devices", [("7B", 256), ("70B", 2048)])
def test_params_grads_and_zero_state_within_2_percent_of_ideal(name, devices):
  """benchmarks/memory_plans.py: every tree within 2% of total / devices."""
  model = memory_plans.models()[name]
  memory, state_plan = memory_plans.plan(model, shardopt.adamw(1e-4))
  count = sum(p.size for p in jax.tree.leaves(model.shapes))
  assert memory.num_devices == devices
  assert memory.params.total_bytes == 4 * count
  assert memory.grads == memory.params  # laid out as the params
  assert memory.state.total_bytes == 2 * 4 * count + 4  # mu, nu, count
  for tree in (memory.params, memory.grads, memory.state):
    assert tree.ideal_bytes == tree.total_bytes / devices
    assert tree.ratio < 1.02
  # ZeRO split the state the params' layout left whole (norm scales' moments
  # among them); everything else it lists was already split over fsdp.
  assert state_plan.zero_sharded
  assert all("'fsdp' already used" in l.zero for l in state_plan.zero_skipped)


def test_70b_per_device_bytes_by_hand():
  """All but the norm scales split 2048 ways; the stacked scales (80, 8192)
  split 256 ways (fsdp only), ln_f (8192,) replicated."""
  memory, _ = memory_plans.plan(memory_plans.models()["70B"], shardopt.adamw(1e-4))
  count = 68_976_648_192
  assert sum(p.size for p in jax.tree.leaves(
      memory_plans.models()["70B"].shapes)) == count
  scales, ln_f = 2 * 80 * 8192 * 4, 8192 * 4
  split = (4 * count - scales - ln_f) // 2048
  assert memory.params.per_device_bytes == split + scales // 256 + ln_f
  # The state's copies of ln_f are split over fsdp by ZeRO: 2 x 8192 / 256.
  assert memory.state.per_device_bytes == 2 * (split + scales // 256) + 2 * ln_f // 256 + 4
