"""contrib.shampoo against a NumPy reference of the papers' formulas, and sharded.

The reference (float64, written here from Gupta et al. 2018 and Anil et al.
2020) loops over the blocks of each param: per block ``G`` and dimension
``i``, ``L_i <- w1 L_i + w2 G_(i) G_(i)^T``, at refreshes
``P_i = (L_i + eps lambda_max(L_i) I)^(-1/(2k))`` by eigendecomposition, the direction
``G x_1 P_1 ... x_k P_k`` rescaled to the norm of the grafting direction's
block, then momentum, decoupled weight decay and the learning rate. Sizes
are hand-checkable: a (4, 6) matrix in 2 x 2 blocks of (2, 3), a (2, 4, 4)
tensor in blocks of (2, 2, 2), a (5, 8) matrix in blocks of (3, 3) cut short
at its ends, a vector and a scalar (grafting only).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardopt
from tests import blocked_layout


def _inverse_root(a, p, eps):
  values, vectors = np.linalg.eigh(a)
  values = np.maximum(values, 0.0) + eps * values.max()
  return (vectors * values ** (-1.0 / p)) @ vectors.T


def _graft(g, acc, t, hp):
  if hp["grafting"] == "adagrad":
    acc = acc + g * g
    return g / (np.sqrt(acc) + hp["graft_eps"]), acc
  if hp["grafting"] == "rmsprop":
    acc = hp["b2"] * acc + (1 - hp["b2"]) * g * g
    return g / (np.sqrt(acc / (1 - hp["b2"] ** t)) + hp["graft_eps"]), acc
  return g, acc


def _reference(params, grads, hp):
  """Per-step updates of blocked Shampoo with grafting, in float64."""
  w1, w2 = (hp["b2"], 1 - hp["b2"]) if hp["b2"] != 1 else (1.0, 1.0)
  params = {k: v.astype(np.float64) for k, v in params.items()}
  acc = {k: np.zeros_like(v) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in params.items()}
  stats, pre, history = {}, {}, []
  for t, g_t in enumerate(grads, start=1):
    refresh = t >= hp["start"] and (t - hp["start"]) % hp["freq"] == 0
    updates = {}
    for k, g in g_t.items():
      g = g.astype(np.float64)
      direction, acc[k] = _graft(g, acc[k], t, hp)
      if g.ndim >= 2:
        out = np.zeros_like(g)
        for idx, sl in blocked_layout.blocks(g.shape, blocked_layout.BLOCKS[k]):
          blk = g[sl]
          for i in range(g.ndim):
            others = [j for j in range(g.ndim) if j != i]
            key = (k, idx, i)
            stats[key] = (w1 * stats.get(key, 0.0)
                          + w2 * np.tensordot(blk, blk, axes=(others, others)))
            if refresh:
              pre[key] = _inverse_root(stats[key], 2 * g.ndim, hp["eps"])
          x = blk
          for i in range(g.ndim):
            x = blocked_layout.mode_product(x, pre.get((k, idx, i), np.eye(blk.shape[i])), i)
          if hp["grafting"] != "none":
            x = x * np.linalg.norm(direction[sl]) / np.linalg.norm(x)
          out[sl] = x
        if t >= hp["start"]:
          direction = out
      if hp["b1"]:
        mu[k] = hp["b1"] * mu[k] + (1 - hp["b1"]) * direction
        direction = mu[k]
      updates[k] = -hp["lr"] * (direction + hp["wd"] * params[k])
      params[k] = params[k] + updates[k]
    history.append(updates)
  return history


CASES = {  # name -> hyperparameters of both; refreshes at start + 3 j
    "rmsprop": {"grafting": "rmsprop", "b1": 0.9, "b2": 0.9, "start": 1},
    "adagrad_sums_late_start": {"grafting": "adagrad", "b1": 0.5, "b2": 1.0, "start": 4},
    "sgd_no_momentum": {"grafting": "sgd", "b1": 0.0, "b2": 0.99, "start": 2},
    "none": {"grafting": "none", "b1": 0.9, "b2": 0.95, "start": 1},
}


def _hyperparameters(case):
  return {"lr": 0.1, "eps": 1e-3, "graft_eps": 1e-8, "freq": 3, "wd": 0.01,
          **CASES[case]}


def _shampoo(hp, method="eigh"):
  return shardopt.contrib.shampoo(
      hp["lr"], block_size=3, b1=hp["b1"], b2=hp["b2"],
      eps=hp["eps"], weight_decay=hp["wd"], grafting=hp["grafting"],
      graft_eps=hp["graft_eps"], precondition_frequency=hp["freq"],
      start_preconditioning_step=hp["start"], inverse_root_method=method)


@pytest.fixture(autouse=True)
def _fail_on_hang():
  with blocked_layout.exit_after(300):
    yield


@pytest.mark.parametrize("case", list(CASES))
def test_matches_numpy_reference(case):
  hp = _hyperparameters(case)
  params, grads = blocked_layout.params_and_grads()
  blocked_layout.assert_steps_close(blocked_layout.run_steps(_shampoo(hp), params, grads),
                _reference(params, grads, hp), rtol=1e-4)


def test_newton_inverse_root_matches_reference():
  """The coupled Newton iteration (40 iterations) reaches the same roots."""
  hp = _hyperparameters("rmsprop")
  params, grads = blocked_layout.params_and_grads()
  blocked_layout.assert_steps_close(blocked_layout.run_steps(_shampoo(hp, "newton"), params, grads),
                _reference(params, grads, hp), rtol=1e-4)


def test_block_layout_is_stated():
  layout = shardopt.contrib.block_layout(
      {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in
       blocked_layout.SHAPES.items()}, block_size=3)
  assert str(layout["w"]) == "(4, 6): 2 x 2 blocks of 2 x 3"
  assert str(layout["t"]) == "(2, 4, 4): 1 x 2 x 2 blocks of 2 x 2 x 2"
  assert str(layout["u"]) == "(5, 8): 2 x 3 blocks of 3 x 3 (zero-padded to 6 x 9)"
  assert str(layout["v"]) == "(4,): not blocked (rank < 2)"
  # The LM demo's query kernel with the default block_size: one block.
  query = jax.ShapeDtypeStruct((64, 4, 16), jnp.float32)
  assert shardopt.contrib.block_layout(query, 64).grid == (1, 1, 1)
  assert shardopt.contrib.block_layout(query, 16).block == (16, 4, 16)
  with pytest.raises(ValueError, match="block_size=0"):
    shardopt.contrib.shampoo(0.1, block_size=0)


def test_sharded_transformer_matches_unsharded():
  """(2, 4) mesh, FSDP x TP: no ReplicatedStateWarning, a refresh at steps
  1 and 3, equal to the unsharded steps."""
  blocked_layout.assert_sharded_step_matches(
      shardopt.contrib.shampoo(0.01, block_size=16, precondition_frequency=2))


def test_state_bytes_per_device_near_ideal():
  ratio, most, total = blocked_layout.state_bytes_over_ideal(
      shardopt.contrib.shampoo(0.01, block_size=16))
  assert ratio <= 1.13, f"{most} bytes on a device, {total} in all"  # 1.1204: shapes alone fix it


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_update_called_on_arrays_typed_on_explicit_axes(name):
  """``tx.update`` in a ``jit`` of the user's, on params, gradients and
  state typed on Explicit (2, 4) axes (the sharded step runs it with the axes
  Auto): each block's work runs in ``shard_map`` on the devices holding it;
  two steps (a refresh at each) equal the unsharded ones."""
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  P = jax.sharding.PartitionSpec
  shardings = {"w": jax.sharding.NamedSharding(mesh, P("data", "model")),
               "b": jax.sharding.NamedSharding(mesh, P("model"))}
  keys = jax.random.split(jax.random.PRNGKey(5), 4)
  params = {"w": jax.random.normal(keys[0], (64, 128)),
            "b": jax.random.normal(keys[1], (128,))}
  grads = [{"w": jax.random.normal(k, (64, 128)), "b": jnp.ones(128)} for k in keys[2:]]
  tx = getattr(shardopt.contrib, name)(0.01, block_size=32, precondition_frequency=1)
  opt = shardopt.make_sharded_optimizer(tx, params, shardings)
  placed = jax.device_put(jax.tree.map(jnp.copy, params), shardings)
  state, plain_params, plain_state = opt.init(placed), params, tx.init(params)
  update, plain_update = jax.jit(tx.update), jax.jit(tx.update)
  with jax.sharding.set_mesh(mesh):
    for g in grads:
      updates, state = update(jax.device_put(g, shardings), state, placed)
      placed = shardopt.apply_updates(placed, updates)
      updates, plain_state = plain_update(g, plain_state, plain_params)
      plain_params = shardopt.apply_updates(plain_params, updates)
  for k in params:
    np.testing.assert_allclose(np.asarray(placed[k]), np.asarray(plain_params[k]),
                               rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("zero", [None, "data"], ids=["no_zero", "zero"])
@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_explicit_mesh_with_params_replicated_over_data(name, zero):
  """Explicit (2, 4) axes, a matrix split over 'model' only (replicated over
  'data'), with and without ZeRO over 'data': two steps (a refresh at each)
  equal to the unsharded ones. The block grid (2 x 4 blocks of 32) is split
  on one of its dims only, and ZeRO splits the grafting state and the
  statistics' other grid dim further than the gradient."""
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  P = jax.sharding.PartitionSpec
  shardings = {"w": jax.sharding.NamedSharding(mesh, P(None, "model")),
               "b": jax.sharding.NamedSharding(mesh, P("model"))}
  keys = jax.random.split(jax.random.PRNGKey(3), 4)
  params = {"w": jax.random.normal(keys[0], (64, 128)),
            "b": jax.random.normal(keys[1], (128,))}
  grads = [{"w": jax.random.normal(k, (64, 128)), "b": jnp.ones(128)} for k in keys[2:]]
  tx = getattr(shardopt.contrib, name)(0.01, block_size=32, precondition_frequency=1)
  opt = shardopt.make_sharded_optimizer(tx, params, shardings, shard_state_over=zero)
  placed = jax.device_put(jax.tree.map(jnp.copy, params), shardings)
  state, plain_params, plain_state = opt.init(placed), params, tx.init(params)
  plain_update = jax.jit(tx.update)
  for g in grads:
    placed, state = opt.update(jax.device_put(g, shardings), state, placed)
    updates, plain_state = plain_update(g, plain_state, plain_params)
    plain_params = shardopt.apply_updates(plain_params, updates)
  for k in params:
    np.testing.assert_allclose(np.asarray(placed[k]), np.asarray(plain_params[k]),
                               rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", ["shampoo", "soap"])
def test_bfloat16_params_precondition_in_float32(name):
  """bfloat16 params with the default eigh method: LAPACK has no bfloat16 eigh or QR (a raw
  'Unsupported dtype bfloat16' before). The statistics and their roots or bases are kept in
  float32, the moments and the updates in bfloat16: each step's update is the float32 run's within
  2% (norm of the difference; bfloat16 statistics were far off it)."""
  tx = getattr(shardopt.contrib, name)(1e-2, block_size=16)
  rng = np.random.default_rng(0)
  values = [rng.normal(size=(32, 48)).astype(np.float32) for _ in range(4)]
  runs = {}
  for dtype in (jnp.bfloat16, jnp.float32):
    params = {"w": jnp.asarray(values[0]).astype(jnp.bfloat16).astype(dtype)}
    state, step, moves = tx.init(params), jax.jit(tx.update), []
    for g in values[1:]:
      updates, state = step({"w": jnp.asarray(g).astype(jnp.bfloat16).astype(dtype)}, state,
                            params)
      assert updates["w"].dtype == dtype
      moves.append(np.asarray(updates["w"], np.float32))
    runs[dtype] = np.stack(moves)
    preconditioning = next(part for part in state if hasattr(part, "stats"))
    assert {leaf.dtype for leaf in jax.tree.leaves(preconditioning.stats)} == {
        jnp.dtype(jnp.float32)}
    assert preconditioning.mu["w"].dtype == dtype
  difference = np.linalg.norm(runs[jnp.bfloat16] - runs[jnp.float32], axis=(1, 2))
  assert np.all(difference <= 0.02 * np.linalg.norm(runs[jnp.float32], axis=(1, 2)))
