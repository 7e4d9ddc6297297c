"""opt.train_step: loss, gradients and update in one donated program, equal
to the two-program path (a jitted value_and_grad, then opt.update)."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
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


def test_the_loss_is_traced_under_the_params_mesh():
  """A loss that names PartitionSpecs (the out_sharding Explicit axes need
  for a contraction of two sharded dimensions) runs through train_step
  with no mesh context of the caller's, and trains as the plain loss does
  on Auto axes."""
  def explicit_loss(params, batch):
    x, y = batch
    h = jax.nn.gelu(x @ params["w1"])
    out = jnp.matmul(h, params["w2"], out_sharding=P("data", None))
    return jnp.mean((out * params["scale"] - y) ** 2)

  trained = {}
  for axis_types, loss in (("auto", _loss), ("explicit", explicit_loss)):
    mesh = partitioning.make_mesh({"data": 4, "model": 2}, axis_types=axis_types)
    shardings = partitioning.named_shardings(mesh, SPECS)
    opt = shardopt.make_sharded_optimizer(shardopt.adam(1e-2), _params(), shardings,
                                          shard_state_over="data", min_shard_bytes=0)
    params = _placed(shardings)
    state, train_step = opt.init(params), opt.train_step(loss)
    for step in range(3):
      params, state, _ = train_step(params, state, _batch(step, mesh))
    trained[axis_types] = jax.device_get(params)
  for got, want in zip(jax.tree.leaves(trained["explicit"]), jax.tree.leaves(trained["auto"])):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_value_fn_given_to_update_is_traced_under_the_params_mesh():
  """L-BFGS's line search calls ``value_fn`` inside ``opt.update``: one that
  names PartitionSpecs runs with no mesh context of the caller's, and
  trains as the plain loss does on Auto axes."""
  trained = {}
  for axis_types in ("auto", "explicit"):
    mesh = partitioning.make_mesh({"data": 4, "model": 2}, axis_types=axis_types)
    shardings = partitioning.named_shardings(mesh, SPECS)
    batch = _batch(0, mesh)

    def loss(params):
      x, y = batch
      h = jax.nn.gelu(x @ params["w1"])
      out = (jnp.matmul(h, params["w2"], out_sharding=P("data", None))
             if axis_types == "explicit" else h @ params["w2"])
      return jnp.mean((out * params["scale"] - y) ** 2)

    opt = shardopt.make_sharded_optimizer(shardopt.lbfgs(), _params(), shardings)
    params = _placed(shardings)
    state = opt.init(params)
    for _ in range(3):
      with jax.set_mesh(mesh):
        value, grads = jax.jit(jax.value_and_grad(loss))(params)
      params, state = opt.update(grads, state, params, value=value, grad=grads, value_fn=loss)
    trained[axis_types] = jax.device_get(params)
  for got, want in zip(jax.tree.leaves(trained["explicit"]), jax.tree.leaves(trained["auto"])):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def _explicit_loss(params, batch):
  """``_loss`` naming the layout of its one contraction of two sharded
  dimensions, as Explicit axes need."""
  x, y = batch
  h = jax.nn.gelu(x @ params["w1"])
  out = jnp.matmul(h, params["w2"], out_sharding=P("data", None))
  return jnp.mean((out * params["scale"] - y) ** 2)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_the_sharded_step_works_inside_a_users_jit(axis_types):
  """``opt.init``, ``opt.update`` and ``train_step`` called inside another
  ``jit`` (``jax.eval_shape`` included) give what they give called directly:
  the same state layout, the same params after 3 steps (ZeRO on)."""
  mesh = partitioning.make_mesh({"data": 4, "model": 2}, axis_types=axis_types)
  shardings = partitioning.named_shardings(mesh, SPECS)
  opt = shardopt.make_sharded_optimizer(shardopt.adam(1e-2), _params(), shardings,
                                        shard_state_over="data", min_shard_bytes=0,
                                        donate=False)
  params = _placed(shardings)
  direct_state = opt.init(params)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), jax.eval_shape(opt.init, params)) == \
      jax.tree.map(lambda x: (x.shape, x.dtype), direct_state)
  jitted_state = jax.jit(opt.init)(params)
  for got, want in zip(jax.tree.leaves(jitted_state), jax.tree.leaves(direct_state)):
    assert got.sharding.is_equivalent_to(want.sharding, want.ndim)
    np.testing.assert_array_equal(got, want)

  loss = _explicit_loss if axis_types == "explicit" else _loss

  @jax.jit
  def users_step(params, state, batch):
    grads = jax.grad(loss)(params, batch)
    return opt.update(grads, state, params)

  train_step = opt.train_step(loss)
  users_train_step = jax.jit(train_step)
  direct = nested = trained = (params, direct_state)
  for step in range(3):
    batch = _batch(step, mesh)
    with jax.set_mesh(mesh):  # the user's own loss names PartitionSpecs
      grads = jax.jit(jax.grad(loss))(direct[0], batch)
      nested = users_step(*nested, batch)
    direct = opt.update(grads, direct[1], direct[0])
    trained = users_train_step(*trained, batch)[:2]
  for got in (nested[0], trained[0]):
    for g, want in zip(jax.tree.leaves(got), jax.tree.leaves(direct[0])):
      np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


# --- train_step's options against the unsharded step computed by hand -----
#
# A model whose loss is valid on Explicit axes as on Auto: no contraction of
# two sharded dimensions (w2's hidden dimension is reduced by a sum).
HIDDEN = 64
MLP_SPECS = {"w1": P(None, "model"), "w2": P("model", None), "b": P()}


def _mlp_params(hidden=HIDDEN):
  k1, k2 = jax.random.split(jax.random.PRNGKey(1))
  return {"w1": jax.random.normal(k1, (16, hidden)) / 4,
          "w2": jax.random.normal(k2, (hidden, 8)) / hidden**0.5,
          "b": jnp.zeros((8,))}


def _predict(params, x, key=None):
  h = jnp.tanh(x @ params["w1"])
  if key is not None:  # dropout, rate 1/2
    h = jnp.where(jax.random.bernoulli(key, 0.5, h.shape), 2 * h, 0.0)
  return jnp.sum(h[:, :, None] * params["w2"], axis=1) + params["b"]


def _mse(params, batch, key=None):
  return jnp.mean((_predict(params, batch["x"], key) - batch["y"]) ** 2)


def _mlp_batch(step, rows=32):
  kx, ky = jax.random.split(jax.random.PRNGKey(200 + step))
  return {"x": jax.random.normal(kx, (rows, 16)), "y": jax.random.normal(ky, (rows, 8))}


def _mesh(axis_types):
  """The (4, 2) ('data', 'model') mesh; "mixed": 'data' Explicit, 'model'
  Auto."""
  if axis_types == "mixed":
    return jax.make_mesh((4, 2), ("data", "model"),
                         axis_types=(AxisType.Explicit, AxisType.Auto))
  return partitioning.make_mesh({"data": 4, "model": 2}, axis_types=axis_types)


def _sharded(tx, axis_types="auto", zero="data", donate=True, hidden=HIDDEN):
  mesh = _mesh(axis_types)
  shardings = partitioning.named_shardings(mesh, MLP_SPECS)
  opt = shardopt.make_sharded_optimizer(tx, _mlp_params(hidden), shardings,
                                        shard_state_over=zero, min_shard_bytes=0,
                                        donate=donate)
  # With ZeRO, tx.update sees grads and params split over 'data' as well.
  same = [u.is_equivalent_to(s, x.ndim) for u, s, x in zip(
      *map(jax.tree.leaves, (opt.update_shardings, shardings, _mlp_params(hidden))))]
  assert all(same) == (zero is None)
  params = jax.device_put(jax.tree.map(jnp.copy, _mlp_params(hidden)), shardings)
  return opt, params, opt.init(params)


def _reference_step(tx, loss_fn, has_aux=False, extra_args=("value", "grad", "value_fn")):
  """The unsharded step by hand: ``jax.value_and_grad``, then ``tx.update``
  with ``extra_args`` (by default those of a line search)."""

  @jax.jit
  def step(params, state, batch, *key):
    value_fn = lambda p: loss_fn(p, batch, *key)
    out, grads = jax.value_and_grad(value_fn, has_aux=has_aux)(params)
    value = out[0] if has_aux else out
    objective = (lambda p: value_fn(p)[0]) if has_aux else value_fn
    offered = {"value": value, "grad": grads, "value_fn": objective, "obj_fn": objective}
    updates, state = shardopt.with_extra_args_support(tx).update(
        grads, state, params, **{name: offered[name] for name in extra_args})
    return shardopt.apply_updates(params, updates), state, out

  return step


def _assert_trees_close(got, want, rtol, atol=0.0):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def test_has_aux_returns_loss_and_aux_like_value_and_grad():
  """The aux's ``pred_mean`` is a mean of terms of order 1 that nearly cancel
  (|mean| ~ 1e-2): the sharded step sums them in another order, so it is
  compared within 1e-7 absolute (a few float32 roundings of a term), not
  relative to its small value (8.4e-9 apart, 1.03e-6 relative, in a CI run)."""

  def loss_fn(params, batch):
    pred = _predict(params, batch["x"])
    return _mse(params, batch), {"pred_mean": jnp.mean(pred), "count": pred.shape[0]}

  tx = shardopt.adam(1e-2)
  opt, params, state = _sharded(tx)
  train_step = opt.train_step(loss_fn, has_aux=True)
  ref = _reference_step(tx, loss_fn, has_aux=True)
  ref_params, ref_state = _mlp_params(), tx.init(_mlp_params())
  for step in range(2):
    params, state, (loss, aux) = train_step(params, state, _mlp_batch(step))
    ref_params, ref_state, (ref_loss, ref_aux) = ref(ref_params, ref_state, _mlp_batch(step))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    _assert_trees_close(aux, ref_aux, rtol=1e-6, atol=1e-7)
  assert int(aux["count"]) == 32
  _assert_trees_close((params, state), (ref_params, ref_state), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_sophia_trains_through_train_step_given_obj_fn(axis_types):
  """``extra_args=("obj_fn",)``: Sophia (its Hutchinson estimate of the
  Hessian's diagonal at every step) equals the unsharded step over 3 steps,
  with ZeRO, within 1e-5 (absolute too: its ratio of moment to curvature is
  clipped, so an element at the clip moves by the rounding of the sharded
  sums)."""
  tx = shardopt.contrib.sophia(1e-2, update_interval=1)
  opt, params, state = _sharded(tx, axis_types)
  train_step = opt.train_step(_mse, extra_args=("obj_fn",))
  ref = _reference_step(tx, _mse, extra_args=("obj_fn",))
  ref_params, ref_state = _mlp_params(), tx.init(_mlp_params())
  for step in range(3):
    params, state, loss = train_step(params, state, _mlp_batch(step))
    ref_params, ref_state, ref_loss = ref(ref_params, ref_state, _mlp_batch(step))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_trees_close((params, state), (ref_params, ref_state), rtol=1e-5, atol=1e-5)


_LINE_SEARCHES = {
    "lbfgs": shardopt.lbfgs,  # zoom line search (value, grad, value_fn)
    "sgd+backtracking": lambda: shardopt.chain(
        shardopt.sgd(2.0), shardopt.scale_by_backtracking_linesearch(
            max_backtracking_steps=15, max_learning_rate=2.0)),
}


@functools.cache
def _line_search_reference(name, steps):
  tx = _LINE_SEARCHES[name]()
  step = _reference_step(tx, _mse)
  params, state, out = _mlp_params(), tx.init(_mlp_params()), []
  for i in range(steps):
    params, state, loss = step(params, state, _mlp_batch(0))
    out.append((params, state, loss))
  return out


@pytest.mark.parametrize("zero", [None, "data"])
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", list(_LINE_SEARCHES))
def test_line_searches_train_through_train_step(name, axis_types, zero):
  """``value``, ``grad`` and ``value_fn`` reach ``tx.update``: L-BFGS with
  its zoom line search and a backtracking search after SGD equal the
  unsharded step within 1e-5 over 3 steps on one batch, with and without
  ZeRO."""
  opt, params, state = _sharded(_LINE_SEARCHES[name](), axis_types, zero)
  train_step = opt.train_step(_mse)
  reference = _line_search_reference(name, 3)
  for step, (ref_params, ref_state, ref_loss) in enumerate(reference):
    params, state, loss = train_step(params, state, _mlp_batch(0))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_trees_close((params, state), (ref_params, ref_state), rtol=1e-5, atol=1e-6)
  losses = [loss for *_, loss in reference]
  assert losses[0] > losses[1] > losses[2]  # each search found a decrease
  for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(opt.state_shardings)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def _rows(batch, i, k):
  """Microbatch ``i`` of ``k``: rows ``i, i + k, ...`` of every leaf."""
  return jax.tree.map(lambda x: x[i::k], batch)


def _reference_microbatch_step(tx, k):
  """By hand: the mean of the k microbatches' losses and gradients (each
  with ``fold_in(key, i)`` when a key is given), then ``tx.update``."""

  @jax.jit
  def step(params, state, batch, *key):
    losses, grads = zip(*[jax.value_and_grad(_mse)(
        params, _rows(batch, i, k), *[jax.random.fold_in(kk, i) for kk in key])
                          for i in range(k)])
    grads = jax.tree.map(lambda *g: sum(g) / k, *grads)
    updates, state = tx.update(grads, state, params)
    return shardopt.apply_updates(params, updates), state, sum(losses) / k

  return step


@pytest.mark.parametrize("axis_types", ["auto", "explicit", "mixed"])
def test_microbatches_equal_the_one_batch_step(axis_types):
  """microbatches=4 with ZeRO: the loss is a mean over examples, so the mean
  over 4 microbatches of 8 rows is the one-batch step on 32 rows."""
  tx = shardopt.adam(1e-2)
  opt, params, state = _sharded(tx, axis_types)
  one_params = jax.tree.map(jnp.copy, params)
  one_state = jax.tree.map(jnp.copy, state)
  micro, one = opt.train_step(_mse, microbatches=4), opt.train_step(_mse)
  ref = _reference_step(tx, _mse)
  ref_params, ref_state = _mlp_params(), tx.init(_mlp_params())
  for step in range(2):
    batch = _mlp_batch(step)
    params, state, loss = micro(params, state, batch)
    one_params, one_state, one_loss = one(one_params, one_state, batch)
    ref_params, ref_state, ref_loss = ref(ref_params, ref_state, batch)
    np.testing.assert_allclose(loss, one_loss, rtol=1e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_trees_close((params, state), (one_params, one_state), rtol=1e-6, atol=1e-7)
  _assert_trees_close((params, state), (ref_params, ref_state), rtol=1e-6, atol=1e-7)


def test_microbatches_of_a_bfloat16_loss_return_its_float32_mean():
  """bfloat16 params and batch (a bfloat16 loss): the microbatches' losses are summed and
  returned in float32 (their mean, by hand), the new params stay bfloat16."""
  mesh = partitioning.make_mesh({"data": 4, "model": 2})
  params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), _mlp_params())
  shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  opt = shardopt.make_sharded_optimizer(shardopt.sgd(0.1), params, shardings,
                                        shard_state_over="data")
  batch = jax.tree.map(lambda x: x.astype(jnp.bfloat16), _mlp_batch(0))
  losses = [_mse(params, _rows(batch, i, 2)) for i in range(2)]
  assert losses[0].dtype == jnp.bfloat16
  new_params, _, loss = opt.train_step(_mse, microbatches=2)(params, opt.init(params), batch)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, (losses[0].astype(np.float32) + losses[1]) / 2, rtol=1e-6)
  assert {p.dtype for p in jax.tree.leaves(new_params)} == {jnp.dtype(jnp.bfloat16)}


def test_microbatches_take_any_integer_type():
  """A NumPy integer is a count of microbatches; a bool, a float or 0 is not."""
  opt, params, state = _sharded(shardopt.adam(1e-2), "auto")
  numpy_count = opt.train_step(_mse, microbatches=np.int64(4))
  python_count = opt.train_step(_mse, microbatches=4)
  batch = _mlp_batch(0)
  np.testing.assert_allclose(numpy_count(jax.tree.map(jnp.copy, params),
                                         jax.tree.map(jnp.copy, state), batch)[2],
                             python_count(params, state, batch)[2], rtol=1e-6)
  for bad in (0, True, 2.0):
    with pytest.raises(ValueError, match="expected an integer >= 1"):
      opt.train_step(_mse, microbatches=bad)


def test_microbatches_need_less_temporary_memory_where_activations_dominate():
  """A 512-wide hidden layer on 256 rows: the activations, not the 12K
  params, fill the step's temporaries; 4 microbatches hold a quarter of
  them at a time (benchmarks/microbatches.py measures the demo model)."""
  opt, params, state = _sharded(shardopt.adam(1e-2), hidden=512)
  batch = _mlp_batch(0, rows=256)
  temp = {k: opt.train_step(_mse, microbatches=k).lower(params, state, batch).compile()
          .memory_analysis().temp_size_in_bytes for k in (1, 4)}
  param_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
  assert temp[1] > 10 * param_bytes  # activations dominate
  assert temp[4] < temp[1] / 2, temp  # measured: 440,112 against 1,704,288 bytes


@pytest.mark.parametrize("microbatches", [1, 2])
def test_a_scalar_batch_leaf_is_replicated(microbatches):
  def loss_fn(params, batch):
    return batch["weight"] * _mse(params, batch)

  tx = shardopt.sgd(0.1)
  opt, params, state = _sharded(tx)
  batch = {**_mlp_batch(0), "weight": jnp.float32(3.0)}
  train_step = opt.train_step(loss_fn, microbatches=microbatches)
  (_, _, shardings), _ = train_step.lower(params, state, batch).compile().input_shardings
  assert shardings["weight"].is_fully_replicated
  assert shardings["x"].spec == P("data")
  params, _, loss = train_step(params, state, batch)
  ref_params, _, ref_loss = _reference_step(tx, loss_fn)(_mlp_params(), tx.init(_mlp_params()),
                                                         batch)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_trees_close(params, ref_params, rtol=1e-6, atol=1e-7)


def test_an_indivisible_batch_leaf_is_an_error_naming_it_and_the_axis_size():
  opt, params, state = _sharded(shardopt.sgd(0.1))
  batch = {"x": jnp.ones((30, 16)), "y": jnp.ones((32, 8))}
  with pytest.raises(ValueError, match=r"batch\['x'\] has shape \(30, 16\); dimension 0 "
                     r"\(30\) must be a multiple of 4 \('data': 4 devices\)"):
    opt.train_step(_mse)(params, state, batch)
  with pytest.raises(ValueError, match=r"batch\['y'\] has shape \(24, 8\); dimension 0 \(24\) "
                     r"must be a multiple of 16 \('data': 4 devices x 4 microbatches\)"):
    opt.train_step(_mse, microbatches=4)(params, state, {"x": jnp.ones((32, 16)),
                                                         "y": jnp.ones((24, 8))})
  with pytest.raises(ValueError, match=r"batch\['x'\] has shape \(6, 16\); its leading "
                     r"dimension must be a multiple of microbatches=4"):
    opt.train_step(_mse, microbatches=4, batch_spec=P())(params, state, _rows(batch, 0, 5))
  assert not params["w1"].is_deleted()  # refused before the step ran


@pytest.mark.parametrize("form", ["callable", "spec tree"])
def test_a_batch_spec_states_the_layout(form):
  """x split over both axes (data x model = 8 ways), y replicated; the
  numbers are the unsharded step's."""
  both = P(("data", "model"))
  batch_spec = ((lambda path, shape: both if path == "['x']" else P()) if form == "callable"
                else {"x": both, "y": P()})
  tx = shardopt.sgd(0.1)
  opt, params, state = _sharded(tx)
  train_step = opt.train_step(_mse, batch_spec=batch_spec)
  batch = _mlp_batch(0, rows=16)  # 16 rows: a multiple of 8, not of 32
  (_, _, shardings), _ = train_step.lower(params, state, batch).compile().input_shardings
  assert shardings["x"].spec == both and shardings["y"].is_fully_replicated
  params, _, loss = train_step(params, state, batch)
  ref_params, _, ref_loss = _reference_step(tx, _mse)(_mlp_params(), tx.init(_mlp_params()),
                                                      batch)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_trees_close(params, ref_params, rtol=1e-6, atol=1e-7)


def test_bad_batch_specs_are_named():
  opt, params, state = _sharded(shardopt.sgd(0.1))
  batch = _mlp_batch(0)
  step = lambda spec: opt.train_step(_mse, batch_spec=spec)(params, state, batch)
  with pytest.raises(ValueError, match="batch_spec is not a prefix of the batch's tree"):
    step({"x": P("data"), "labels": P()})
  with pytest.raises(ValueError, match=r"P\('data', 'dta'\) of batch\['x'\] names \['dta'\], "
                     r"not axes of the mesh \{'data': 4, 'model': 2\}"):
    step({"x": P("data", "dta"), "y": P()})
  with pytest.raises(TypeError, match=r"batch_spec gave None for batch\['x'\]"):
    step(lambda path, shape: None)
  assert not params["w1"].is_deleted()


@pytest.mark.parametrize("microbatches", [1, 4])
def test_a_prng_key_reaches_the_loss(microbatches):
  """Dropout: the same key gives the same loss and update, another key
  another loss; microbatch i gets fold_in(key, i) (checked by hand)."""
  tx = shardopt.sgd(0.1)
  opt, params, state = _sharded(tx, donate=False)
  train_step = opt.train_step(_mse, with_key=True, microbatches=microbatches)
  batch, key = _mlp_batch(0), jax.random.key(7)
  new, _, loss = train_step(params, state, batch, key)
  again, _, loss_again = train_step(params, state, batch, key)
  _, _, other = train_step(params, state, batch, jax.random.key(8))
  assert float(loss) == float(loss_again) and float(loss) != float(other)
  _assert_trees_close(new, again, rtol=0)
  ref = (_reference_step(tx, _mse) if microbatches == 1 else
         _reference_microbatch_step(tx, microbatches))
  ref_params, _, ref_loss = ref(_mlp_params(), tx.init(_mlp_params()), batch, key)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  _assert_trees_close(new, ref_params, rtol=1e-6, atol=1e-7)
  with pytest.raises(TypeError, match="with_key=True: pass the step's PRNG key"):
    train_step(params, state, batch)


def test_metrics_global_norms_by_hand():
  tx = shardopt.chain(shardopt.clip_by_global_norm(0.1), shardopt.sgd(0.5))
  opt, params, state = _sharded(tx)
  train_step = opt.train_step(_mse, metrics=shardopt.sharding.global_norms)
  new, _, _, norms = train_step(params, state, _mlp_batch(0))
  grads = jax.grad(_mse)(_mlp_params(), _mlp_batch(0))
  norm = lambda tree: np.sqrt(sum(np.sum(np.float64(x) ** 2) for x in jax.tree.leaves(tree)))
  np.testing.assert_allclose(norms["grad_norm"], norm(grads), rtol=1e-5)
  assert norm(grads) > 0.1  # clipped: the update's norm is 0.5 * 0.1
  np.testing.assert_allclose(norms["update_norm"], 0.05, rtol=1e-5)
  np.testing.assert_allclose(norms["param_norm"], norm(new), rtol=1e-6)
  assert all(v.sharding.is_fully_replicated for v in norms.values())


def test_metrics_global_norms_of_bfloat16_params_sum_in_float32():
  """bfloat16 params and gradients: each norm within float32 rounding of the float64 norm of
  the same bfloat16 values (summed in bfloat16 the param norm is off by up to 0.125)."""
  mesh = partitioning.make_mesh({"data": 4, "model": 2})
  params = {"w": jnp.full((64, 64), 0.7, jnp.bfloat16) + jnp.linspace(0, 1e-2, 64 * 64,
                                                                      dtype=jnp.bfloat16).reshape(64, 64)}
  shardings = jax.tree.map(lambda _: NamedSharding(mesh, P()), params)
  opt = shardopt.make_sharded_optimizer(shardopt.sgd(0.1), params, shardings)
  loss = lambda p, batch: jnp.sum(p["w"] * batch)
  batch = jnp.full((64, 64), 0.3, jnp.bfloat16)
  new, _, _, norms = opt.train_step(loss, metrics=shardopt.sharding.global_norms)(
      params, opt.init(params), batch)
  norm = lambda x: np.sqrt(np.sum(np.float64(x) ** 2))
  np.testing.assert_allclose(norms["param_norm"], norm(new["w"]), rtol=1e-6)
  np.testing.assert_allclose(norms["grad_norm"], norm(batch), rtol=1e-6)
  assert {v.dtype for v in norms.values()} == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("scale", [1e30, 1e-25, 1.0])
def test_metrics_global_norms_of_finite_trees_are_finite(scale):
  """Plain float32 squares overflow from 1.8e19 and vanish below 1e-19: a finite tree of norm
  1e31 had a norm of inf, one of 1e-24 a norm of 0. Each norm is within 1e-6 of the float64 norm
  of the same values (complex and bfloat16 leaves among them); a non-finite leaf gives inf."""
  rng = np.random.default_rng(0)
  tree = {"a": (rng.normal(size=(8, 16)) * scale).astype(np.float32),
          "b": (rng.normal(size=(5,)) * scale).astype(np.complex64),
          "c": jnp.asarray(rng.normal(size=(3, 4)) * scale, jnp.bfloat16), "d": None}
  norm = np.sqrt(sum(np.sum(np.abs(np.asarray(x, np.complex128)) ** 2)
                     for x in jax.tree.leaves(tree)))
  norms = jax.jit(shardopt.sharding.global_norms)(tree, tree, tree)
  for name, value in norms.items():
    assert value.dtype == jnp.float32
    np.testing.assert_allclose(float(value), norm, rtol=1e-6, err_msg=name)
  tree["a"][0, 0] = np.inf
  assert float(shardopt.sharding.global_norms(tree, tree, tree)["param_norm"]) == np.inf
  assert float(shardopt.sharding.global_norms({}, {}, {})["grad_norm"]) == 0.0


def _probe():
  """No update; its state records ``value`` and ``value_fn(params)``."""
  def update(updates, state, params=None, *, value, value_fn, **extra):
    del state, extra
    return jax.tree.map(jnp.zeros_like, updates), (value, value_fn(params))
  return shardopt.GradientTransformationExtraArgs(
      lambda params: (jnp.zeros(()), jnp.zeros(())), update)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_value_fn_at_the_params_is_the_value(axis_types):
  """A line search compares value_fn's values with value: with ZeRO,
  dropout keys and 4 microbatches, value_fn(params) is value."""
  opt, params, state = _sharded(_probe(), axis_types)
  train_step = opt.train_step(_mse, with_key=True, microbatches=4)
  _, (value, at_params), loss = train_step(params, state, _mlp_batch(0), jax.random.key(3))
  np.testing.assert_allclose(at_params, value, rtol=1e-6)
  np.testing.assert_allclose(value, loss, rtol=0)
