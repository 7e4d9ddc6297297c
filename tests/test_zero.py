"""ZeRO: state that mirrors a param also shards over the data axis; the
state of a param already split over it (FSDP) follows it and counts as
sharded."""

import warnings

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import partitioning
import shardopt
from tests.test_partitioning_memory import resident_bytes_per_device
from tests.test_state_sharding import transforms
from tests.test_step import assert_steps_match_unsharded, random_like

# Params replicated over 'data' (size 2), except "fsdp".
SHAPES = {"embedding": (64, 32), "kernel": (32, 16), "bias": (16,),
          "odd": (5, 3), "fsdp": (8, 4), "wide": (6, 8)}
SPECS = {"embedding": P("model", None), "kernel": P(None, "model"),
         "bias": P("model"), "odd": P(), "fsdp": P("data", None), "wide": P()}
# Where ZeRO puts 'data' on the moments, or why it cannot.
ZERO_SPECS = {"embedding": P("model", "data"), "kernel": P("data", "model"),
              "wide": P(None, "data"),  # the largest free divisible dim: 8
              "bias": P("model"), "odd": P(None, None), "fsdp": P("data", None)}
SKIPPED = {"bias": "no free dimension", "odd": "divisible by 2"}


def abstract():
  return {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in SHAPES.items()}


def shardings(axis_types="auto"):
  mesh = partitioning.make_mesh({"data": 2, "model": 4}, axis_types=axis_types)
  return partitioning.named_shardings(mesh, SPECS)


def test_plan_shards_mirrors_and_reports_the_rest():
  plan = shardopt.plan_state_shardings(transforms()["adam"], abstract(),
                                       shardings(), shard_state_over="data", min_shard_bytes=0)
  mu, nu = plan.shardings[0].mu, plan.shardings[0].nu
  for name, want in ZERO_SPECS.items():
    assert mu[name].spec == want == nu[name].spec, name
  skipped = {l.param: l.zero for l in plan.zero_skipped}
  assert set(skipped) == {f"['{k}']" for k in SKIPPED}
  for name, reason in SKIPPED.items():
    assert reason in skipped[f"['{name}']"]
  assert len(plan.zero_sharded) == 2 * 4  # mu and nu of 3 params + fsdp's
  fsdp = [l for l in plan.zero_sharded if l.param == "['fsdp']"]
  assert [l.zero for l in fsdp] == ["dim 0 (the param's own layout)"] * 2
  count = [l for l in plan.leaves if l.param is None]
  assert [l.zero for l in count] == ["not sharded: scalar"]
  text = str(plan)
  assert "ZeRO over 'data': 8 sharded, 4 mirrors not" in text
  assert "no free dimension divisible by 2 (free dims [5, 3])" in text


def test_state_shardings_warns_about_what_zero_left_out():
  with pytest.warns(shardopt.ReplicatedStateWarning,
                    match=r"shard_state_over='data' left") as record:
    shardopt.state_shardings(transforms()["adam"], abstract(), shardings(),
                             shard_state_over="data", min_shard_bytes=0)
  message = str(record[0].message)
  assert all(f"['{k}']" in message for k in SKIPPED)
  assert "['embedding']" not in message


@pytest.mark.parametrize("build", ["state_shardings", "make_sharded_optimizer"])
def test_zero_that_splits_no_leaf_under_min_shard_bytes_says_so(build):
  """Every param under the default min_shard_bytes (4 KiB): ZeRO split nothing, with no
  warning, and the plan's summary said '0 mirrors not'. Now one warning says why and what to
  pass, the summary counts the leaves left small, and min_shard_bytes=0 halves each moment's
  bytes on every device."""
  tx = transforms()["adam"]
  params = {k: v for k, v in abstract().items() if k != "embedding"}  # 8 KiB: split
  sharding = {k: v for k, v in shardings().items() if k != "embedding"}
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    getattr(shardopt, build)(tx, params, sharding, shard_state_over="data")
  said = [str(r.message) for r in record if "split no state leaf" in str(r.message)]
  assert said == ["shard_state_over='data' split no state leaf itself: 8 leaves under"
                  " min_shard_bytes=4096 bytes were left as they are (pass a smaller"
                  " min_shard_bytes, e.g. 0, to split those that can be)"], \
      [str(r.message) for r in record]
  plan = shardopt.plan_state_shardings(tx, params, sharding, shard_state_over="data")
  assert "2 sharded, 0 mirrors not, 0 other leaves >= 4096 bytes not, 8 smaller left" in str(plan)
  with warnings.catch_warnings():  # one leaf split: no such warning
    warnings.filterwarnings("error", "shard_state_over='data' split no state leaf")
    shardopt.state_shardings(tx, abstract(), shardings(), shard_state_over="data")
  real = jax.tree.map(lambda a, s: jax.device_put(jnp.ones(a.shape, a.dtype), s), params,
                      sharding)
  def moment_bytes(**zero):
    with pytest.warns(shardopt.ReplicatedStateWarning):  # the leaves ZeRO cannot split
      opt = shardopt.make_sharded_optimizer(tx, params, sharding, shard_state_over="data",
                                            **zero)
    state = opt.init(real)
    return {k: max(resident_bytes_per_device(state[0].mu[k]).values()) for k in params}
  small, split = moment_bytes(), moment_bytes(min_shard_bytes=0)
  halved = {"kernel", "wide"}  # fsdp's is split by its param already; bias, odd cannot be
  assert all(split[k] * 2 == small[k] for k in halved), (small, split)
  assert all(split[k] == small[k] for k in set(params) - halved), (small, split)


@pytest.mark.parametrize("build", ["plan_state_shardings", "state_shardings",
                                   "make_sharded_optimizer"])
def test_zero_over_an_axis_of_size_1_splits_nothing_and_says_so_once(build):
  """data=1 x model=8: ZeRO over 'data' splits nothing. The plan said 'dim 0'
  for every moment and zero_sharded listed them, bytes per device unchanged,
  no warning; now no leaf counts as sharded, the plan says why and one
  warning says so (also for the FSDP param, whose spec names 'data')."""
  mesh = partitioning.make_mesh({"data": 1, "model": 8})
  specs = dict(SPECS, embedding=P("model", None), kernel=P(None, "model"),
               bias=P("model"))
  sharding = partitioning.named_shardings(mesh, specs)
  without = shardopt.plan_state_shardings(transforms()["adam"], abstract(), sharding)
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    got = getattr(shardopt, build)(transforms()["adam"], abstract(), sharding,
                                   shard_state_over="data", min_shard_bytes=0)
  assert len(record) == 1
  assert "mesh axis 'data' has size 1 on this mesh ({'data': 1, 'model': 8}), so ZeRO splits" \
      " no state leaf" in str(record[0].message)
  plan = got.plan if build == "make_sharded_optimizer" else got
  if build == "state_shardings":  # the shardings of the plan
    with pytest.warns(shardopt.ReplicatedStateWarning, match="has size 1"):
      plan = shardopt.plan_state_shardings(transforms()["adam"], abstract(), sharding,
                                           shard_state_over="data", min_shard_bytes=0)
    assert jax.tree.leaves(got) == jax.tree.leaves(plan.shardings)
  assert plan.zero_sharded == ()
  assert plan.bytes_per_device == without.bytes_per_device
  assert {l.zero for l in plan.zero_skipped} == {
      "not sharded: mesh axis 'data' has size 1, so it splits nothing"}
  assert len(plan.zero_skipped) == 2 * len(SHAPES)
  assert "ZeRO over 'data': the axis has size 1, so no leaf is split" in str(plan)
  for name, shape in SHAPES.items():  # tx.update sees the params' own layout
    assert plan.update_shardings[name].is_equivalent_to(sharding[name], len(shape)), name


@pytest.mark.parametrize("name,axis_types", [
    ("adam", "auto"), ("adam", "explicit"), ("sm3", "explicit"),
    ("adafactor", "explicit")])
def test_zero_halves_state_bytes_and_keeps_results(name, axis_types):
  param_shardings = shardings(axis_types)
  params = random_like(abstract())
  tx = transforms()[name]
  plain = shardopt.make_sharded_optimizer(tx, params, param_shardings)
  with pytest.warns(shardopt.ReplicatedStateWarning):  # bias, odd
    zero = shardopt.make_sharded_optimizer(tx, params, param_shardings,
                                           shard_state_over="data", min_shard_bytes=0)
  placed = jax.device_put(params, param_shardings)
  plain_state, zero_state = plain.init(placed), zero.init(placed)
  for path_leaf, a, b, planned in zip(
      jax.tree_util.tree_leaves_with_path(plain_state),
      jax.tree.leaves(plain_state), jax.tree.leaves(zero_state),
      zero.plan.leaves):
    held_plain = resident_bytes_per_device(a)
    held_zero = resident_bytes_per_device(b)
    assert held_plain.keys() == held_zero.keys() and len(held_zero) == 8
    factor = 2 if (planned.zero.startswith("dim ")
                   and "own layout" not in planned.zero) else 1
    for device, nbytes in held_zero.items():
      assert nbytes * factor == held_plain[device], path_leaf[0]
  assert zero.plan.zero_sharded
  saved = plain.plan.bytes_per_device - zero.plan.bytes_per_device
  assert saved == sum(l.device_bytes for l in zero.plan.zero_sharded
                      if "own layout" not in l.zero)

  assert_steps_match_unsharded(zero, tx, params, param_shardings)


@pytest.mark.parametrize("block_size,param,blocks", [
    (64, "one", "1 block"), (32, "three", "3 blocks")])
def test_a_block_grid_zero_cannot_split_says_how_many_blocks(block_size, param, blocks):
  """Shampoo's statistics of a (64, 32) param in blocks of 64, and of a
  (96, 32) one in blocks of 32: 1 and 3 blocks along dimension 0, the one
  ZeRO splits the params' other state on; neither count divides over
  'data' (2), and the plan says so of each statistic and preconditioner."""
  params = {"one": jax.ShapeDtypeStruct((64, 32), jnp.float32),
            "three": jax.ShapeDtypeStruct((96, 32), jnp.float32)}
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  plan = shardopt.plan_state_shardings(
      shardopt.contrib.shampoo(0.1, block_size=block_size), params,
      partitioning.named_shardings(mesh, {"one": P(), "three": P()}),
      shard_state_over="data", min_shard_bytes=0)
  reasons = [l.zero for l in plan.zero_skipped if l.param == f"['{param}']"]
  assert len(reasons) == 4  # 2 statistics and 2 preconditioners
  assert set(reasons) == {f"not sharded: {blocks} along its param's ZeRO "
                          "dimension 0, not divisible by 2"}


def test_the_warning_gives_each_leaf_zero_left_out_a_line_with_its_reason():
  """The mirrors of SKIPPED's params, one line each: path, shape, reason."""
  with pytest.warns(shardopt.ReplicatedStateWarning) as record:
    plan = shardopt.plan_state_shardings(transforms()["adam"], abstract(), shardings(),
                                         shard_state_over="data", min_shard_bytes=0)
    plan.warn_zero_skipped()
  assert str(record[-1].message).splitlines() == [
      "shard_state_over='data' left these state leaves as they were (not sharded over it by ZeRO):",
      "  [0].mu['bias'] (16,): no free dimension",
      "  [0].mu['odd'] (5, 3): no free dimension divisible by 2 (free dims [5, 3])",
      "  [0].nu['bias'] (16,): no free dimension",
      "  [0].nu['odd'] (5, 3): no free dimension divisible by 2 (free dims [5, 3])"]
