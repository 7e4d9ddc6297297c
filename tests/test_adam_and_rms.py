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


test_matches_optax = oracle.matches_optax_test(CASES)


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


def _schedule(count):
  return 0.1 * 0.9**count


# name -> (transform factory, whether it keeps per-param arrays)
STATEFUL = {
    "trace": (lambda: shardopt.trace(0.9, accumulator_dtype=jnp.bfloat16), True),
    "ema": (lambda: shardopt.ema(0.9), True),
    "adam": (lambda: shardopt.scale_by_adam(mu_dtype=jnp.bfloat16,
                                            nu_dtype=jnp.bfloat16), True),
    "radam": (shardopt.scale_by_radam, True),
    "rss": (shardopt.scale_by_rss, True),
    "rms": (lambda: shardopt.scale_by_rms(bias_correction=True), True),
    "stddev": (lambda: shardopt.scale_by_stddev(bias_correction=True), True),
    "schedule": (lambda: shardopt.scale_by_learning_rate(_schedule), False),
    "noise": (lambda: shardopt.add_noise(0.1, 0.5, key=0), False),
    "decay": (lambda: shardopt.add_decayed_weights(_schedule, mask=_mask), False),
    "zero_nans": (shardopt.zero_nans, False),
}


def _mask(params):
  return {"w": True, "b": False, "s": True}


def _spec(leaf):
  return leaf.sharding.spec if leaf.sharding is not None else P()


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_state_inherits_param_sharding(name):
  """Per-param state arrays carry their param's spec; the rest are scalars."""
  make, per_param = STATEFUL[name]
  params = _sharded_params()
  with jax.sharding.use_abstract_mesh(_MESH):
    state = jax.eval_shape(make().init, params)
  param_leaves = jax.tree.leaves(params)
  mirrored = 0
  for value in state:  # the fields of the state NamedTuple
    leaves = jax.tree.leaves(value)
    if len(leaves) != len(param_leaves):
      assert all(leaf.shape == () for leaf in leaves), name
      continue
    for leaf, param in zip(leaves, param_leaves):
      if leaf.shape == param.shape:
        assert _spec(leaf) == param.sharding.spec, name
        mirrored += param.ndim > 0
      else:
        assert leaf.shape == (), name
  assert (mirrored > 0) == per_param, name
