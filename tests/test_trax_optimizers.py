"""trax semantics, checked against values computed by hand on tiny inputs."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardopt
from shardopt.contrib import MomentumType


def one_step(tx, grads, params):
  updates, state = tx.update(grads, tx.init(params), params)
  return shardopt.apply_updates(params, updates), state


def two_steps(tx, grads1, grads2, params):
  state = tx.init(params)
  updates, state = tx.update(grads1, state, params)
  params = shardopt.apply_updates(params, updates)
  updates, state = tx.update(grads2, state, params)
  return shardopt.apply_updates(params, updates), state


# --- Adam -----------------------------------------------------------------


def test_adam_first_step_with_decoupled_decay():
  # m_hat = g, v_hat = g^2: w' = (1 - wd) w - lr g / (|g| + eps).
  tx = shardopt.trax_adam(learning_rate=0.1, weight_decay_rate=0.01, eps=1e-5)
  new, _ = one_step(tx, jnp.array([0.5]), jnp.array([1.0]))
  np.testing.assert_allclose(new, [0.99 - 0.1 * 0.5 / 0.50001], rtol=1e-6)


def test_adam_clip_grad_norm_rescales_the_whole_tree():
  # g = (3, 4) has norm 5 -> clipped to (0.6, 0.8); with eps = 1 the step
  # lr g / (|g| + 1) shows the clipped magnitude (b2 = 0.5 keeps 1 - b2 exact
  # in float32).
  tx = shardopt.trax_adam(learning_rate=1.0, weight_decay_rate=0.0, eps=1.0,
                          b2=0.5, clip_grad_norm=1.0)
  new, _ = one_step(tx, {"a": jnp.array([3.0]), "b": jnp.array([4.0])},
                    {"a": jnp.zeros(1), "b": jnp.zeros(1)})
  np.testing.assert_allclose(new["a"], [-0.6 / 1.6], rtol=1e-6)
  np.testing.assert_allclose(new["b"], [-0.8 / 1.8], rtol=1e-6)


# --- Momentum ---------------------------------------------------------------


def test_momentum_is_nesterov_by_default():
  # v1 = g1; step1 = mass v1 + g1. v2 = mass v1 + g2; step2 = mass v2 + g2.
  lr, mass, wd = 0.1, 0.9, 0.01
  tx = shardopt.trax_momentum(learning_rate=lr, mass=mass, weight_decay_rate=wd)
  g1, g2, w0 = 1.0, -2.0, 3.0
  w1 = (1 - wd) * w0 - lr * (mass * g1 + g1)
  v2 = mass * g1 + g2
  w2 = (1 - wd) * w1 - lr * (mass * v2 + g2)
  new, _ = two_steps(tx, jnp.array(g1), jnp.array(g2), jnp.array(w0))
  np.testing.assert_allclose(new, w2, rtol=1e-6)


def test_momentum_without_nesterov_steps_by_velocity():
  tx = shardopt.trax_momentum(learning_rate=0.1, mass=0.5, weight_decay_rate=0.0,
                              nesterov=False)
  new, _ = two_steps(tx, jnp.array(1.0), jnp.array(1.0), jnp.array(0.0))
  np.testing.assert_allclose(new, -0.1 * 1.0 - 0.1 * 1.5, rtol=1e-6)


# --- RMSProp ----------------------------------------------------------------


def test_rmsprop_gamma_and_mean_square_starting_at_one():
  # v1 = gamma * 1 + (1 - gamma) g^2 = 0.9 + 0.1 * 4 = 1.3.
  tx = shardopt.trax_rmsprop(learning_rate=0.01, gamma=0.9, eps=1e-8)
  new, _ = one_step(tx, jnp.array([2.0]), jnp.array([1.0]))
  np.testing.assert_allclose(new, [1.0 - 0.01 * 2.0 / (math.sqrt(1.3) + 1e-8)], rtol=1e-6)


# --- Adafactor --------------------------------------------------------------

G = jnp.array([[1.0, 2.0], [3.0, 4.0]])
# Step 0 (rho = 0): v_row = mean_j g^2 = (2.5, 12.5), v_col = mean_i g^2 = (5, 10);
# v_hat_ij = v_row_i v_col_j / mean(v_row) = [[5/3, 10/3], [25/3, 50/3]].
Y = np.array([[1 / math.sqrt(5 / 3), 2 / math.sqrt(10 / 3)],
              [3 / math.sqrt(25 / 3), 4 / math.sqrt(50 / 3)]])
RMS_Y = math.sqrt(np.mean(Y**2))  # = sqrt(0.96)


def adafactor(**kwargs):
  base_kwargs = dict(learning_rate=0.1, multiply_by_parameter_scale=False,
                     do_clipping=False, weight_decay_rate=0.0, epsilon1=0.0)
  return shardopt.trax_adafactor(**{**base_kwargs, **kwargs})


def test_adafactor_factored_second_moment_first_step():
  new, state = one_step(adafactor(), G, jnp.zeros((2, 2)))
  np.testing.assert_allclose(new, -0.1 * Y, rtol=1e-5)
  np.testing.assert_allclose(state.v_row, [2.5, 12.5], rtol=1e-6)
  np.testing.assert_allclose(state.v_col, [5.0, 10.0], rtol=1e-6)
  assert state.v is None


def test_adafactor_unfactored_when_factored_false_or_rank_one():
  new, state = one_step(adafactor(factored=False), G, jnp.zeros((2, 2)))
  np.testing.assert_allclose(new, -0.1 * np.sign(G), rtol=1e-6)
  np.testing.assert_allclose(state.v, G**2)
  new, _ = one_step(adafactor(), jnp.array([2.0, -3.0]), jnp.zeros(2))
  np.testing.assert_allclose(new, [-0.1, 0.1], rtol=1e-6)


def test_adafactor_factors_last_two_dims_of_rank_three():
  g = jnp.arange(1.0, 25.0).reshape(2, 3, 4)
  _, state = one_step(adafactor(), g, jnp.zeros_like(g))
  assert state.v_row.shape == (2, 3) and state.v_col.shape == (2, 4)
  np.testing.assert_allclose(state.v_col, np.mean(np.asarray(g) ** 2, axis=1), rtol=1e-6)


def test_adafactor_epsilon1_is_added_to_squared_gradient():
  _, state = one_step(adafactor(factored=False, epsilon1=0.5), G, jnp.zeros((2, 2)))
  np.testing.assert_allclose(state.v, G**2 + 0.5)


def test_adafactor_decay_rate_schedule_second_step():
  # Step 1: rho = 1 - 2 ** -0.8; v = rho * g1^2 + (1 - rho) * g2^2 (unfactored).
  rho = 1 - 2**-0.8
  _, state = two_steps(adafactor(factored=False), jnp.array([2.0]), jnp.array([1.0]),
                       jnp.zeros(1))
  np.testing.assert_allclose(state.v, [rho * 4.0 + (1 - rho) * 1.0], rtol=1e-6)


def test_adafactor_do_clipping_divides_by_rms_over_threshold():
  new, _ = one_step(adafactor(do_clipping=True, clipping_threshold=0.5), G, jnp.zeros((2, 2)))
  np.testing.assert_allclose(new, -0.1 * Y / (RMS_Y / 0.5), rtol=1e-5)
  new, _ = one_step(adafactor(do_clipping=True, clipping_threshold=1.0), G, jnp.zeros((2, 2)))
  np.testing.assert_allclose(new, -0.1 * Y, rtol=1e-5)  # rms < 1: untouched


def test_adafactor_parameter_scale_with_epsilon2_floor():
  w = jnp.full((2, 2), 2.0)  # rms(w) = 2
  new, _ = one_step(adafactor(multiply_by_parameter_scale=True), G, w)
  np.testing.assert_allclose(new, w - 0.1 * 2.0 * Y, rtol=1e-5)
  new, _ = one_step(adafactor(multiply_by_parameter_scale=True, epsilon2=0.25), G,
                    jnp.zeros((2, 2)))
  np.testing.assert_allclose(new, -0.1 * 0.25 * Y, rtol=1e-5)


@pytest.mark.parametrize("in_bfloat16", [False, True])
def test_adafactor_momentum_and_its_dtype(in_bfloat16):
  tx = adafactor(factored=False, do_momentum=True, beta1=0.9,
                 momentum_in_bfloat16=in_bfloat16)
  new, state = one_step(tx, jnp.array([2.0]), jnp.zeros(1))
  # m1 = (1 - beta1) * lr * sign(g) = 0.01.
  np.testing.assert_allclose(new, [-0.01], rtol=1e-6)
  assert state.momentum.dtype == (jnp.bfloat16 if in_bfloat16 else jnp.float32)
  np.testing.assert_allclose(np.asarray(state.momentum, np.float32), [0.01], rtol=1e-2)


@pytest.mark.parametrize("n_steps,want", [
    # trax's rate at step t is wd * max(n - t, 0) / n: with wd = 0.1, n = 4
    # the weight is multiplied by 0.9, 0.925, 0.95, 0.975, then 1, 1.
    (4, [0.9, 0.8325, 0.790875, 0.771103125, 0.771103125, 0.771103125]),
    (1, [0.9, 0.9, 0.9, 0.9, 0.9, 0.9]),
    # Below 1 (0, the default, or negative) or None: wd at every step.
    (0, [0.9**t for t in range(1, 7)]),
    (-2, [0.9**t for t in range(1, 7)]),
    (None, [0.9**t for t in range(1, 7)]),
])
def test_adafactor_weight_decay_ramps_down_over_n_steps(n_steps, want):
  tx = adafactor(factored=False, learning_rate=0.0, weight_decay_rate=0.1,
                 weight_decay_n_steps=n_steps)
  w, state, got = jnp.array([1.0]), tx.init(jnp.array([1.0])), []
  update = jax.jit(tx.update)
  for _ in range(6):
    updates, state = update(jnp.array([1.0]), state, w)
    w = shardopt.apply_updates(w, updates)
    got.append(float(w[0]))
  np.testing.assert_allclose(got, want, rtol=1e-6)


# --- SM3 ----------------------------------------------------------------------


def sm3(**kwargs):
  return shardopt.trax_sm3(**{"learning_rate": 0.1, "momentum": 0.5, **kwargs})


def test_adafactor_on_bfloat16_params_keeps_its_state_dtypes_across_steps():
  # float32 statistics (trax's factored ones are), bfloat16 updates; a state
  # whose dtypes changed at the first update could not be a scan's carry.
  params = {"m": jnp.full((4, 8), 0.5, jnp.bfloat16), "b": jnp.ones((4,), jnp.bfloat16)}
  grads = jax.tree.map(lambda p: jnp.linspace(-0.3, 0.2, p.size, dtype=p.dtype).reshape(p.shape),
                       params)
  tx = shardopt.trax_adafactor()
  state = tx.init(params)
  dtypes = jax.tree.map(lambda x: x.dtype, state)
  assert {x for x in jax.tree.leaves(dtypes) if x != jnp.int32} == {np.dtype("float32")}
  final, updates = jax.lax.scan(lambda s, _: tx.update(grads, s, params)[::-1], state, length=3)
  assert jax.tree.map(lambda x: x.dtype, final) == dtypes
  assert {u.dtype for u in jax.tree.leaves(updates)} == {np.dtype(jnp.bfloat16)}
  wide = jax.tree.map(lambda x: x.astype(jnp.float32), (params, grads))
  _, want = jax.lax.scan(lambda s, _: tx.update(wide[1], s, wide[0])[::-1],
                         tx.init(wide[0]), length=3)
  for got, w in zip(jax.tree.leaves(updates), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.float32(got), w, rtol=2 ** -7)


def test_sm3_first_step_and_max_covers():
  new, state = one_step(sm3(), G, jnp.zeros((2, 2)))
  # a = g^2, pg = sign(g) = 1, EMA momentum m = 0.5 * 1.
  np.testing.assert_allclose(new, -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
  row_cover, col_cover = state.covers
  np.testing.assert_allclose(row_cover, [4.0, 16.0])
  np.testing.assert_allclose(col_cover, [9.0, 16.0])


def test_sm3_second_step_uses_min_of_covers():
  g2 = jnp.ones((2, 2))
  _, state = two_steps(sm3(momentum=0.0), G, g2, jnp.zeros((2, 2)))
  # a_ij = min(row_i, col_j) + 1: [[min(4,9)+1, min(4,16)+1], [min(16,9)+1, 17]].
  np.testing.assert_allclose(state.covers[0], [5.0, 17.0])
  np.testing.assert_allclose(state.covers[1], [10.0, 17.0])


@pytest.mark.parametrize(
    "momentum_type, expected_second_update",
    [
        # m1 = 0.5 pg1 = 0.5; EMA m2 = 0.5 m1 + 0.5 pg2.
        (MomentumType.EMA, 0.5 * 0.5 + 0.5 * (1 / math.sqrt(2))),
        # heavy ball: m1 = 1, m2 = 0.5 + pg2.
        (MomentumType.HEAVY_BALL, 0.5 * 1.0 + 1 / math.sqrt(2)),
        # Nesterov: m2 as heavy ball, step = 0.5 m2 + pg2.
        (MomentumType.NESTEROV, 0.5 * (0.5 + 1 / math.sqrt(2)) + 1 / math.sqrt(2)),
    ],
)
def test_sm3_momentum_types(momentum_type, expected_second_update):
  # Scalar leaf: a1 = 1, pg1 = 1; a2 = 2, pg2 = 1 / sqrt(2).
  tx = sm3(learning_rate=1.0, momentum_type=momentum_type)
  state = tx.init(jnp.array(0.0))
  _, state = tx.update(jnp.array(1.0), state, jnp.array(0.0))
  updates, _ = tx.update(jnp.array(1.0), state, jnp.array(0.0))
  np.testing.assert_allclose(updates, -expected_second_update, rtol=1e-6)


def test_sm3_second_moment_averaging_grafts_onto_adagrad_then_decays():
  # beta2 = 0.5: a = 0.5 g^2, pg = g / sqrt(a) = (sqrt 2, sqrt 2), scaled (trax's
  # graft) to the norm of AdaGrad's g / sqrt(g^2) = (1, 1): pg = (1, 1); then
  # + wd w = (0.2, -0.1); w - lr pg = (2 - 0.12, -1 - 0.09).
  tx = sm3(momentum=0.0, second_moment_averaging=0.5, weight_decay=0.1)
  new, state = one_step(tx, jnp.array([3.0, 1.0]), jnp.array([2.0, -1.0]))
  np.testing.assert_allclose(new, [1.88, -1.09], rtol=1e-6)
  np.testing.assert_allclose(state.graft_covers[0], [9.0, 1.0])  # plain sums of g^2
  assert sm3().init(jnp.ones(2)).graft_covers is None  # beta2 = 1: no graft


def test_states_keep_param_shardings_through_init():
  mesh = jax.sharding.AbstractMesh((2, 4), ("data", "model"),
                                   axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  spec = jax.sharding.PartitionSpec("data", "model")
  param = jax.ShapeDtypeStruct((8, 16), jnp.float32,
                               sharding=jax.sharding.NamedSharding(mesh, spec))
  with jax.sharding.use_abstract_mesh(mesh):
    factored = jax.eval_shape(shardopt.trax_adafactor().init, param)
    covers = jax.eval_shape(shardopt.trax_sm3().init, param)
  assert factored.v_row.sharding.spec == jax.sharding.PartitionSpec("data")
  assert factored.v_col.sharding.spec == jax.sharding.PartitionSpec("model")
  assert covers.covers[0].sharding.spec == jax.sharding.PartitionSpec("data")
  assert covers.covers[1].sharding.spec == jax.sharding.PartitionSpec("model")
  assert covers.momentum.sharding.spec == spec
