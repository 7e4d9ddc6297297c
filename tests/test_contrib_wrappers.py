"""contrib wrappers beyond the harness: reduce_on_plateau's ``value``
(hand-traced), schedule-free's evaluation params, complex params split into
real pairs, GaLore's projections (vs optax, numpy's SVD and the mesh)."""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle


def _scales(tx, values):
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  scales = []
  for value in values:
    updates, state = tx.update(params, state, value=jnp.asarray(value))
    scales.append(float(updates["w"][0]))
  return scales, state


def test_reduce_on_plateau_by_hand():
  """patience 2, cooldown 1, atol 0.01: 10 and 9 improve; two 9s make a
  plateau (scale halves); the next value is in cooldown; then counting
  starts again."""
  tx = shardopt.contrib.reduce_on_plateau(factor=0.5, patience=2, rtol=0.0,
                                          atol=0.01, cooldown=1)
  scales, state = _scales(tx, [10, 9, 9, 9, 9, 9, 8])
  assert scales == [1, 1, 1, 0.5, 0.5, 0.5, 0.5]
  assert float(state.best_value) == 8.0


@pytest.mark.parametrize("kwargs", [
    {"factor": 0.5, "patience": 1, "accumulation_size": 2, "min_scale": 0.3},
    {"factor": 0.8, "patience": 2, "rtol": 0.1, "cooldown": 2},
], ids=["accumulating", "cooldown"])
def test_reduce_on_plateau_matches_optax(kwargs):
  values = [5.0, 4.0, 4.5, 4.4, 4.3, 4.35, 4.2, 4.1, 4.2, 4.15, 4.12, 4.1]
  got, got_state = _scales(shardopt.contrib.reduce_on_plateau(**kwargs),
                           values)
  want, want_state = _scales(optax.contrib.reduce_on_plateau(**kwargs),
                             values)
  assert got == want and min(got) < 1.0
  assert got_state._fields == want_state._fields
  oracle.assert_trees_close(tuple(got_state), tuple(want_state))


@pytest.mark.parametrize("kwargs,message", [
    ({"factor": 1.0}, "factor"), ({"rtol": 0.0}, "at least one"),
    ({"atol": -1.0}, "non-negative"), ({"rtol": 2.0}, "at most 1"),
])
def test_reduce_on_plateau_rejects_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    shardopt.contrib.reduce_on_plateau(**kwargs)


def _schedule_free_run(lib, steps=5):
  tx = lib.contrib.schedule_free_adamw(0.1, warmup_steps=2)
  params = oracle.mixed_tree()
  state = tx.init(params)
  for grads in oracle.gradient_stream(params, steps):
    updates, state = tx.update(grads, state, params)
    params = shardopt.apply_updates(params, updates)
  return lib.contrib.schedule_free_eval_params(state, params), state, params


def test_schedule_free_eval_params():
  """Equal to optax's, and the x of y = b1 x + (1 - b1) z."""
  got, state, params = _schedule_free_run(shardopt)
  want, _, _ = _schedule_free_run(optax)
  oracle.assert_trees_close(got, want)
  b1 = float(state.b1)
  recombined = jax.tree.map(lambda x, z: b1 * x + (1 - b1) * z, got, state.z)
  oracle.assert_trees_close(recombined, params, rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="ScheduleFreeState"):
    shardopt.contrib.schedule_free_eval_params(shardopt.EmptyState(), params)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_schedule_free_eval_params_of_a_zero_sharded_state_fit_the_model(axis_types):
  """With ZeRO, ``z`` is split over ``data`` where the params are not; the
  eval params come back in the params' layout on Explicit axes (eager and
  inside a jitted loss that uses them), equal to those of the same run on
  Auto axes."""
  import partitioning

  mesh = partitioning.make_mesh({"data": 4, "model": 2}, axis_types=axis_types)
  specs = {"w": P(None, "model"), "scale": P()}
  shardings = partitioning.named_shardings(mesh, specs)
  init = {"w": jnp.linspace(-1.0, 1.0, 16 * 8).reshape(16, 8), "scale": jnp.ones(8)}
  x = jax.device_put(jnp.linspace(0.0, 1.0, 32 * 16).reshape(32, 16),
                     NamedSharding(mesh, P("data", None)))
  loss = lambda p, x: jnp.mean((x @ p["w"] * p["scale"] - 1.0) ** 2)
  opt = shardopt.make_sharded_optimizer(
      shardopt.contrib.schedule_free_adamw(0.1, warmup_steps=2), init, shardings,
      shard_state_over="data", min_shard_bytes=0)
  params = jax.device_put(jax.tree.map(jnp.copy, init), shardings)
  state = opt.init(params)
  step = opt.train_step(loss)
  for _ in range(3):
    params, state, _ = step(params, state, x)
  assert state.z["scale"].sharding.spec == P("data")  # split by ZeRO
  evaluated = shardopt.contrib.schedule_free_eval_params(state, params)
  if axis_types == "explicit":
    for got, sharding in zip(jax.tree.leaves(evaluated), jax.tree.leaves(shardings)):
      assert got.sharding.is_equivalent_to(sharding, got.ndim)
  with jax.set_mesh(mesh):
    value = jax.jit(lambda s, p, x: loss(shardopt.contrib.schedule_free_eval_params(s, p), x))(
        state, params, x)
  np.testing.assert_allclose(float(value), float(loss(jax.device_get(evaluated), jax.device_get(x))),
                             rtol=1e-5)
  b1 = float(state.b1)
  recombined = jax.tree.map(lambda e, z: b1 * e + (1 - b1) * z, jax.device_get(evaluated),
                            jax.device_get(state.z))
  oracle.assert_trees_close(recombined, jax.device_get(params), rtol=1e-5, atol=1e-6)


def test_split_real_and_imaginary_matches_optax_on_complex_params():
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  params = {"c": jax.random.normal(keys[0], (3, 4))
                 + 1j * jax.random.normal(keys[1], (3, 4)),
            "r": jax.random.normal(keys[2], (5,))}
  results = []
  for lib in (shardopt, optax):
    tx = lib.contrib.split_real_and_imaginary(lib.adam(0.1))
    p, state, history = params, tx.init(params), []
    for _ in range(4):
      updates, state = tx.update(jax.tree.map(jnp.conj, p), state, p)
      p = shardopt.apply_updates(p, updates)
      history.append(updates)
    results.append(history)
  for got, want in zip(*results):
    assert jnp.iscomplexobj(got["c"]) and not jnp.iscomplexobj(got["r"])
    oracle.assert_trees_close(got, want)


def _galore(lib):
  """On oracle.mixed_tree(): a 4-D and a 3-D param read as matrices."""
  dims = lib.contrib.GaLoreDimensionNumbers
  tree = {"scalar": None, "vector": None,
          "dense": {"kernel": dims(), "bias": None},
          "conv": {"kernel": dims((0, 1), (2, 3))}, "block": [dims(0, (1, 2))]}
  return lib.contrib.galore(0.1, rank=2, update_proj_gap=2,
                            base_optimizer=lib.scale_by_lion(),
                            weight_decay=0.01, weight_dimension_numbers=tree)


def test_galore_with_dimension_numbers_matches_optax():
  oracle.assert_matches_optax(_galore(shardopt), _galore(optax), steps=6)


def test_galore_projector_is_the_gradient_top_singular_space():
  """At step 0 the projector spans the top-``rank`` right singular vectors
  of the (m < n) gradient, as numpy's SVD finds them (up to sign)."""
  grad = jax.random.normal(jax.random.PRNGKey(3), (4, 10))
  tx = shardopt.contrib.scale_by_galore(rank=2)
  _, state = tx.update({"w": grad}, tx.init({"w": grad}))
  _, _, vh = np.linalg.svd(np.asarray(grad))
  projector = np.asarray(state.projector["w"])
  assert projector.shape == (10, 2)
  np.testing.assert_allclose(np.abs(projector.T @ vh[:2].T), np.eye(2),
                             atol=1e-5)


def test_galore_state_derives_the_param_axes():
  """On the (2, 4) mesh a (16, 32) P('data', 'model') param's projector
  (32, r) keeps 'model', the low-rank Adam moments (16, r) keep 'data'."""
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(AxisType.Auto,) * 2)
  params = {"w": jax.ShapeDtypeStruct((16, 32), jnp.float32)}
  shardings = {"w": NamedSharding(mesh, P("data", "model"))}
  plan = shardopt.plan_state_shardings(
      shardopt.contrib.scale_by_galore(rank=4), params, shardings)
  specs = {leaf.path: (leaf.shape, leaf.spec) for leaf in plan.leaves}
  assert specs[".projector['w']"] == ((32, 4), P("model", None))
  for moment in ("mu", "nu"):
    assert specs[f".base_optimizer_state.{moment}['w']"] == (
        (16, 4), P("data", None))
