"""Specs from Flax metadata of a real linen model: logical and mesh-axis partitioning."""

import flax.linen as nn
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from partitioning import (
    PartitionError,
    is_boxed,
    logical_to_spec,
    make_mesh,
    named_shardings,
    specs_from_flax_metadata,
    validate_specs,
)

LOGICAL_RULES = [("batch", "data"), ("embed", None), ("mlp", "model"), ("vocab", "model")]


class Mlp(nn.Module):

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.lecun_normal()
    x = nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
    x = nn.Dense(8, use_bias=False, kernel_init=nn.with_partitioning(init, ("model", "data")))(x)
    return nn.LayerNorm()(x)


def boxed_variables():
  return Mlp().init(jax.random.key(0), jnp.ones((2, 8)))


def test_specs_and_unboxed_params_from_a_linen_model():
  variables = boxed_variables()
  params, specs = specs_from_flax_metadata(variables, LOGICAL_RULES)
  assert not any(is_boxed(x) for x in jax.tree.leaves(params, is_leaf=is_boxed))
  np.testing.assert_array_equal(
      params["params"]["Dense_0"]["kernel"], variables["params"]["Dense_0"]["kernel"].value
  )
  got = specs["params"]
  assert got["Dense_0"]["kernel"] == P(None, "model")  # ('embed', 'mlp') through the rules
  assert got["Dense_1"]["kernel"] == P("model", "data")  # mesh axes as given
  assert got["Dense_0"]["bias"] == got["LayerNorm_0"]["scale"] == P()  # no metadata: replicated

  mesh = make_mesh("data=2,model=4")
  validate_specs(params, specs, mesh)
  sharded = jax.device_put(params, named_shardings(mesh, specs))
  kernel = sharded["params"]["Dense_0"]["kernel"]
  assert {s.data.shape for s in kernel.addressable_shards} == {(8, 4)}


def test_fallback_rules_partition_leaves_without_metadata():
  fallback = [(r"LayerNorm_0/scale$", P("model")), (r".*", P())]
  _, specs = specs_from_flax_metadata(boxed_variables(), LOGICAL_RULES, fallback_rules=fallback)
  assert specs["params"]["LayerNorm_0"]["scale"] == P("model")
  assert specs["params"]["LayerNorm_0"]["bias"] == P()
  assert specs["params"]["Dense_0"]["kernel"] == P(None, "model")  # metadata beats fallback rules


def test_rules_carried_by_the_box_win():
  init = nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp"), rules=(("embed", "data"),))
  variables = nn.Dense(4, kernel_init=init).init(jax.random.key(0), jnp.ones((1, 2)))
  _, specs = specs_from_flax_metadata(variables, LOGICAL_RULES)
  assert specs["params"]["kernel"] == P("data", None)


def test_logical_names_without_rules_raise_naming_the_param():
  with pytest.raises(PartitionError) as e:
    specs_from_flax_metadata(boxed_variables())
  assert str(e.value) == (
      "Param 'params/Dense_0/kernel' has logical axis names ('embed', 'mlp') but no logical axis rules:"
      " pass logical_rules=[('embed', 'fsdp'), ('mlp', 'model'), ...]."
  )


def test_logical_to_spec_follows_flax_priorities():
  rules = [("mlp", "model"), ("vocab", "model"), ("embed", ("data", "fsdp")), ("heads", "data")]
  # 'model' is taken by mlp first, so vocab stays unsharded; heads cannot reuse 'data'.
  assert logical_to_spec(("vocab", "mlp"), rules) == P(None, "model")
  assert logical_to_spec(("embed", "heads", None), rules) == P(("data", "fsdp"), None, None)
  assert logical_to_spec(("embed", "unknown"), rules) == P(("data", "fsdp"), None)
  for names in [("embed", "mlp"), ("vocab", "mlp"), ("heads", "embed"), ("embed", "kv")]:
    assert logical_to_spec(names, rules) == nn.logical_to_mesh_axes(names, rules)
  with pytest.raises(PartitionError, match=r"Logical names \('mlp', 'mlp'\) repeat \['mlp'\]"):
    logical_to_spec(("mlp", "mlp"), rules)


_INIT = nnx.initializers.lecun_normal()


class NnxMlp(nnx.Module):
  """Annotated the NNX way: mesh axes, and logical names with rules of the variable's own."""

  def __init__(self, rngs):
    self.up = nnx.Linear(8, 16, rngs=rngs, kernel_init=nnx.with_partitioning(
        _INIT, ("embed", "mlp"), sharding_rules=(("embed", None), ("mlp", "model"))))
    self.down = nnx.Linear(16, 8, use_bias=False, rngs=rngs,
                           kernel_init=nnx.with_partitioning(_INIT, ("model", "data")))
    self.norm = nnx.LayerNorm(8, rngs=rngs)


@pytest.mark.parametrize("abstract", [True, False])
def test_specs_and_values_from_an_nnx_models_annotations(abstract):
  mesh = make_mesh("data=2,model=4")
  with jax.set_mesh(mesh):  # NNX creates annotated variables sharded, under a mesh
    model = nnx.eval_shape(lambda: NnxMlp(nnx.Rngs(0))) if abstract else NnxMlp(nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  params, specs = specs_from_flax_metadata(state)
  assert nnx.to_pure_dict(specs) == {  # nnx.get_partition_spec's specs
      "up": {"kernel": P(None, "model"), "bias": P()}, "down": {"kernel": P("model", "data")},
      "norm": {"scale": P(), "bias": P()}} == nnx.to_pure_dict(nnx.get_partition_spec(state))
  assert nnx.to_pure_dict(params)["up"]["kernel"] is state["up"]["kernel"].get_value()
  validate_specs(params, specs, mesh)
  shardings = nnx.to_pure_dict(named_shardings(mesh, specs))
  assert shardings["down"]["kernel"].spec == P("model", "data")


def test_nnx_rules_given_twice_must_agree_naming_the_param():
  mesh = make_mesh("data=2,model=4")
  with jax.set_mesh(mesh):
    state = nnx.state(nnx.eval_shape(lambda: NnxMlp(nnx.Rngs(0))), nnx.Param)
  _, specs = specs_from_flax_metadata(state, logical_rules=[("mlp", "model"), ("vocab", "data")])
  assert specs["up"]["kernel"] == P(None, "model")
  with pytest.raises(PartitionError, match=r"up/kernel.*'mlp' to 'model', logical_rules to 'data'"):
    specs_from_flax_metadata(state, logical_rules=[("mlp", "data")])
