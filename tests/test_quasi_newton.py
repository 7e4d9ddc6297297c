"""scale_by_lbfgs against optax: alone with a fixed step, and as L-BFGS with
the zoom line search, on the objective of test_linesearch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle
from tests.test_linesearch import assert_runs_match, objective, run


@pytest.mark.default_codegen
@pytest.mark.parametrize("kwargs", [
    dict(), dict(memory_size=3, scale_init_precond=False)])
def test_fixed_step_matches_optax(kwargs):
  def build(lib):
    return lib.chain(lib.scale_by_lbfgs(**kwargs), lib.scale(-0.05))
  ours = oracle.run_updates(build(shardopt), oracle.mixed_tree(), 20,
                            with_params=True, jit=True)
  theirs = oracle.run_updates(build(optax), oracle.mixed_tree(), 20,
                              with_params=True, jit=True)
  for step, (g, w) in enumerate(zip(ours, theirs)):
    try:
      oracle.assert_trees_close(g, w, rtol=1e-6, atol=1e-7)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


@pytest.mark.default_codegen
@pytest.mark.parametrize("memory_size", [10, 4])
def test_with_zoom_linesearch_matches_optax(memory_size):
  def build(lib):
    return lib.chain(
        lib.scale_by_lbfgs(memory_size=memory_size),
        lib.scale(-1.0),
        lib.scale_by_zoom_linesearch(max_linesearch_steps=20,
                                     initial_guess_strategy="one"))
  ours, theirs = run(build(shardopt)), run(build(optax))
  assert_runs_match(ours, theirs)
  # It converges: gradient norm ~47 -> ~3e-5 in 20 steps.
  grad_norms = [float(shardopt.global_norm(s[2].grad)) for _, _, s in ours]
  assert grad_norms[-1] < 1e-4 * grad_norms[0]


def test_memory_is_stacked_params_and_counts():
  params = oracle.mixed_tree()
  tx = shardopt.scale_by_lbfgs(memory_size=3)
  state = tx.init(params)
  for p, m in zip(jax.tree.leaves(params),
                  jax.tree.leaves(state.diff_params_memory)):
    assert m.shape == (3,) + p.shape and m.dtype == p.dtype
  grads = jax.grad(objective)(params)
  for _ in range(4):
    _, state = tx.update(grads, state, params)
    params = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    grads = jax.grad(objective)(params)
  assert int(state.count) == 4
  assert np.all(np.asarray(state.weights_memory) != 0)  # ring buffer full
  assert state._fields == optax.ScaleByLBFGSState._fields


def test_lbfgs_names_the_alias_not_a_module():
  from shardopt._src.transforms import lbfgs as lbfgs_module
  assert callable(shardopt.lbfgs) and shardopt.lbfgs.__module__ == (
      "shardopt._src.aliases.lbfgs")
  assert shardopt.scale_by_lbfgs is lbfgs_module.scale_by_lbfgs


def test_needs_params_and_positive_memory():
  with pytest.raises(ValueError, match="memory_size"):
    shardopt.scale_by_lbfgs(memory_size=0)
  tx = shardopt.scale_by_lbfgs()
  params = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match="params"):
    tx.update(params, tx.init(params))


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_sharded_lbfgs_with_linesearch_equals_unsharded(axis_type):
  """On a (2, 4) mesh the inner products contract sharded axes (Explicit
  meshes need a stated output sharding): same numbers, memory stays sharded."""
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
  kind = getattr(AxisType, axis_type)
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
  params = {"w": jnp.arange(96.0).reshape(8, 12) / 50, "b": jnp.ones(12)}
  specs = {"w": P("data", "model"), "b": P("model")}
  fn = lambda p: sum(jnp.sum((x - 0.3) ** 2) + 0.1 * jnp.sum(x**4)  # noqa: E731
                     for x in jax.tree.leaves(p))

  def three_steps(params):
    tx = shardopt.lbfgs(memory_size=4)
    state = tx.init(params)
    for _ in range(3):
      value, grad = jax.value_and_grad(fn)(params)
      updates, state = tx.update(grad, state, params, value=value, grad=grad,
                                 value_fn=fn)
      params = shardopt.apply_updates(params, updates)
    return params, state

  want, _ = jax.jit(three_steps)(params)
  sharded = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)),
                         params, specs)
  with jax.set_mesh(mesh):
    got, state = jax.jit(three_steps)(sharded)
  oracle.assert_trees_close(got, want)
  memory = state[0].diff_params_memory["w"]
  assert memory.sharding.spec == P(None, "data", "model")
  assert {s.data.shape for s in memory.addressable_shards} == {(4, 4, 3)}


@pytest.mark.parametrize("dtype,with_linesearch", [
    (jnp.float16, False), (jnp.bfloat16, False), (jnp.bfloat16, True)])
def test_low_precision_params_get_updates_in_their_dtype_as_in_optax(dtype, with_linesearch):
  params = {"w": jnp.array([1.0, -2.0, 0.5], dtype),
            "b": jnp.array([[0.3, 0.2], [0.1, -0.4]], dtype)}

  def loss(p):
    return jnp.sum(p["w"].astype(jnp.float32) ** 2) + jnp.sum(jnp.cos(p["b"]))

  def updates(lib):
    tx = lib.lbfgs() if with_linesearch else lib.lbfgs(linesearch=None)
    @jax.jit
    def step(p, state):
      value, grad = jax.value_and_grad(loss)(p)
      u, state = tx.update(grad, state, p, value=value, grad=grad, value_fn=loss)
      return lib.apply_updates(p, u), state, u

    state, p, out = tx.init(params), params, []
    for _ in range(2):  # the second with a memory
      p, state, u = step(p, state)
      out.append(u)
    return out

  ours, theirs = updates(shardopt), updates(optax)
  for g, w in zip(ours, theirs):
    assert jax.tree.map(lambda x: x.dtype, g) == jax.tree.map(lambda x: x.dtype, w)
  # The first step has no memory yet: the same numbers. Later ones differ:
  # shardopt takes L-BFGS's inner products in float32, optax rounds them to
  # the params' dtype, and the two directions drift apart step by step, well
  # beyond the last bits.
  oracle.assert_trees_close(ours[0], theirs[0], rtol=0, atol=0)


@pytest.mark.parametrize("scale_init_precond", [True, False])
@pytest.mark.parametrize("leaves", [
    {"w": jnp.float32, "i": jnp.int32},  # an integer leaf: float updates
    {"w": jnp.float32, "b": jnp.bfloat16},  # mixed widths: the scale's float32
])
def test_updates_promote_as_optax_promotes_them(leaves, scale_init_precond):
  values = {"w": [1.0, -2.0, 0.5], "i": [1, 3, -2], "b": [0.3, 0.2, -0.4]}
  params = {k: jnp.array(values[k], dtype) for k, dtype in leaves.items()}

  def directions(lib):
    tx = lib.scale_by_lbfgs(scale_init_precond=scale_init_precond)
    state, p, out = tx.init(params), params, []
    for step in range(3):
      grads = jax.tree.map(lambda x: (x * (step + 2) - 1).astype(x.dtype), p)
      u, state = tx.update(grads, state, p)
      p = jax.tree.map(lambda x, d: (x - d).astype(x.dtype), p, u)
      out.append(u)
    return out

  ours, theirs = directions(shardopt), directions(optax)
  for g, w in zip(ours, theirs):
    assert jax.tree.map(lambda x: x.dtype, g) == jax.tree.map(lambda x: x.dtype, w)
    oracle.assert_trees_close(g, w, rtol=1e-5, atol=1e-6)
