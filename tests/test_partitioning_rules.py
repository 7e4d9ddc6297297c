"""Partition rules: first match wins, scalars, unmatched params, the rule table, presets."""

import re
import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from partitioning import (
    DECODER_PRESETS,
    PartitionError,
    abstract_params,
    decoder_param_shapes,
    decoder_rules,
    make_mesh,
    match_partition_rules,
    memory_plan,
    named_shardings,
    param_path,
    rule_table,
    sharded_abstract_params,
    validate_specs,
)

PARAMS = {
    "decoder": {
        "layers_0": {
            "mlp": {"wi": {"kernel": jnp.zeros((8, 16))}, "wo": {"kernel": jnp.zeros((16, 8))}},
            "ln": {"scale": jnp.zeros((8,))},
        },
    },
    "step": jnp.zeros([], jnp.int32),
}


def test_param_path_joins_keys_of_dicts_lists_and_attributes():
  flat, _ = jax.tree_util.tree_flatten_with_path({"a": [{"k": 1}], "b": 2})
  assert [param_path(kp) for kp, _ in flat] == ["a/0/k", "b"]


def test_first_match_wins_and_scalars_need_no_rule():
  rules = [
      (r"mlp/wi/kernel$", P("data", "model")),
      (r"mlp/.*/kernel$", ("model", None)),  # a tuple is a spec too
      (r"kernel$", P()),  # never reached for the mlp kernels
      (r".*", None),  # None replicates
  ]
  specs = match_partition_rules(rules, PARAMS)
  layer = specs["decoder"]["layers_0"]
  assert layer["mlp"]["wi"]["kernel"] == P("data", "model")
  assert layer["mlp"]["wo"]["kernel"] == P("model", None)
  assert layer["ln"]["scale"] == P()
  assert specs["step"] == P()
  assert jax.tree.structure(specs, is_leaf=lambda x: isinstance(x, P)) == jax.tree.structure(PARAMS)


def test_strict_mode_names_params_that_rules_disagree_on():
  rules = [
      (r"mlp/wi/kernel$", P("data", "model")),
      (r"mlp/.*/kernel$", ("model", None)),  # also matches wi: a different spec
      (r"ln/scale$", P()),
      (r".*", None),  # a catch-all is not an ambiguity
  ]
  with pytest.raises(PartitionError) as e:
    match_partition_rules(rules, PARAMS, strict=True)
  problems = str(e.value).split("Rules, in order")[0]
  assert "decoder/layers_0/mlp/wi/kernel: rules [0, 1]" in problems
  assert "mlp/wo" not in problems and "ln/scale" not in problems
  agreeing = [(r"kernel$", P("model")), (r"mlp/wo/kernel$", P("model")), (r".*", P())]
  assert match_partition_rules(agreeing, PARAMS, strict=True)["decoder"]["layers_0"]["mlp"][
      "wo"]["kernel"] == P("model")


@pytest.mark.parametrize("catch_all", [".*", "^.*$", ".+", ""])
def test_strict_mode_exempts_a_last_rule_matching_every_param_however_written(catch_all):
  """The exemption is the last rule's, where it matches every param: its
  spelling does not matter, and a '.*' placed first (which shadows every
  later rule) is reported like any other rule."""
  params = {"embed": jnp.zeros((8, 4)), "head": jnp.zeros((4, 8))}
  specs = match_partition_rules([("embed", P("model")), (catch_all, P())], params, strict=True)
  assert specs == {"embed": P("model"), "head": P()}
  with pytest.raises(PartitionError, match=r"embed: rules \[0, 1\] give P\(\), P\('model',\)"):
    match_partition_rules([(catch_all, P()), ("embed", P("model"))], params, strict=True)


def test_strict_mode_takes_trailing_nones_as_the_same_layout():
  params = {"w": jnp.zeros((8, 4))}
  rules = [("w", P("model")), ("w$", P("model", None)), ("^w", ("model", None))]
  assert match_partition_rules(rules, params, strict=True) == {"w": P("model")}


@pytest.mark.parametrize("stacked", [False, True], ids=["layers", "stacked"])
@pytest.mark.parametrize("preset", DECODER_PRESETS)
def test_every_preset_is_unambiguous(preset, stacked):
  """The presets pass strict mode on their own shapes (the stacked fsdp
  presets' final-norm rule matched the stacked norms too)."""
  shapes = decoder_param_shapes(64, 16, 2, 32, 4, stacked=stacked)
  specs = match_partition_rules(decoder_rules(preset, stacked=stacked), shapes, strict=True)
  assert specs["ln_f"]["scale"] == P()


def test_named_shardings_name_the_path_of_a_bad_spec():
  mesh = make_mesh("data=2,model=4")
  with pytest.raises(PartitionError, match=re.escape(
      "specs['enc']['kernel'] = P('modle', None) names mesh axes ['modle'], which the mesh"
      " (axes ('data', 'model')) lacks")):
    named_shardings(mesh, {"enc": {"kernel": P("modle", None)}})
  with pytest.raises(PartitionError, match=re.escape(
      "specs['enc']['kernel'][0] is 'model', not a PartitionSpec (a spec written as a tuple")):
    named_shardings(mesh, {"enc": {"kernel": ("model", None)}})


def test_a_python_scalar_param_goes_through_every_step():
  """A Python float among the params: replicated, typed as jax types it
  (float32), in the abstract params and the memory plan; the rule it reaches
  is not listed as matching no param."""
  mesh = make_mesh("data=2,model=4")
  params = {"w": jnp.ones((8, 4)), "temperature": 1.0}
  rules = [("w", P("model")), (".*", P())]
  specs = match_partition_rules(rules, params)
  assert specs == {"w": P("model"), "temperature": P()}
  abstract = abstract_params(params, named_shardings(mesh, specs))
  assert abstract["temperature"].dtype == jnp.float32 and abstract["temperature"].shape == ()
  assert memory_plan(params, num_devices=8).params.total_bytes == 8 * 4 * 4 + 4
  assert "match no param" not in rule_table(rules, params)


def test_none_params_stay_none_through_every_step():
  """A layer without a bias ({'bias': None}): match_partition_rules gives it
  a None spec; validate_specs, rule_table and sharded_abstract_params take
  that tree (they refused it as 'specs without a param', telling the user
  to build it with match_partition_rules) and keep the None."""
  mesh = make_mesh("data=2,model=4")
  params = {"dense": {"kernel": jnp.ones((8, 16)), "bias": None}}
  rules = [("kernel", P(None, "model")), (".*", P())]
  specs = match_partition_rules(rules, params)
  assert specs == {"dense": {"kernel": P(None, "model"), "bias": None}}
  validate_specs(params, specs, mesh)
  table = rule_table(rules, params)
  assert "dense/kernel" in table and "bias" not in table
  abstract = sharded_abstract_params(rules, params, mesh)
  assert abstract["dense"]["bias"] is None
  assert abstract["dense"]["kernel"].sharding.spec == P(None, "model")
  with pytest.raises(PartitionError, match=re.escape("specs without a param: ['dense/bias']")):
    validate_specs(params, {"dense": {"kernel": P(), "bias": P()}}, mesh)


def test_rules_work_on_shape_dtype_structs():
  params = {"w": jax.ShapeDtypeStruct((4, 2), jnp.bfloat16)}
  assert match_partition_rules([("w", P("data"))], params) == {"w": P("data")}


def test_unmatched_params_are_all_named_with_the_rules():
  with pytest.raises(PartitionError) as e:
    match_partition_rules([(r"wi/kernel$", P("data"))], PARAMS)
  message = str(e.value)
  assert "decoder/layers_0/mlp/wo/kernel" in message
  assert "decoder/layers_0/ln/scale" in message
  assert "step" not in message.split("Rules")[0]  # scalars need no rule
  assert "0: 'wi/kernel$' -> P('data',)" in message


def test_bad_rules_raise():
  with pytest.raises(PartitionError, match=r"Rule 0: pattern '\(' is not a valid regex"):
    match_partition_rules([("(", P())], PARAMS)
  with pytest.raises(PartitionError, match="Rule 0 is 'kernel': each rule is a \\(regex, spec\\) pair"):
    match_partition_rules(["kernel"], PARAMS)
  with pytest.raises(PartitionError, match="Rule 1 \\('kernel'\\): Expected a PartitionSpec, a tuple of"
                     " mesh axis names or None; got 'data'"):
    match_partition_rules([("bias", P()), ("kernel", "data")], PARAMS)
  with pytest.raises(PartitionError, match=r"not a mapping: pass list\(rules.items\(\)\)"):
    match_partition_rules({"kernel": P("data"), ".*": P()}, PARAMS)


def test_rule_table_shows_path_shape_rule_spec_and_unused_rules():
  rules = [(r"wi/kernel$", P("data", "model")), (r"attn/.*", P("model")), (r".*", P())]
  lines = rule_table(rules, PARAMS).splitlines()
  assert lines[0].split() == ["param", "shape", "dtype", "rule", "spec"]
  row = next(line for line in lines if line.startswith("decoder/layers_0/mlp/wi/kernel"))
  assert row.split() == [
      "decoder/layers_0/mlp/wi/kernel", "(8,", "16)", "float32", "0:", "wi/kernel$", "P('data',", "'model')"
  ]
  row = next(line for line in lines if line.startswith("step"))
  assert row.split() == ["step", "()", "int32", "(scalar)", "P()"]
  assert lines[-2:] == ["Rules that match no param:", "  1: 'attn/.*'"]


def test_rule_table_with_given_specs_and_mismatched_tree():
  specs = match_partition_rules([(".*", P())], PARAMS)
  assert "(no rule)" in rule_table([(r"wi", P())], PARAMS, specs)
  with pytest.raises(PartitionError, match=r"params without a spec: \['step'\]"):
    rule_table([(".*", P())], PARAMS, {"decoder": specs["decoder"]})


SMALL = decoder_param_shapes(vocab=64, d_model=16, layers=2, mlp=32, heads=4)


@pytest.mark.parametrize(
    "preset, embedding, query, out, wi, wo, lm_head",
    [
        ("replicated", P(), P(), P(), P(), P(), P()),
        ("fsdp", P(None, "fsdp"), P("fsdp", None, None), P(None, None, "fsdp"), P("fsdp", None), P(None, "fsdp"),
         P("fsdp", None)),
        ("tp", P("model", None), P(None, "model", None), P("model", None, None), P(None, "model"), P("model", None),
         P(None, "model")),
        ("fsdp_tp", P("model", "fsdp"), P("fsdp", "model", None), P("model", None, "fsdp"), P("fsdp", "model"),
         P("model", "fsdp"), P("fsdp", "model")),
    ],
)
def test_decoder_presets(preset, embedding, query, out, wi, wo, lm_head):
  specs = match_partition_rules(decoder_rules(preset), {"params": SMALL})["params"]
  layer = specs["layers_1"]
  assert specs["embed"]["embedding"] == embedding
  assert layer["attn"]["query"]["kernel"] == layer["attn"]["value"]["kernel"] == query
  assert layer["attn"]["out"]["kernel"] == out
  assert (layer["mlp"]["wi"]["kernel"], layer["mlp"]["wo"]["kernel"]) == (wi, wo)
  assert specs["lm_head"]["kernel"] == lm_head
  assert layer["ln_2"]["scale"] == specs["ln_f"]["scale"] == P()


def test_preset_axes_are_configurable_and_unknown_preset_raises():
  rules = decoder_rules("fsdp", fsdp_axis=("data", "fsdp"))
  assert match_partition_rules(rules, SMALL)["lm_head"]["kernel"] == P(("data", "fsdp"), None)
  with pytest.raises(PartitionError, match=r"Unknown preset 'zero3': choose one of \('replicated'"):
    decoder_rules("zero3")
  assert tuple(DECODER_PRESETS) == ("replicated", "fsdp", "tp", "fsdp_tp")


def test_decoder_param_shapes():
  shapes = decoder_param_shapes(64, 16, 2, 32, 4, gated_mlp=True, dtype=jnp.bfloat16)
  assert shapes["layers_1"]["attn"]["key"]["kernel"].shape == (16, 4, 4)
  assert shapes["layers_0"]["attn"]["out"]["kernel"].shape == (4, 4, 16)
  assert shapes["layers_0"]["mlp"]["wi_1"]["kernel"].shape == (16, 32)
  assert shapes["embed"]["embedding"].shape == (64, 16) and shapes["lm_head"]["kernel"].shape == (16, 64)
  assert shapes["ln_f"]["scale"].dtype == jnp.bfloat16
  # 2 matrices of 64x16, and per layer 4 of 16x16, 3 of 16x32 and 2 scales of 16, plus ln_f.
  assert sum(x.size for x in jax.tree.leaves(shapes)) == 2 * 1024 + 2 * (4 * 256 + 3 * 512 + 32) + 16


@pytest.mark.parametrize("abstract", [True, False])
def test_rules_name_an_nnx_state_s_params_as_its_pure_dict_does(abstract):
  """An ``nnx.Variable``'s path ends at the param (``l1/kernel``), not at its ``value``
  field, so anchored rules match it and errors name it as the user wrote it."""
  make = lambda: _NnxModel(nnx.Rngs(0))
  state = nnx.state(nnx.eval_shape(make) if abstract else make(), nnx.Param)
  rules = [(r"l1/kernel$", P(None, "model")), (r"l2/kernel$", P("model", None)), (r"bias$", P("model"))]
  specs = match_partition_rules(rules, state)
  assert nnx.to_pure_dict(specs) == match_partition_rules(rules, nnx.to_pure_dict(state))
  assert nnx.to_pure_dict(specs)["l2"] == {"kernel": P("model", None), "bias": P("model")}
  table = rule_table(rules, state)
  assert "l1/kernel " in table and "/value" not in table and "match no param" not in table
  with pytest.raises(PartitionError, match=r"l2/bias"):
    validate_specs(state, match_partition_rules([(r"bias$", P("model")), (".*", P())], state),
                   make_mesh("data=1,model=8"))  # 4 does not divide over 8


class _NnxModel(nnx.Module):
  def __init__(self, rngs):
    self.l1 = nnx.Linear(4, 16, rngs=rngs)
    self.l2 = nnx.Linear(16, 4, rngs=rngs)
