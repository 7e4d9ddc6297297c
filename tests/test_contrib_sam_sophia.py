"""What the harness cannot reach: SAM's inner loop (opaque mode with
grad_fn), Sophia's Hessian estimator with its key and obj_fn."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


def _loss(params):
  return sum(jnp.sum(0.25 * p * p + 0.1 * jnp.sin(3.0 * p))
             for p in jax.tree.leaves(params))


def _sam(lib, **kwargs):
  return lib.contrib.sam(
      lib.adam(0.1),
      lib.chain(lib.contrib.normalize(), lib.sgd(0.05)), **kwargs)


def _run_opaque(tx, steps=5):
  params = oracle.mixed_tree()
  state = tx.init(params)
  grad_fn = lambda p, i: jax.grad(_loss)(p)
  update = jax.jit(lambda g, s, p: tx.update(g, s, p, grad_fn=grad_fn))
  history = []
  for _ in range(steps):
    updates, state = update(jax.grad(_loss)(params), state, params)
    params = shardopt.apply_updates(params, updates)
    history.append(updates)
  return history


@pytest.mark.parametrize("kwargs", [
    {"sync_period": 3, "opaque_mode": True},
    {"sync_period": 2, "opaque_mode": True, "reset_state": False},
], ids=["reset", "keep"])
def test_sam_inner_loop_matches_optax(kwargs):
  for got, want in zip(_run_opaque(_sam(shardopt, **kwargs)),
                       _run_opaque(_sam(optax, **kwargs))):
    oracle.assert_trees_close(got, want)


def test_sam_opaque_calls_grad_fn_at_the_ascended_params():
  """sync_period=2: one ascent of normalize + sgd(rho) from p, then the outer
  sgd(lr) step from p with the gradient at p + rho g / |g| (Foret et al.)."""
  rho, lr = 0.05, 0.1
  tx = shardopt.contrib.sam(shardopt.sgd(lr), shardopt.chain(
      shardopt.contrib.normalize(), shardopt.sgd(rho)), opaque_mode=True)
  params = {"w": jnp.array([1.0, -2.0, 0.5])}
  seen = []

  def grad_fn(p, i):
    seen.append((np.asarray(p["w"]), i))
    return jax.grad(_loss)(p)

  g = jax.grad(_loss)(params)
  updates, _ = tx.update(g, tx.init(params), params, grad_fn=grad_fn)
  ascended = params["w"] + rho * g["w"] / jnp.linalg.norm(g["w"])
  np.testing.assert_allclose(seen[0][0], ascended, rtol=1e-6)
  assert [i for _, i in seen] == [0]
  np.testing.assert_allclose(
      updates["w"], -lr * jax.grad(_loss)({"w": ascended})["w"], rtol=1e-6)


def test_sam_opaque_without_grad_fn_is_named():
  tx = _sam(shardopt, opaque_mode=True)
  params = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match="grad_fn"):
    tx.update(params, tx.init(params), params)


def test_hutchinson_is_exact_on_a_diagonal_quadratic():
  """For f = sum(d p^2) / 2 the Hessian is diag(d), so r * (H r) = d for
  every sign vector r: the estimate is exact whatever the key."""
  d = {"a": jnp.arange(1.0, 7.0).reshape(2, 3), "b": jnp.array([0.5, 4.0])}
  objective = lambda p: sum(jnp.sum(0.5 * d[k] * p[k] ** 2) for k in p)
  tx = shardopt.contrib.hutchinson_estimator_diag_hessian(
      jax.random.PRNGKey(4))
  params = jax.tree.map(jnp.ones_like, d)
  state = tx.init(params)
  for _ in range(2):
    estimate, state = tx.update(params, state, params, obj_fn=objective)
    oracle.assert_trees_close(estimate, d)


def test_hutchinson_draws_in_the_params_sharding():
  """The probe is drawn per leaf in its param's sharding, and the estimate
  of a sharded step equals the unsharded one (same key)."""
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  shardings = {"w": NamedSharding(mesh, P("data", "model"))}
  host = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 16))}
  tx = shardopt.contrib.hutchinson_estimator_diag_hessian()
  update = lambda p, s: tx.update(p, s, p, obj_fn=_loss)
  got, _ = jax.jit(update, in_shardings=(shardings, None),
                   out_shardings=(shardings, None))(
                       jax.device_put(host, shardings), tx.init(host))
  want, _ = jax.jit(update)(host, tx.init(host))
  oracle.assert_trees_close(got, want, rtol=1e-6, atol=1e-6)
  assert got["w"].sharding.is_equivalent_to(shardings["w"], 2)


@pytest.mark.parametrize("kwargs", [
    {"update_interval": 3, "clip_threshold": None, "b1": 0.9},
    {"update_interval": 1, "gamma": 0.1, "weight_decay": 0.0},
], ids=["unclipped", "every-step"])
def test_sophia_with_its_own_key_matches_optax(kwargs):
  key = jax.random.PRNGKey(11)
  ours = shardopt.contrib.sophia(
      0.1, hessian_diagonal_fn=shardopt.contrib
      .hutchinson_estimator_diag_hessian(key), **kwargs)
  theirs = optax.contrib.sophia(
      0.1, hessian_diagonal_fn=optax.contrib
      .hutchinson_estimator_diag_hessian(key), **kwargs)
  with_objective = lambda tx: shardopt.GradientTransformation(
      tx.init, functools.partial(tx.update, obj_fn=_loss))
  oracle.assert_matches_optax(with_objective(ours), with_objective(theirs),
                              steps=6)


def test_sophia_needs_params_and_obj_fn():
  tx = shardopt.contrib.sophia(0.1, update_interval=1)
  params = {"w": jnp.ones(3)}
  with pytest.raises(ValueError, match="params"):
    tx.update(params, tx.init(params), obj_fn=_loss)
  with pytest.raises(ValueError, match="obj_fn"):
    tx.update(params, tx.init(params), params)
