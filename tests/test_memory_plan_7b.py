"""Memory plan of a 7B decoder's optimizer state on 256 abstract devices."""

import jax

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
