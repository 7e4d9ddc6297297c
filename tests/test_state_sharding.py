"""Derived optimizer-state shardings: specs traced from each transform's init."""

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import partitioning
import shardopt

SHAPES = {"embedding": (64, 32), "dense": {"kernel": (32, 16), "bias": (16,)},
          "scale": (32,)}
SPECS = {"embedding": P("model", None),
         "dense": {"kernel": P(None, "model"), "bias": P("model")},
         "scale": P()}
E, K, B, S = "['embedding']", "['dense']['kernel']", "['dense']['bias']", "['scale']"

# Per param, the (shape, spec) of every state leaf derived from it.
ADAM_LIKE = {E: [((64, 32), P("model", None))] * 2,
             K: [((32, 16), P(None, "model"))] * 2,
             B: [((16,), P("model"))] * 2, S: [((32,), P(None))] * 2}
EXPECTED = {
    "adam": ADAM_LIKE,
    "lamb": ADAM_LIKE,
    "sgd": {k: v[:1] for k, v in ADAM_LIKE.items()},
    # Factored: v_row / v_col keep the mesh axis of the dimension they keep.
    "adafactor": {
        E: [((32,), P(None)), ((64,), P("model")), ((1,), P(None))],
        K: [((16,), P("model")), ((32,), P(None)), ((1,), P(None))],
        B: [((1,), P(None)), ((1,), P(None)), ((16,), P("model"))],
        S: [((1,), P(None)), ((1,), P(None)), ((32,), P(None))]},
    # One cover per dimension, plus the full-size momentum.
    "sm3": {
        E: [((64,), P("model")), ((32,), P(None)), ((64, 32), P("model", None))],
        K: [((32,), P(None)), ((16,), P("model")), ((32, 16), P(None, "model"))],
        B: [((16,), P("model"))] * 2, S: [((32,), P(None))] * 2},
}


def transforms(lib=shardopt):
  """The optimizers under test, from shardopt or (foreign) from optax."""
  return {
      "adam": lib.adam(1e-2),
      "lamb": lib.lamb(1e-2),
      "sgd": lib.sgd(1e-2, momentum=0.9),
      "adafactor": lib.adafactor(1e-2, min_dim_size_to_factor=8),
      "sm3": lib.sm3(1e-2),
  }


def abstract_params():
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), SHAPES,
                      is_leaf=lambda x: isinstance(x, tuple))


MESHES = {
    "auto": lambda: partitioning.make_mesh({"data": 2, "model": 4}),
    "explicit": lambda: partitioning.make_mesh({"data": 2, "model": 4},
                                               axis_types="explicit"),
    "abstract": lambda: partitioning.make_abstract_mesh({"data": 2, "model": 4}),
}


def by_param(plan):
  out = {}
  for leaf in plan.leaves:
    out.setdefault(leaf.param, []).append((leaf.shape, leaf.spec))
  return {k: sorted(v, key=str) for k, v in out.items()}


@pytest.mark.parametrize("lib", [shardopt, optax], ids=["shardopt", "optax"])
@pytest.mark.parametrize("mesh_kind", sorted(MESHES))
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_derived_specs(name, mesh_kind, lib):
  mesh = MESHES[mesh_kind]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plan = shardopt.plan_state_shardings(transforms(lib)[name],
                                         abstract_params(), shardings)
  got = by_param(plan)
  counters = got.pop(None, [])
  assert got == {k: sorted(v, key=str) for k, v in EXPECTED[name].items()}
  assert all(spec == P() for _, spec in counters)
  leaves = jax.tree.leaves(plan.shardings)
  assert len(leaves) == len(plan.leaves)
  assert all(s.mesh == mesh for s in leaves)
  assert plan.under_sharded == ()


def test_matches_structure_of_init_and_state_shardings_agrees():
  mesh = MESHES["auto"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  tx = transforms()["adam"]
  got = shardopt.state_shardings(tx, abstract_params(), shardings)
  assert jax.tree.structure(got) == jax.tree.structure(
      jax.eval_shape(tx.init, abstract_params()))
  assert got[0].mu["embedding"] == NamedSharding(mesh, P("model", None))
  assert got[0].count == NamedSharding(mesh, P())


def test_rng_keys_chains_and_masks():
  """optax's add_noise keeps a PRNG key; masked() leaves MaskedNodes."""
  mesh = MESHES["explicit"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  mask = jax.tree.map(lambda s: len(s) == 2, SHAPES,
                      is_leaf=lambda x: isinstance(x, tuple))
  tx = optax.chain(optax.add_noise(0.1, 0.5, 0),
                   optax.masked(optax.adam(1.0), mask))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    plan = shardopt.plan_state_shardings(tx, abstract_params(), shardings)
  got = by_param(plan)
  assert set(got) == {None, E, K}
  assert got[E] == [((64, 32), P("model", None))] * 2
  assert got[None] == [((), P())] * 3  # noise count, key, adam count
  key = [l for l in plan.leaves if "rng_key" in l.path]
  assert key and jax.dtypes.issubdtype(key[0].dtype, jax.dtypes.prng_key)


def _bare_shape_momentum():
  """A transform that (wrongly) builds its state from bare shapes."""
  init = lambda params: jax.tree.map(lambda p: jnp.zeros(p.shape, p.dtype),
                                     params)
  update = lambda g, state, params=None: (g, state)
  return optax.GradientTransformation(init, update)


def test_state_less_sharded_than_its_param_warns():
  mesh = MESHES["auto"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    plan = shardopt.plan_state_shardings(_bare_shape_momentum(),
                                         abstract_params(), shardings)
  message = str(record[0].message)
  for path in (E, K, B):
    assert path in message
  assert S not in message  # replicated param: nothing lost
  assert plan.under_sharded == (B, K, E)  # flatten order
  assert plan.shardings["embedding"].spec == P(None, None)


def test_bad_input_names_the_param():
  mesh = MESHES["auto"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  tx = transforms()["adam"]
  bad = dict(shardings, scale=P())
  with pytest.raises(TypeError, match=r"\['scale'\].*NamedSharding"):
    shardopt.state_shardings(tx, abstract_params(), bad)
  with pytest.raises(ValueError, match=r"tree structure of params .*: params\['dense'\]\['bias'\] "
                     r"has no sharding \(param_shardings lack \['dense'\]\['bias'\]\)"):
    shardopt.state_shardings(tx, abstract_params(), {"embedding": shardings["embedding"]})
  with pytest.raises(ValueError, match=r"param_shardings\['extra'\] matches no param"):
    shardopt.state_shardings(tx, abstract_params(), dict(shardings, extra=shardings["scale"]))
  with pytest.raises(ValueError, match="'fsdp' is not an axis"):
    shardopt.state_shardings(tx, abstract_params(), shardings,
                             shard_state_over="fsdp")


def test_report_is_printable():
  mesh = MESHES["abstract"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  plan = shardopt.plan_state_shardings(transforms()["adam"], abstract_params(),
                                       shardings)
  text = str(plan)
  assert "9 leaves" in text and f"<- params{E}" in text
  # mu and nu of embedding: 64/4 x 32 floats each per device.
  mine = sum(l.device_bytes for l in plan.leaves if l.param == E)
  assert mine == 2 * 16 * 32 * 4


def test_init_that_cannot_follow_shardings_falls_back_to_replicated_loudly():
  """A Gram-matrix state (p.T @ p) has no layout JAX can infer from a
  sharded contracting dimension: the plan says so and replicates."""
  mesh = MESHES["abstract"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  gram = optax.GradientTransformation(
      lambda params: jax.tree.map(lambda p: p.T @ p if p.ndim == 2 else p,
                                  params),
      lambda g, state, params=None: (g, state))
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    plan = shardopt.plan_state_shardings(gram, abstract_params(), shardings)
  first, second = (str(w.message) for w in record)
  assert "cannot be traced on the params' shardings" in first
  # The copied bias, and the replicated Gram matrices, each larger than a
  # shard of their param.
  assert "less sharded than the param" in second and B in second
  assert plan.under_sharded == (B, K, E)
  assert plan.shardings["embedding"].spec == P(None, None)
  assert plan.shardings["embedding"].mesh == mesh


def test_larger_state_that_is_not_a_mirror_warns_when_replicated():
  """A history buffer (3, *shape) from a bare shape is replicated while its
  param is sharded and bigger than a shard: reported. Small bare-shape
  statistics (a row vector) are not."""
  mesh = MESHES["abstract"]()
  shardings = partitioning.named_shardings(mesh, SPECS)
  history = optax.GradientTransformation(
      lambda params: jax.tree.map(
          lambda p: (jnp.zeros((3,) + p.shape), jnp.zeros(p.shape[:1])), params),
      lambda g, state, params=None: (g, state))
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    plan = shardopt.plan_state_shardings(history, abstract_params(), shardings)
  assert E + "[0]" in plan.under_sharded and K + "[0]" in plan.under_sharded
  assert E + "[1]" not in plan.under_sharded
  assert E + "[0]" in str(record[0].message)


def test_state_that_loses_some_of_its_params_axes_warns_naming_what_it_lost():
  """Shampoo's blocks of 16 on a (64, 96) param laid out P('data', 'model'):
  the 6 block columns do not divide over model=4, so the statistics keep
  'data' only (4x their share per device): warned, naming the param, the
  leaf, the spec it got, the axis lost and a block size that tiles the
  shards. Blocks of 8 do, and state small by design (Adafactor's factored
  row/column statistics, per-param scalars) loses axes without a warning."""
  mesh = MESHES["abstract"]()
  params = {"w": jax.ShapeDtypeStruct((64, 96), jnp.float32)}
  shardings = {"w": NamedSharding(mesh, P("data", "model"))}
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    plan = shardopt.plan_state_shardings(
        shardopt.contrib.shampoo(1e-3, block_size=16), params, shardings)
  blocked = [f"[0].{kind}['w'][{i}]" for kind in ("stats", "preconditioners")
             for i in (0, 1)]
  assert plan.under_sharded == tuple(blocked)
  message = str(record[0].message)
  for text in (*blocked, "of params['w'] (64, 96) P('data', 'model')",
               "got P('data', None, None, None), without 'model'=4",
               "split into 2 parts where its param is split into 8",
               "3072 elements per device where its param has 768 (4x)",
               "(32, 24) shard", "block_size dividing its split dimensions (e.g. 8)"):
    assert text in message, text
  assert "graft" not in message and "mu" not in message  # mirrors keep both
  with warnings.catch_warnings():
    warnings.simplefilter("error", shardopt.ReplicatedStateWarning)
    plan = shardopt.plan_state_shardings(
        shardopt.contrib.shampoo(1e-3, block_size=8), params, shardings)
    assert plan.under_sharded == ()
    assert plan.bytes_per_device <= 1.001 * 6 * 64 * 96 * 4 / 8
    big = {"w": jax.ShapeDtypeStruct((256, 512), jnp.float32)}
    plan = shardopt.plan_state_shardings(
        shardopt.adafactor(1e-2), big, {"w": NamedSharding(mesh, P("data", "model"))})
  lost = [l for l in plan.leaves if l.param and "model" not in str(l.spec)]
  assert len(lost) >= 2 and plan.under_sharded == ()  # v_row, scalars
  # An axis of size 1 splits nothing: a mirror without it loses nothing.
  unit = partitioning.make_abstract_mesh({"data": 1, "model": 8})
  with warnings.catch_warnings():
    warnings.simplefilter("error", shardopt.ReplicatedStateWarning)
    plan = shardopt.plan_state_shardings(_bare_shape_momentum(), params,
                                         {"w": NamedSharding(unit, P("data", None))})
  assert plan.under_sharded == () and plan.leaves[0].spec == P(None, None)
