"""DP-SGD on per-example gradients (the batch on axis 0 of every leaf):
equal to optax.contrib's, to a hand computation without noise, and sharded
over the batch equal to unsharded without gathering the batch."""

import warnings

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

from partitioning.collectives import collectives
import shardopt
from tests import oracle

_BATCH = 8


def _params():
  return {"w": jnp.ones((4, 8)), "b": jnp.ones((8,))}


def _per_example_grads(seed):
  keys = jax.random.split(jax.random.PRNGKey(seed), 2)
  return {"w": jax.random.normal(keys[0], (_BATCH, 4, 8)),
          "b": 3.0 * jax.random.normal(keys[1], (_BATCH, 8))}


def _run(tx, steps=3):
  params = _params()
  state = tx.init(params)
  history = []
  for step in range(steps):
    updates, state = tx.update(_per_example_grads(step), state, params)
    params = shardopt.apply_updates(params, updates)
    history.append(updates)
  return history


def _both(name, **kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return (getattr(shardopt.contrib, name)(**kwargs),
            getattr(optax.contrib, name)(**kwargs))


@pytest.mark.parametrize("name,kwargs", [
    ("differentially_private_aggregate",
     {"l2_norm_clip": 1.0, "noise_multiplier": 0.5, "key": 3}),
    ("dpsgd", {"learning_rate": 0.1, "l2_norm_clip": 1.0,
               "noise_multiplier": 0.5, "seed": 3, "momentum": 0.9,
               "nesterov": True}),
])
def test_matches_optax(name, kwargs):
  ours, theirs = _both(name, **kwargs)
  for got, want in zip(_run(ours), _run(theirs)):
    oracle.assert_trees_close(got, want)


def test_without_noise_is_the_mean_of_clipped_examples():
  clip = 2.0
  tx = shardopt.contrib.differentially_private_aggregate(clip, 0.0, key=0)
  grads = _per_example_grads(0)
  updates, _ = tx.update(grads, tx.init(_params()))
  flat = np.concatenate([np.asarray(grads["b"]),
                         np.asarray(grads["w"]).reshape(_BATCH, -1)], axis=1)
  factors = np.minimum(1.0, clip / np.linalg.norm(flat, axis=1))
  for name in ("w", "b"):
    g = np.asarray(grads[name])
    want = np.tensordot(factors, g, axes=1) / _BATCH
    np.testing.assert_allclose(np.asarray(updates[name]), want, rtol=1e-6)


def test_sharded_over_the_batch_equals_unsharded_and_gathers_nothing():
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  grad_shardings = {"w": NamedSharding(mesh, P("data", None, "model")),
                    "b": NamedSharding(mesh, P("data", "model"))}
  tx = shardopt.contrib.differentially_private_aggregate(1.0, 0.5, key=3)
  state = tx.init(_params())
  grads = _per_example_grads(0)
  step = jax.jit(tx.update, in_shardings=(grad_shardings, None))
  got, _ = step(jax.device_put(grads, grad_shardings), state)
  want, _ = jax.jit(tx.update)(grads, state)
  oracle.assert_trees_close(got, want, rtol=1e-6, atol=1e-7)
  program = step.lower(grads, state).compile().as_text()
  kinds = {c.kind for c in collectives(program)}
  assert "all-gather" not in kinds and "all-reduce" in kinds, kinds


def test_bad_input_is_named():
  tx = shardopt.contrib.differentially_private_aggregate(1.0, 0.5, key=0)
  with pytest.raises(ValueError, match="batch"):
    tx.update({"w": jnp.ones((8, 3)), "b": jnp.ones((4,))},
              tx.init(_params()))
  with pytest.raises(ValueError, match="not both"), warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    shardopt.contrib.differentially_private_aggregate(1.0, 0.5, key=0,
                                                      seed=1)
