"""The sharded step: state resident per device as planned, results unchanged."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import partitioning
import shardopt
from tests.test_partitioning_memory import resident_bytes_per_device
from tests.test_state_sharding import SPECS, abstract_params, transforms

STEPS = 10


def random_like(tree, seed=0):
  """Normal float32 values with the shapes of ``tree``'s leaves."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  return treedef.unflatten(
      [jax.random.normal(k, p.shape) for k, p in zip(keys, leaves)])


def real_params():
  return random_like(abstract_params())


def grads_at(params, step):
  noise = random_like(params, 100 + step)
  return jax.tree.map(lambda p, n: 0.5 * p + 0.1 * n, params, noise)


def unsharded_run(tx, params):
  update = jax.jit(tx.update)
  state = tx.init(params)
  for step in range(STEPS):
    updates, state = update(grads_at(params, step), state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
  return params, state


def sharded_run(opt, params, param_shardings):
  # Copy first: the step donates (deletes) the params it is given, and
  # device_put to a replicated sharding shares the source's buffer on device 0
  # even with may_alias=False (jax 0.10.2).
  params = jax.device_put(jax.tree.map(jnp.copy, params), param_shardings)
  state = opt.init(params)
  for step in range(STEPS):
    grads = jax.device_put(grads_at(params, step), param_shardings)
    params, state = opt.update(grads, state, params)
  return params, state


def assert_laid_out(state, shardings):
  for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def assert_steps_match_unsharded(opt, tx, params, param_shardings):
  """STEPS sharded steps of ``opt`` equal unsharded steps of ``tx``."""
  got_params, got_state = sharded_run(opt, params, param_shardings)
  want_params, want_state = unsharded_run(tx, params)
  assert_close(got_params, want_params)
  assert_close(got_state, want_state)
  assert_laid_out(got_state, opt.state_shardings)


def placed_params():
  """Param shardings on an Auto (2, 4) mesh, and params placed in them."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  param_shardings = partitioning.named_shardings(mesh, SPECS)
  return param_shardings, jax.device_put(real_params(), param_shardings)


def assert_close(got, want):
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6,
                               atol=1e-6)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", ["adam", "adafactor", "sm3", "lamb", "sgd"])
def test_sharded_steps_match_unsharded(name, axis_types):
  mesh = partitioning.make_mesh({"data": 2, "model": 4}, axis_types=axis_types)
  param_shardings = partitioning.named_shardings(mesh, SPECS)
  tx = transforms()[name]
  params = real_params()
  opt = shardopt.make_sharded_optimizer(tx, params, param_shardings)

  state = opt.init(jax.device_put(params, param_shardings))
  assert_laid_out(state, opt.state_shardings)
  held = resident_bytes_per_device(state)
  assert len(held) == 8
  # Every device holds exactly its planned share, never the full state.
  assert set(held.values()) == {opt.plan.bytes_per_device}
  full = sum(l.nbytes for l in jax.tree.leaves(state))
  assert opt.plan.bytes_per_device < full
  for leaf, planned in zip(jax.tree.leaves(state), opt.plan.leaves):
    assert {s.data.nbytes for s in leaf.addressable_shards} == {
        planned.device_bytes}, planned.path
  over_model = [(leaf, planned) for leaf, planned in
                zip(jax.tree.leaves(state), opt.plan.leaves)
                if "model" in str(planned.spec)]
  assert over_model
  for leaf, planned in over_model:  # a quarter of the leaf on each device
    assert planned.device_bytes * 4 == leaf.nbytes, planned.path

  assert_steps_match_unsharded(opt, tx, params, param_shardings)


def test_donated_step_needs_no_temporary_and_consumes_inputs():
  param_shardings, params = placed_params()
  tx = transforms()["adam"]
  opt = shardopt.make_sharded_optimizer(tx, params, param_shardings)
  state = opt.init(params)
  grads = jax.device_put(grads_at(params, 0), param_shardings)
  compiled = opt.update.lower(grads, state, params).compile()
  state_bytes = sum(l.nbytes for l in jax.tree.leaves(state))
  assert compiled.memory_analysis().temp_size_in_bytes < state_bytes // 100
  new_params, _ = opt.update(grads, state, params)
  assert params["embedding"].is_deleted() and state[0].mu["embedding"].is_deleted()
  assert not grads["embedding"].is_deleted()
  assert new_params["embedding"].sharding.spec == SPECS["embedding"]


def test_zero_lowers_the_updates_peak_per_device():
  """Params replicated over data, Adam's state ZeRO'd over it: arguments and temporaries of the
  compiled update per device below the same update's without ZeRO (the updates, gathered
  before they were applied, took 1.25x the ZeRO'd state in temporaries: 6.68 against 6.29
  MB), and the temporaries about one ZeRO'd moment (the new params' shards before they are
  gathered)."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  params = {"a": jnp.ones((1024, 256)), "b": jnp.ones((256, 1024)), "c": jnp.ones((512, 512))}
  shardings = partitioning.named_shardings(
      mesh, {"a": P(None, "model"), "b": P("model", None), "c": P()})
  peak, temporaries, state_per_device = {}, {}, {}
  for zero in (None, "data"):
    opt = shardopt.make_sharded_optimizer(shardopt.adam(1e-3), params, shardings,
                                          shard_state_over=zero)
    placed = jax.device_put(params, shardings)
    state = opt.init(placed)
    memory = opt.update.lower(placed, state, placed).compile().memory_analysis()
    temporaries[zero] = memory.temp_size_in_bytes
    peak[zero] = memory.argument_size_in_bytes + memory.temp_size_in_bytes
    state_per_device[zero] = opt.plan.bytes_per_device
  assert peak["data"] < peak[None]
  assert temporaries["data"] < 0.51 * state_per_device["data"]


def test_without_donation_inputs_survive():
  param_shardings, params = placed_params()
  tx = transforms()["sgd"]
  state_shardings = shardopt.state_shardings(tx, params, param_shardings)
  init = shardopt.sharded_init(tx, param_shardings, state_shardings)
  update = shardopt.sharded_update(tx, param_shardings, state_shardings,
                                   donate=False)
  state = init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  new_params, _ = update(grads, state, params)
  assert not params["embedding"].is_deleted()
  np.testing.assert_allclose(np.asarray(new_params["embedding"]),
                             np.asarray(params["embedding"]) - 1e-2, rtol=1e-6)


def test_extra_args_reach_the_update_arrays_traced_and_callables_static():
  """A transform that needs ``value`` (an array) and ``value_fn`` (a callable),
  as line searches do, gets both through the sharded step."""

  def update(updates, state, params=None, *, value, value_fn):
    scale = value_fn(value)
    return jax.tree.map(lambda u: -scale * u, updates), state

  tx = shardopt.GradientTransformationExtraArgs(shardopt.init_empty_state, update)
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  param_shardings = partitioning.named_shardings(mesh, SPECS)
  opt = shardopt.make_sharded_optimizer(tx, abstract_params(), param_shardings)
  params = jax.device_put(real_params(), param_shardings)
  expected = jax.tree.map(lambda p: p - 0.5 * p, real_params())
  halve = lambda v: v / 4.0
  new_params, _ = opt.update(params, opt.init(params), jax.tree.map(jnp.copy, params),
                             value=jnp.float32(2.0), value_fn=halve)
  for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_acprop_on_explicit_axes_stays_on_the_unsharded_path():
  """contrib.acprop on an Explicit (2, 4) mesh, 12 steps: within 1e-6 of
  the unsharded step (its belief statistic once drifted 8.5e-4 away when
  the update saw the gradients in another layout than its state)."""
  param_shardings = partitioning.named_shardings(
      partitioning.make_mesh({"data": 2, "model": 4}, axis_types="explicit"),
      SPECS)
  tx = shardopt.contrib.acprop(0.1)
  want = got = real_params()
  opt = shardopt.make_sharded_optimizer(tx, got, param_shardings, donate=False)
  update = jax.jit(tx.update)
  with jax.sharding.set_mesh(jax.tree.leaves(param_shardings)[0].mesh):
    got = jax.device_put(got, param_shardings)
    state, want_state = opt.init(got), tx.init(want)
    for step in range(12):
      got, state = opt.update(jax.device_put(grads_at(got, step), param_shardings),
                              state, got)
      updates, want_state = update(grads_at(want, step), want_state, want)
      want = shardopt.apply_updates(want, updates)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    scale = float(np.max(np.abs(np.asarray(w))))
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-6 * scale)


def test_a_user_value_fn_sees_the_params_in_their_own_layout():
  """L-BFGS's line search calls ``value_fn`` on candidate params; with ZeRO
  on Explicit axes the step hands it the params in their own layout, so a
  loss whose batch is split over 'data' still traces (in the update layout
  the params' ZeRO axis would meet the batch's)."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4}, axis_types="explicit")
  # ZeRO splits w's columns over 'data': in the update layout x @ w would
  # be split over 'data' twice.
  shardings = {"w": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("model", None))}
  batch_sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None))
  params = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 16))}
  x = jax.random.normal(jax.random.PRNGKey(1), (32, 8))

  def loss(p, batch):
    return jnp.mean(jnp.square(batch @ p["w"] - 1.0))

  tx = shardopt.lbfgs()
  opt = shardopt.make_sharded_optimizer(tx, params, shardings,
                                        shard_state_over="data",
                                        min_shard_bytes=256, donate=False)
  assert opt.plan.zero_sharded
  with jax.sharding.set_mesh(mesh):
    got, batch = jax.device_put(params, shardings), jax.device_put(x, batch_sharding)
    state = opt.init(got)
    value_fn = functools.partial(loss, batch=batch)
    for _ in range(3):
      value, grad = jax.jit(jax.value_and_grad(value_fn))(got)
      got, state = opt.update(grad, state, got, value=value, grad=grad,
                              value_fn=value_fn)
  want, want_state = params, tx.init(params)
  value_fn = functools.partial(loss, batch=x)
  for _ in range(3):
    value, grad = jax.value_and_grad(value_fn)(want)
    updates, want_state = tx.update(grad, want_state, want, value=value,
                                    grad=grad, value_fn=value_fn)
    want = shardopt.apply_updates(want, updates)
  np.testing.assert_allclose(np.asarray(got["w"]), np.asarray(want["w"]),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("memory_kind", [None, "pinned_host"])
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_init_eval_shape_gives_the_state_in_its_shardings(axis_types, memory_kind):
  """``opt.init.eval_shape``: the state's shapes and dtypes as ``init``
  makes them, each in its derived sharding and memory (a restore target),
  from params given as arrays or as abstract values."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4}, axis_types=axis_types)
  param_shardings = partitioning.named_shardings(mesh, SPECS)
  opt = shardopt.make_sharded_optimizer(
      shardopt.adamw(1e-2, state_bits=8), real_params(), param_shardings,
      shard_state_over="data", state_memory_kind=memory_kind)
  placed = jax.device_put(real_params(), param_shardings)
  state = opt.init(placed)
  abstract = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                          real_params(), param_shardings)
  for params in (placed, abstract):
    target = opt.init.eval_shape(params)
    assert jax.tree.structure(target) == jax.tree.structure(state)
    for got, leaf, sharding in zip(jax.tree.leaves(target), jax.tree.leaves(state),
                                   jax.tree.leaves(opt.state_shardings)):
      assert (got.shape, got.dtype) == (leaf.shape, leaf.dtype)
      assert got.sharding.is_equivalent_to(sharding, leaf.ndim)
      assert got.sharding.memory_kind == leaf.sharding.memory_kind
  assert {x.sharding.memory_kind for x in jax.tree.leaves(target)} == {
      memory_kind or "device"}
