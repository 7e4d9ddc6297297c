"""Which param owns each state leaf (the stand-in trace), and ZeRO over all of
the state that is large: tuple, list, dict and nested params under every
kind of wrapper, and L-BFGS's (m, *param) memories."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax
import pytest

import partitioning
import shardopt
from tests.test_partitioning_memory import resident_bytes_per_device

# Distinct shapes, so a leaf's shape names the param it mirrors; each leaf is
# >= the default min_shard_bytes (4 KiB) and replicated over 'data'.
W, B, C = (32, 64), (2048,), (64, 48)
SPEC = {W: P(None, "model"), B: P(), C: P("model", None), (16,): P()}

PARAMS = {
    "tuple": lambda: (_sds(W), _sds(B)),
    "list": lambda: [_sds(W), _sds(B)],
    "dict": lambda: {"w": _sds(W), "b": _sds(B)},
    "nested": lambda: {"enc": (_sds(W), [_sds(B)]), "head": {"c": _sds(C)}},
}


def _sds(shape):
  return jax.ShapeDtypeStruct(shape, jnp.float32)


def _labels(params, first, second):
  """``first`` for the first param, ``second`` for the rest."""
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten([first] + [second] * (len(leaves) - 1))


TRANSFORMS = {
    "chain": lambda p: shardopt.chain(shardopt.scale_by_adam(),
                                      shardopt.scale(-0.1)),
    "named_chain": lambda p: shardopt.named_chain(
        ("adam", shardopt.scale_by_adam()), ("trace", shardopt.trace(0.9))),
    "partition": lambda p: shardopt.partition(
        {"a": shardopt.adam(0.1), "s": shardopt.sgd(0.1, momentum=0.9)},
        _labels(p, "a", "s")),
    "partition_fn": lambda p: shardopt.partition(
        {"a": shardopt.adam(0.1), "s": shardopt.sgd(0.1, momentum=0.9)},
        lambda params: _labels(params, "s", "a")),
    "masked": lambda p: shardopt.chain(
        shardopt.masked(shardopt.adam(0.1), _labels(p, False, True)),
        shardopt.scale(1.0)),
    "MultiSteps": lambda p: shardopt.MultiSteps(
        shardopt.adam(0.1), 2).gradient_transformation(),
    "inject_hyperparams": lambda p: shardopt.inject_hyperparams(
        shardopt.adamw)(learning_rate=0.1),
    "optax_chain": lambda p: optax.chain(optax.scale_by_adam(), optax.scale(-0.1)),
}


def _shardings(params, mesh):
  return jax.tree.map(lambda p: NamedSharding(mesh, SPEC[p.shape]), params)


def _plan(tx, params, **kwargs):
  mesh = partitioning.make_abstract_mesh({"data": 2, "model": 4})
  return shardopt.plan_state_shardings(tx, params, _shardings(params, mesh),
                                       **kwargs)


@pytest.mark.parametrize("kind", sorted(PARAMS))
@pytest.mark.parametrize("name", sorted(TRANSFORMS))
def test_every_leaf_is_owned_by_its_own_param_and_zero_sharded(name, kind):
  params = PARAMS[kind]()
  path_of = {p.shape: jax.tree_util.keystr(k)
             for k, p in jax.tree_util.tree_flatten_with_path(params)[0]}
  plan = _plan(TRANSFORMS[name](params), params, shard_state_over="data")
  param_sized = [l for l in plan.leaves if l.shape in path_of]
  assert len(param_sized) >= len(path_of), plan
  for leaf in plan.leaves:
    if leaf.shape in path_of:  # a moment, trace or accumulator of one param
      assert leaf.param == path_of[leaf.shape], f"{leaf.path}\n{plan}"
      assert leaf.mirrors and "data" in str(leaf.spec), f"{leaf.path}\n{plan}"
    else:  # counters, hyperparameters
      assert leaf.shape == () and leaf.param is None, f"{leaf.path}\n{plan}"
  assert plan.zero_skipped == ()


def test_tuple_params_under_chain_no_longer_all_owned_by_the_last_param():
  """The reported bug: the chain's 2-tuple state matched the prefix of the
  params (w, b), so every leaf was put down to params[1]."""
  params = PARAMS["tuple"]()
  plan = _plan(TRANSFORMS["chain"](params), params, shard_state_over="data")
  owners = {l.path: l.param for l in plan.leaves if l.param is not None}
  assert owners == {"[0].mu[0]": "[0]", "[0].mu[1]": "[1]",
                    "[0].nu[0]": "[0]", "[0].nu[1]": "[1]"}
  mu_w = plan.shardings[0].mu[0]
  assert mu_w.spec == P("data", "model")  # ZeRO on the free dim of w


def test_init_that_cannot_run_on_stand_ins_falls_back_to_the_prefix_match():
  """An init that concatenates its params cannot see stand-ins; its per-param
  part is still owned by the prefix match."""
  def init(params):
    flat = jnp.concatenate([p.ravel() for p in jax.tree.leaves(params)])
    return (flat, jax.tree.map(jnp.zeros_like, params))

  tx = optax.GradientTransformation(init, lambda g, s, p=None: (g, s))
  params = PARAMS["dict"]()
  plan = _plan(tx, params, shard_state_over="data")
  owners = [l.param for l in plan.leaves]
  assert owners == [None, "['b']", "['w']"]
  flat = plan.leaves[0]
  assert flat.shape == (2048 + 32 * 64,) and flat.zero == "dim 0"


def test_the_prefix_match_does_not_take_a_chains_parts_for_params_of_one_shape():
  """Tuple params of one shape under chain(masked(adam, fn), trace), the mask function reading
  ndim (no stand-in trace): the chain's 2-tuple state is not matched to the params' 2-tuple
  (mu[1] and nu[1] were put down to params[0], trace[0] to params[1]); each moment is owned by
  its own param."""
  params = (_sds(W), _sds(W))
  mask = lambda p: tuple(x.ndim == 2 for x in p)
  tx = shardopt.chain(shardopt.masked(shardopt.scale_by_adam(), mask), shardopt.trace(0.9))
  plan = _plan(tx, params, shard_state_over="data")
  owners = {l.path: l.param for l in plan.leaves if l.shape}
  assert owners == {f"[0].inner_state.{m}[{i}]": f"[{i}]" for m in ("mu", "nu")
                    for i in range(2)} | {f"[1].trace[{i}]": f"[{i}]" for i in range(2)}


def test_the_prefix_match_keeps_per_param_states_shaped_like_the_params():
  """SM3 under masked(fn) on a list of two params of one shape (no stand-in trace): each
  param's covers are a list of 2, the params' structure, and stay its own."""
  params = [_sds(W), _sds(W)]
  tx = shardopt.masked(shardopt.scale_by_sm3(), lambda p: [x.ndim == 2 for x in p])
  plan = _plan(tx, params, shard_state_over="data")
  owners = {l.path: l.param for l in plan.leaves if l.shape}
  assert owners == {f".inner_state.mu[{i}][{j}]": f"[{i}]" for i in range(2)
                    for j in range(2)} | {f".inner_state.nu[{i}]": f"[{i}]" for i in range(2)}


def test_min_shard_bytes_decides_what_zero_touches():
  params = {"w": _sds(W), "b": _sds((16,))}  # 8 KiB and 64 bytes
  tx = shardopt.adam(0.1)
  plan = _plan(tx, params, shard_state_over="data")
  zero = {l.path: l.zero for l in plan.leaves}
  assert zero["[0].mu['w']"] == "dim 0"
  assert zero["[0].mu['b']"] == "not sharded: its param has 64 bytes < min_shard_bytes=4096"
  big = _plan(tx, params, shard_state_over="data", min_shard_bytes=16 * 1024)
  assert not big.zero_sharded and not big.zero_skipped
  with pytest.raises(ValueError, match="min_shard_bytes=-1"):
    _plan(tx, params, shard_state_over="data", min_shard_bytes=-1)


@pytest.mark.parametrize("axes", [("data", "model"), ["data"]])
def test_zero_over_several_axes_is_refused_saying_so(axes):
  with pytest.raises(TypeError, match=r"expected one mesh axis name .*ZeRO over several axes"):
    _plan(shardopt.adam(0.1), {"w": _sds(W)}, shard_state_over=axes)


def test_a_small_params_large_state_leaf_is_zero_sharded_on_a_param_dimension():
  """A 2 KiB param with L-BFGS's 20 KiB (10, 16, 32) memories: a leaf of at least
  min_shard_bytes gets the ZeRO axis on a param dimension (it was left whole on every device,
  its param below the threshold); Adam's 2 KiB moments of the same param stay whole."""
  params = {"small": _sds((16, 32))}
  mesh = partitioning.make_abstract_mesh({"data": 2, "model": 4})
  plan = lambda tx: shardopt.plan_state_shardings(
      tx, params, {"small": NamedSharding(mesh, P())}, shard_state_over="data")
  lbfgs = plan(shardopt.lbfgs(memory_size=10))
  memories = [l for l in lbfgs.leaves if l.shape == (10, 16, 32)]
  assert len(memories) == 2 and all(l.spec == P(None, None, "data") for l in memories)
  assert not lbfgs.zero_skipped
  adam = plan(shardopt.adam(0.1))
  assert not adam.zero_sharded
  assert {l.zero for l in adam.leaves if l.shape} == {
      "not sharded: its param has 2048 bytes < min_shard_bytes=4096"}


def test_large_leaf_that_cannot_be_sharded_is_listed_and_warned_about():
  params = {"odd": _sds((1025,))}  # 4100 bytes, odd length
  mesh = partitioning.make_abstract_mesh({"data": 2, "model": 4})
  shardings = {"odd": NamedSharding(mesh, P())}
  with pytest.warns(shardopt.ReplicatedStateWarning, match=r"\['odd'\]"):
    opt = shardopt.make_sharded_optimizer(shardopt.sgd(0.1, momentum=0.9),
                                          params, shardings,
                                          shard_state_over="data")
  (skipped,) = opt.plan.zero_skipped
  assert "no free dimension divisible by 2 (free dims [1025])" in skipped.zero
  assert "1 mirrors not" in str(opt.plan)


@pytest.mark.parametrize("name", ["scale_by_lbfgs", "lbfgs"])
def test_lbfgs_memories_are_zero_sharded_on_a_param_dimension(name):
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  shape = (64, 32)
  shardings = {"w": NamedSharding(mesh, P(None, "model"))}
  params = {"w": jax.device_put(jnp.ones(shape), shardings["w"])}
  tx = getattr(shardopt, name)(memory_size=4)
  plain = shardopt.make_sharded_optimizer(tx, params, shardings)
  zero = shardopt.make_sharded_optimizer(tx, params, shardings,
                                         shard_state_over="data")
  memories = [l for l in zero.plan.leaves if l.shape == (4, *shape)]
  assert {l.path.rsplit(".", 1)[-1][:20] for l in memories} == {
      "diff_params_memory['", "diff_updates_memory["}
  for leaf in memories:
    assert leaf.spec == P(None, "data", "model") and leaf.zero == "dim 1"
  plain_state, zero_state = plain.init(params), zero.init(params)
  for a, b, planned in zip(jax.tree.leaves(plain_state),
                           jax.tree.leaves(zero_state), zero.plan.leaves):
    if planned.shape != (4, *shape):
      continue
    held_plain, held_zero = (resident_bytes_per_device(a),
                             resident_bytes_per_device(b))
    assert set(held_plain.values()) == {4 * 64 * 8 * 4}  # a quarter
    assert set(held_zero.values()) == {4 * 32 * 8 * 4}  # an eighth
