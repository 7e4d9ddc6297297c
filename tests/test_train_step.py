"""opt.train_step: loss, gradients and update in one donated program, equal
to the two-program path (a jitted value_and_grad, then opt.update)."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import partitioning
import shardopt

STEPS = 10
SPECS = {"w1": P(None, "model"), "w2": P("model", None), "scale": P()}


def _loss(params, batch):
  """A two-layer regression: mean squared error of (x w1) gelu w2 scale."""
  x, y = batch
  h = jax.nn.gelu(x @ params["w1"])
  return jnp.mean((h @ params["w2"] * params["scale"] - y) ** 2)


def _params():
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  return {"w1": 0.3 * jax.random.normal(k1, (16, 64)),
          "w2": 0.3 * jax.random.normal(k2, (64, 8)),
          "scale": jnp.ones((8,))}


def _batch(step, mesh):
  kx, ky = jax.random.split(jax.random.PRNGKey(100 + step))
  batch = (jax.random.normal(kx, (32, 16)), jax.random.normal(ky, (32, 8)))
  return jax.device_put(batch, NamedSharding(mesh, P("data")))


def _setup(name):
  mesh = partitioning.make_mesh({"data": 4, "model": 2})
  shardings = partitioning.named_shardings(mesh, SPECS)
  tx = {"adam": shardopt.adam(1e-2),
        "adafactor": shardopt.adafactor(1e-2, min_dim_size_to_factor=8),
        "sm3": shardopt.sm3(1e-2)}[name]
  opt = shardopt.make_sharded_optimizer(tx, _params(), shardings,
                                        shard_state_over="data",
                                        min_shard_bytes=0)
  return mesh, shardings, opt


def _placed(shardings):
  return jax.device_put(jax.tree.map(jnp.copy, _params()), shardings)


@pytest.mark.parametrize("name", ["adam", "adafactor", "sm3"])
def test_one_program_equals_two_programs_over_10_steps(name):
  mesh, shardings, opt = _setup(name)
  assert opt.plan.zero_sharded  # ZeRO is in play
  grad_fn = jax.jit(jax.value_and_grad(_loss),
                    out_shardings=(NamedSharding(mesh, P()), shardings))
  two_params = _placed(shardings)
  two_state = opt.init(two_params)
  one_params = _placed(shardings)
  one_state = opt.init(one_params)
  train_step = opt.train_step(_loss)
  for step in range(STEPS):
    batch = _batch(step, mesh)
    loss, grads = grad_fn(two_params, batch)
    two_params, two_state = opt.update(grads, two_state, two_params)
    one_params, one_state, one_loss = train_step(one_params, one_state, batch)
    np.testing.assert_allclose(one_loss, loss, rtol=1e-6)
  for got, want in zip(jax.tree.leaves((one_params, one_state)),
                       jax.tree.leaves((two_params, two_state))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  for leaf, sharding in zip(jax.tree.leaves(one_state),
                            jax.tree.leaves(opt.state_shardings)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)
  assert one_loss.sharding.is_fully_replicated


def test_train_step_donates_params_and_state_and_needs_no_temporary():
  mesh, shardings, opt = _setup("adam")
  params = _placed(shardings)
  state = opt.init(params)
  batch = _batch(0, mesh)
  train_step = opt.train_step(_loss)
  compiled = train_step.lower(params, state, batch).compile()
  # Nothing like a second copy of params + state is allocated.
  state_bytes = sum(l.nbytes for l in jax.tree.leaves((params, state)))
  assert compiled.memory_analysis().temp_size_in_bytes < state_bytes
  _new_params, new_state, _ = train_step(params, state, batch)
  assert params["w1"].is_deleted() and state[0].mu["w1"].is_deleted()
  assert not batch[0].is_deleted()
  with pytest.raises(RuntimeError, match=r"params\['w1'\].*donated"):
    train_step(params, new_state, batch)


def test_batch_is_split_over_the_data_axes_and_bad_axes_are_named():
  mesh, shardings, opt = _setup("adam")
  step = opt.train_step(_loss)
  (_, _, batch_sharding), _ = step.jitted.lower(
      _placed(shardings), opt.init(_placed(shardings)),
      _batch(0, mesh)).compile().input_shardings
  assert batch_sharding[0].spec == P("data")
  with pytest.raises(ValueError, match=r"data_axes \['fsdp'\]"):
    opt.train_step(_loss, data_axes="fsdp")


def test_explicit_mesh_one_program_equals_two_programs():
  """On Explicit axes the gradients keep the params' layout by ``reshard``."""
  mesh = partitioning.make_mesh({"data": 4, "model": 2}, axis_types="explicit")
  shardings = partitioning.named_shardings(mesh, SPECS)
  opt = shardopt.make_sharded_optimizer(shardopt.adam(1e-2), _params(), shardings,
                                        shard_state_over="data", min_shard_bytes=0)
  # Contracting only unsharded dims: unambiguous on Explicit axes.
  loss = lambda p, batch: (jnp.mean((batch[0] @ p["w1"]) ** 2)
                           + jnp.mean(p["w2"] ** 2) + jnp.mean(p["scale"] ** 2))
  grad_fn = jax.jit(jax.value_and_grad(loss))
  one, two = _placed(shardings), _placed(shardings)
  one_state, two_state = opt.init(one), opt.init(two)
  train_step = opt.train_step(loss)
  for step in range(3):
    batch = _batch(step, mesh)
    _, grads = grad_fn(two, batch)
    two, two_state = opt.update(grads, two_state, two)
    one, one_state, _ = train_step(one, one_state, batch)
  for got, want in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
