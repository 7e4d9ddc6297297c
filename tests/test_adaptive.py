"""Adam, RAdam, RMSProp, centred RMSProp and Adagrad scalings against optax.

Also: the state of every stateful transform of this concern group is built
with ``*_like`` ops, so a sharded param's spec propagates to its state.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec as P

import shardopt
from tests import oracle

CASES = [
    ("scale_by_adam", dict()),
    ("scale_by_adam", dict(b1=0.5, b2=0.9, nesterov=True)),
    ("scale_by_adam", dict(eps=1e-3, eps_root=1e-4)),
    ("scale_by_adam", dict(mu_dtype=jnp.bfloat16)),
    ("scale_by_radam", dict()),
    ("scale_by_radam", dict(b2=0.9, threshold=3.0, nesterov=True, eps_root=1e-6)),
    ("scale_by_rss", dict()),
    ("scale_by_rss", dict(initial_accumulator_value=0.0, eps=1e-3)),
    ("scale_by_rms", dict()),
    ("scale_by_rms", dict(decay=0.8, eps=1e-3, initial_scale=0.5,
                          eps_in_sqrt=False)),
    ("scale_by_rms", dict(bias_correction=True)),
    ("scale_by_stddev", dict()),
    ("scale_by_stddev", dict(eps=1e-3, initial_scale=1.0, eps_in_sqrt=False,
                             bias_correction=True)),
]


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("name,kwargs", CASES)
def test_matches_optax(name, kwargs, jit, with_params):
  oracle.assert_matches_optax(
      getattr(shardopt, name)(**kwargs), getattr(optax, name)(**kwargs),
      jit=jit, with_params=with_params)


@pytest.mark.parametrize("name,kwargs", CASES)
def test_state_matches_optax(name, kwargs):
  """Same state type name, fields, dtypes and values after three steps."""
  params = oracle.mixed_tree()
  ours, theirs = getattr(shardopt, name)(**kwargs), getattr(optax, name)(**kwargs)
  states = []
  for tx in (ours, theirs):
    state = tx.init(params)
    for grads in oracle.gradient_stream(params, 3):
      _, state = tx.update(grads, state)
    states.append(state)
  assert type(states[0]).__name__ == type(states[1]).__name__
  assert states[0]._fields == states[1]._fields
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    assert a.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(a, np.float32),
                               np.asarray(b, np.float32), rtol=1e-6)


def test_adam_nu_dtype():
  """Our extension: nu stored in bfloat16, updates close to float32 Adam."""
  params = oracle.mixed_tree()
  tx = shardopt.scale_by_adam(nu_dtype=jnp.bfloat16)
  state = tx.init(params)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(state.nu))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.mu))
  got = oracle.run_updates(tx, params, 20, with_params=False, jit=True)
  want = oracle.run_updates(optax.scale_by_adam(), params, 20,
                            with_params=False, jit=True)
  for g, w in zip(got, want):
    oracle.assert_trees_close(g, w, rtol=2e-2, atol=1e-3)


def test_radam_switches_to_rectified_step():
  """Before rho reaches the threshold RAdam returns the debiased momentum."""
  g = jnp.array([0.5, -2.0])
  tx = shardopt.scale_by_radam()
  state = tx.init(g)
  first, state = tx.update(g, state)
  np.testing.assert_allclose(first, g, rtol=1e-6)  # mu_hat of a constant g
  for _ in range(9):
    last, state = tx.update(g, state)
  assert np.all(np.abs(np.asarray(last)) < np.abs(np.asarray(g)))


# --- sharding of the state ---------------------------------------------------

_MESH = AbstractMesh((2, 4), ("data", "model"),
                     axis_types=(AxisType.Explicit,) * 2)


def _sharded_params():
  spec = {"w": P("data", "model"), "b": P("model"), "s": P()}
  shape = {"w": (4, 8), "b": (8,), "s": ()}
  return jax.tree.map(
      lambda sh, sp: jax.ShapeDtypeStruct(sh, jnp.float32,
                                          sharding=NamedSharding(_MESH, sp)),
      shape, spec, is_leaf=lambda x: isinstance(x, tuple))


STATEFUL = {
    "trace": lambda: shardopt.trace(0.9, accumulator_dtype=jnp.bfloat16),
    "ema": lambda: shardopt.ema(0.9),
    "adam": lambda: shardopt.scale_by_adam(mu_dtype=jnp.bfloat16,
                                           nu_dtype=jnp.bfloat16),
    "radam": shardopt.scale_by_radam,
    "rss": shardopt.scale_by_rss,
    "rms": lambda: shardopt.scale_by_rms(bias_correction=True),
    "stddev": lambda: shardopt.scale_by_stddev(bias_correction=True),
}


def _per_param_fields(state, params):
  """The state fields that mirror the params tree, as (field, tree) pairs."""
  treedef = jax.tree.structure(params)
  return [(f, getattr(state, f)) for f in state._fields
          if jax.tree.structure(getattr(state, f)) == treedef]


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_state_inherits_param_sharding(name):
  """Per-param state leaves carry their param's spec; counters are unsharded."""
  params = _sharded_params()
  with jax.sharding.use_abstract_mesh(_MESH):
    state = jax.eval_shape(STATEFUL[name]().init, params)
  mirrored = _per_param_fields(state, params)
  assert mirrored, f"{name}: no per-param state"
  for field, value in mirrored:
    for leaf, param in zip(jax.tree.leaves(value), jax.tree.leaves(params)):
      assert leaf.shape == param.shape, (name, field)
      assert leaf.sharding.spec == param.sharding.spec, (name, field)
  others = [getattr(state, f) for f in state._fields
            if f not in dict(mirrored)]
  assert all(leaf.shape == () for leaf in jax.tree.leaves(others)), name
