"""Directly sharded linen TrainState and nnx.Optimizer, saved and restored through checkpoints/."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import checkpoints as ck
import partitioning
import shardopt

SPECS = {"kernel": P("a", "b"), "bias": P("b")}


def _mesh(shape, axis_types="auto"):
  """A mesh of ``shape`` on the first of the 8 devices."""
  return partitioning.make_mesh({"a": shape[0], "b": shape[1]}, axis_types=axis_types,
                                devices=jax.devices()[:shape[0] * shape[1]])


class _Model(nnx.Module):
  def __init__(self, rngs):
    self.dense = nnx.Linear(16, 8, rngs=rngs)
    self.norm = nnx.BatchNorm(8, rngs=rngs)  # non-param variables (batch stats) ride along

  def __call__(self, x):
    return self.norm(self.dense(x))


def _param_shardings(mesh):
  return {"dense": {k: NamedSharding(mesh, s) for k, s in SPECS.items()},
          "norm": {"bias": NamedSharding(mesh, P()), "scale": NamedSharding(mesh, P())}}


def _nnx(mesh, tx):
  return ck.create_nnx_optimizer(lambda: _Model(nnx.Rngs(0)), tx, _param_shardings(mesh))


def _train(model, optimizer, steps):
  @nnx.jit
  def step(model, optimizer, x):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
    optimizer.update(model, grads)
    return loss
  return [float(step(model, optimizer, jnp.ones((4, 16)) * (i + 1))) for i in range(steps)]


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_train_state_created_directly_sharded(axis_types):
  mesh = _mesh((2, 4), axis_types)
  params = {"w": jnp.zeros((16, 8)), "b": jnp.zeros(8)}
  shardings = {"w": NamedSharding(mesh, P("a", "b")), "b": NamedSharding(mesh, P("b"))}
  state = ck.create_train_state(None, lambda: jax.tree.map(jnp.ones_like, params), optax.adam(1e-3), shardings)
  assert state.params["w"].sharding == shardings["w"]
  assert state.opt_state[0].mu["w"].sharding.spec == P("a", "b")
  assert state.opt_state[0].nu["b"].sharding.spec == P("b")
  assert {s.data.shape for s in state.opt_state[0].mu["w"].addressable_shards} == {(8, 2)}


_STATES_WITH_FIELDS_OUT_OF_NAME_ORDER = {
    "adafactor": lambda: shardopt.adafactor(1e-2, min_dim_size_to_factor=4),  # v_row, v_col, v
    "galore": lambda: shardopt.contrib.galore(1e-2, rank=2, update_proj_gap=2),  # (0, 0) leaves
    "soap": lambda: shardopt.contrib.soap(1e-2, precondition_frequency=1),
    "adamw 4-bit": lambda: shardopt.adamw(1e-2, state_bits=4),
}


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", list(_STATES_WITH_FIELDS_OUT_OF_NAME_ORDER))
def test_nnx_optimizer_state_lands_on_its_derived_shardings(name, axis_types):
  """Each state leaf of ``create_nnx_optimizer``'s optimizer on the sharding
  ``shardopt.state_shardings`` derives for it, for states whose fields are
  not in the order of their names (``nnx.state`` sorts them), and the
  optimizer trains as the same transformation on the pure arrays."""
  tx = _STATES_WITH_FIELDS_OUT_OF_NAME_ORDER[name]()
  mesh = _mesh((2, 4), axis_types)
  model, optimizer = _nnx(mesh, tx)
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  derived = shardopt.state_shardings(tx, params, _param_shardings(mesh))
  variables = jax.tree.leaves(optimizer.opt_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
  assert len(variables) == len(jax.tree.leaves(derived))
  for variable, sharding in zip(variables, jax.tree.leaves(derived)):
    assert variable.get_value().sharding.is_equivalent_to(sharding, variable.get_value().ndim), (
        name, variable.get_value().shape, sharding)
  assert np.all(np.isfinite(_train(model, optimizer, 2)))


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_nnx_optimizer_sharded_save_restore_and_continue(tmp_path, axis_types):
  """On Auto and on Explicit axes (jax.make_mesh's default), where the state is laid out
  by resharding rather than by a constraint."""
  tx = optax.adam(1e-2)
  model, optimizer = _nnx(_mesh((2, 4), axis_types), tx)
  assert model.dense.kernel.get_value().sharding.spec == P("a", "b")
  assert optimizer.opt_state[0].mu["dense"]["kernel"].get_value().sharding.spec == P("a", "b")
  _train(model, optimizer, 2)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(2, ck.nnx_checkpoint_state(model, optimizer))
  expected = _train(model, optimizer, 2)

  new_model, new_optimizer = _nnx(_mesh((4, 2), axis_types), tx)  # fresh values, other mesh
  with ck.CheckpointManager(tmp_path) as mngr:
    restored = mngr.restore(ck.nnx_checkpoint_state(new_model, new_optimizer))
  assert isinstance(restored.state["optimizer"], nnx.State)
  ck.nnx_load_state(new_model, new_optimizer, restored.state)
  assert int(new_optimizer.step.get_value()) == 2
  assert new_model.dense.kernel.get_value().sharding == NamedSharding(
      _mesh((4, 2), axis_types), P("a", "b"))
  np.testing.assert_allclose(_train(new_model, new_optimizer, 2), expected, rtol=1e-6)


class _AnnotatedModel(nnx.Module):
  """Laid out by its own ``nnx.with_partitioning`` annotations, as NNX models are."""

  def __init__(self, rngs):
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "b"))
    self.dense = nnx.Linear(16, 8, kernel_init=init, rngs=rngs,
                            bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("b",)))

  def __call__(self, x):
    return self.dense(x)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_nnx_optimizer_of_a_model_annotated_with_partitioning(axis_types):
  """The shardings read from the model's annotations (an ``nnx.State``), the model created
  under their mesh without one of the caller's (NNX refuses annotated variables without)."""
  mesh = _mesh((2, 4), axis_types)
  with jax.set_mesh(mesh):
    abstract = nnx.eval_shape(lambda: _AnnotatedModel(nnx.Rngs(0)))
  _, specs = partitioning.specs_from_flax_metadata(nnx.state(abstract, nnx.Param))
  tx = shardopt.adamw(1e-2, state_bits=8)
  model, optimizer = ck.create_nnx_optimizer(lambda: _AnnotatedModel(nnx.Rngs(0)), tx,
                                             partitioning.named_shardings(mesh, specs))
  kernel = model.dense.kernel.get_value()
  assert kernel.sharding.spec == P(None, "b") and model.dense.bias.get_value().sharding.spec == P("b")
  assert {s.data.shape for s in kernel.addressable_shards} == {(16, 2)}
  mu = optimizer.opt_state[0].mu["dense"]["kernel"].get_value()
  assert mu.sharding.spec == P(None, "b")
  expected = jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
  losses = _train(model, optimizer, 2)
  np.testing.assert_allclose(losses, _unsharded_losses(expected, tx, 2), rtol=1e-5)


def _unsharded_losses(params, tx, steps):
  """``_train``'s losses for ``_AnnotatedModel``'s params as plain arrays, ``tx`` on one device."""
  def loss(p, x):
    return jnp.mean((x @ p["dense"]["kernel"] + p["dense"]["bias"]) ** 2)
  state, losses = tx.init(params), []
  for i in range(steps):
    value, grads = jax.value_and_grad(loss)(params, jnp.ones((4, 16)) * (i + 1))
    updates, state = tx.update(grads, state, params)
    params = shardopt.apply_updates(params, updates)
    losses.append(float(value))
  return losses


def test_nnx_changed_optimizer_needs_explicit_reinit(tmp_path):
  model, optimizer = _nnx(_mesh((2, 4)), optax.adam(1e-2))
  _train(model, optimizer, 1)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, ck.nnx_checkpoint_state(model, optimizer))
  new_model, new_optimizer = _nnx(_mesh((2, 4)), optax.sgd(1e-2, momentum=0.9))
  target = ck.nnx_checkpoint_state(new_model, new_optimizer)
  with ck.CheckpointManager(tmp_path) as mngr:
    try:
      mngr.restore(target)
      raise AssertionError("a changed optimizer restored without optimizer_changed='reinit'")
    except ck.StructureMismatchError as e:
      assert "optimizer.opt_state.0.trace.dense.kernel.value: in the target, not in the checkpoint" in str(e)
    restored = mngr.restore(target, optimizer_changed="reinit").state
  ck.nnx_load_state(new_model, new_optimizer, restored)
  np.testing.assert_array_equal(np.asarray(new_model.dense.kernel.get_value()), np.asarray(model.dense.kernel.get_value()))
  np.testing.assert_array_equal(np.asarray(new_optimizer.opt_state[0].trace["dense"]["kernel"].get_value()), 0)


def test_train_state_with_8bit_state_has_the_derived_blocks():
  """TrainState.create calls tx.init itself: its init is traced on the
  params typed in their layout, so the quantized blocks are those
  shardopt.state_shardings derived, on an Auto mesh: split over both mesh
  axes, its dimensions 0 and 1 are cut at most into 64 / 8 and 4 / 4 by any
  mesh of 8 devices, so tiles (8, 1, 16), where the whole array's would be
  (4, 4, 16)."""
  mesh = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  shardings = {"w": NamedSharding(mesh, P("data", "model", None))}
  params = {"w": jnp.ones((64, 4, 16))}
  tx = shardopt.adamw(1e-3, state_bits=8)
  state = ck.create_train_state(None, lambda: params, tx, shardings)
  derived = shardopt.state_shardings(tx, params, shardings)
  mu = state.opt_state[0].mu["w"]
  assert isinstance(mu, shardopt.QuantizedArray) and mu.tile == (8, 1, 16)
  for leaf, sharding in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(derived)):
    assert leaf.sharding.is_equivalent_to(sharding, leaf.ndim)


def _linen_loss(params, x):
  return jnp.mean(jnp.tanh(x @ params["w"] + params["b"]) ** 2)


_ZERO_TXS = {"float": lambda: shardopt.adamw(1e-2), "8-bit": lambda: shardopt.adamw(1e-2, state_bits=8),
             "4-bit": lambda: shardopt.adamw(1e-2, state_bits=4)}


@pytest.mark.parametrize("state", list(_ZERO_TXS))
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_train_state_with_zero_trains_in_a_users_jit_and_keeps_the_params_layout(axis_types, state):
  """``create_train_state(..., shard_state_over="data")``: the state split over ``data`` as
  well (bytes on a device from its shards), and ``apply_gradients`` in the user's own ``jit``
  trains with the params staying in their shardings: on Explicit axes a ZeRO-laid-out update
  could not be added to them; on Auto axes the partitioner gave the params the state's layout."""
  mesh = _mesh((2, 4), axis_types)
  shardings = {"w": NamedSharding(mesh, P(None, "b")), "b": NamedSharding(mesh, P())}
  params = {"w": jax.random.normal(jax.random.key(0), (64, 128)) / 8, "b": jnp.zeros(128)}
  tx = _ZERO_TXS[state]()
  train = ck.create_train_state(None, lambda: params, tx, shardings, shard_state_over="a")
  mu = train.opt_state[0].mu["w"]
  for leaf in jax.tree.leaves(mu):  # split 8 ways: over 'a' (ZeRO) and 'b' (the param's)
    assert {s.data.nbytes for s in leaf.addressable_shards} == {leaf.nbytes // 8}

  @jax.jit
  def step(train, x):
    loss, grads = jax.value_and_grad(_linen_loss)(train.params, x)
    return train.apply_gradients(grads=grads), loss

  reference, reference_state, losses = params, tx.init(params), []
  x = jax.random.normal(jax.random.key(1), (16, 64))
  with jax.set_mesh(mesh):
    for _ in range(3):
      train, loss = step(train, x)
      losses.append(float(loss))
      grads = jax.grad(_linen_loss)(reference, x)
      updates, reference_state = tx.update(grads, reference_state, reference)
      reference = shardopt.apply_updates(reference, updates)
  for name, sharding in shardings.items():
    assert train.params[name].sharding.is_equivalent_to(sharding, train.params[name].ndim), name
  if state == "float":  # the quantized blocks differ from one device's (fitted to the shards)
    np.testing.assert_allclose(train.params["w"], reference["w"], rtol=1e-5, atol=1e-6)
  assert losses[-1] < losses[0]


@pytest.mark.parametrize("state", list(_ZERO_TXS))
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_zero_shardings_given_by_hand_train_as_shard_state_over(axis_types, state):
  """``opt_state_shardings=shardopt.state_shardings(..., shard_state_over="a")`` (the Flax
  way of giving them) trains as ``shard_state_over="a"`` does, bit for bit. Here ZeRO splits
  the last dimension (the first is the param's own), which the blocks fitted to the
  params' layout alone cut: 8- and 4-bit state raised IndivisibleError."""
  mesh = _mesh((2, 4), axis_types)
  shardings = {"u": NamedSharding(mesh, P("b", None))}
  params = {"u": jax.random.normal(jax.random.key(0), (16, 256))}
  loss = lambda p, x: jnp.mean(jnp.tanh(p["u"] * x) ** 2)
  tx = _ZERO_TXS[state]()
  by_hand = shardopt.state_shardings(tx, params, shardings, shard_state_over="a")

  @jax.jit
  def step(train, x):
    return train.apply_gradients(grads=jax.grad(loss)(train.params, x))

  def trained(**zero):
    train = ck.create_train_state(None, lambda: params, tx, shardings, **zero)
    with jax.set_mesh(mesh):
      for seed in range(3):
        train = step(train, jax.random.normal(jax.random.key(seed), (16, 256)))
    return train

  want, got = trained(shard_state_over="a"), trained(opt_state_shardings=by_hand)
  for g, w, sharding in zip(jax.tree.leaves(got.opt_state), jax.tree.leaves(want.opt_state),
                            jax.tree.leaves(by_hand)):
    assert g.sharding.is_equivalent_to(sharding, g.ndim)
    np.testing.assert_array_equal(g, w)
  np.testing.assert_array_equal(got.params["u"], want.params["u"])
  assert got.params["u"].sharding.is_equivalent_to(shardings["u"], 2)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_nnx_optimizer_with_zero(axis_types):
  """``create_nnx_optimizer(..., shard_state_over=...)``: the moments split over the ZeRO axis
  too, the params keep their shardings through ``nnx.Optimizer.update`` in ``nnx.jit``, and
  the losses equal those without ZeRO."""
  mesh = _mesh((2, 4), axis_types)
  shardings = {"dense": {"kernel": NamedSharding(mesh, P(None, "b")), "bias": NamedSharding(mesh, P("b"))}}

  def trained(**zero):
    model, optimizer = ck.create_nnx_optimizer(lambda: _WideModel(nnx.Rngs(0)), shardopt.adamw(1e-2),
                                               shardings, **zero)

    @nnx.jit
    def step(model, optimizer, x):
      loss, grads = nnx.value_and_grad(lambda m: jnp.mean(jnp.tanh(m(x)) ** 2))(model)
      optimizer.update(model, grads)
      return loss

    with jax.set_mesh(mesh):
      losses = [float(step(model, optimizer, jnp.full((4, 256), 0.1))) for _ in range(3)]
    return model, optimizer, losses

  model, optimizer, losses = trained(shard_state_over="a")
  mu = optimizer.opt_state[0].mu["dense"]["kernel"].get_value()
  assert mu.sharding.spec == P("a", "b")
  assert {s.data.shape for s in mu.addressable_shards} == {(128, 16)}
  assert model.dense.kernel.get_value().sharding.is_equivalent_to(shardings["dense"]["kernel"], 2)
  np.testing.assert_allclose(losses, trained()[2], rtol=1e-6)


class _WideModel(nnx.Module):
  """A kernel of 16,384 elements: above quantized_state's min_size."""

  def __init__(self, rngs):
    self.dense = nnx.Linear(256, 64, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


def _fit_step():
  """``(model, optimizer) -> loss``: one ``nnx.Optimizer`` update of a
  _WideModel towards 1 on a fixed input."""
  x = jnp.linspace(-1.0, 1.0, 4 * 256).reshape(4, 256)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - 1.0) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  return step


def _quantized_decoded(optimizer) -> list:
  state = nnx.as_pure(optimizer.opt_state)
  return [np.asarray(q.decode()) for q in jax.tree.leaves(state, is_leaf=_is_q) if _is_q(q)]


def _is_q(x) -> bool:
  return isinstance(x, shardopt.QuantizedArray)


# One quantization step at its coarsest: the companded code's 1/L of the largest value, the
# minifloat's share of a value (8 bits: 1/16; 4 bits, powers of two: 1/3) above its smallest.
_STEP = {8: dict(signed=1 / 127, rtol=1 / 16, floor=2.0 ** -31),
         4: dict(signed=1 / 7, rtol=1 / 3 + 1e-6, floor=2.0 ** -15)}


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
def test_nnx_quantized_state_restores_onto_a_mesh_with_other_blocks(tmp_path, axis_types, bits):
  """Moments saved on (2, 4) restored on (2, 2), 4 devices: the blocks differ (they fit the
  shards of every mesh of as many devices), so they are re-tiled, listed, each decoded value
  within one quantization step of the saved one, and training continues."""
  step_of = _STEP[bits]
  tx = shardopt.adamw(1e-2, state_bits=bits)
  shardings = lambda mesh: {"dense": {k: NamedSharding(mesh, s) for k, s in SPECS.items()}}
  make = lambda mesh: ck.create_nnx_optimizer(lambda: _WideModel(nnx.Rngs(0)), tx, shardings(mesh))
  step = _fit_step()

  model, optimizer = make(_mesh((2, 4), axis_types))
  for _ in range(2):
    step(model, optimizer)
  saved = _quantized_decoded(optimizer)
  assert len(saved) == 2  # the kernel's mu and nu
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(2, ck.nnx_checkpoint_state(model, optimizer))
  new_model, new_optimizer = make(_mesh((2, 2), axis_types))
  with ck.CheckpointManager(tmp_path) as mngr:
    restored = mngr.restore(ck.nnx_checkpoint_state(new_model, new_optimizer))
  assert sorted(restored.retiled) == ["optimizer.opt_state.0.mu.dense.kernel",
                                      "optimizer.opt_state.0.nu.dense.kernel"]
  ck.nnx_load_state(new_model, new_optimizer, restored.state)
  mu, nu = _quantized_decoded(new_optimizer)
  np.testing.assert_allclose(mu, saved[0], atol=np.max(np.abs(saved[0])) * step_of["signed"])
  np.testing.assert_allclose(nu, saved[1], rtol=step_of["rtol"],
                             atol=np.max(saved[1]) * step_of["floor"])
  np.testing.assert_array_equal(np.asarray(new_model.dense.kernel.get_value()),
                                np.asarray(model.dense.kernel.get_value()))
  assert np.isfinite(float(step(new_model, new_optimizer)))


@pytest.mark.parametrize("tx", [
    lambda: shardopt.adamw(1e-2, state_bits=8),
    lambda: shardopt.contrib.shampoo(1e-2, block_size=16),
    lambda: optax.contrib.muon(1e-2),
], ids=["8bit", "shampoo", "optax_muon"])
def test_plain_nnx_optimizer_with_update_layout_on_explicit_axes(tx):
  """``nnx.Optimizer(model, with_update_layout(tx, shardings))``, given plainly
  (no ``nnx_tx``): from the second update it passes the state with its
  codes, factors and scales rebuilt as mappings, which ``tx.update`` returns
  in its own structure; on Explicit axes, where ``tx.update`` runs with the
  axes Auto, the new state takes back the layout of the state given, leaf by
  leaf. 3 steps give the losses of the same run on Auto axes (1e-5; the
  same quantization blocks), optax's muon included (its matmul over a split
  dimension is ambiguous on Explicit axes)."""
  step = _fit_step()

  def losses(axis_types):
    mesh = _mesh((2, 4), axis_types)
    shardings = {"dense": {"kernel": NamedSharding(mesh, P("a", "b")),
                           "bias": NamedSharding(mesh, P("b"))}}
    with jax.set_mesh(mesh):
      model = _WideModel(nnx.Rngs(0))
      for name, sharding in shardings["dense"].items():
        variable = getattr(model.dense, name)
        variable.set_value(jax.device_put(variable.get_value(), sharding))
      optimizer = nnx.Optimizer(model, shardopt.sharding.with_update_layout(tx(), shardings),
                                wrt=nnx.Param)
      return [float(step(model, optimizer)) for _ in range(3)]

  np.testing.assert_allclose(losses("explicit"), losses("auto"), rtol=1e-5)


class _TallModel(nnx.Module):
  """A (8, 520) kernel split over 'model': 8-bit blocks (8, 8) where 'model' is 1, none
  fitting a (1, 520) shard where it is 8 (the moments kept in float)."""

  def __init__(self, rngs):
    self.dense = nnx.Linear(8, 520, rngs=rngs)

  def __call__(self, x):
    return self.dense(x)


def _kernel_moments(optimizer) -> tuple:
  """The kernel's ``(mu, nu)``: ``QuantizedArray``s, or float arrays."""
  adam = nnx.as_pure(optimizer.opt_state)[0]
  return adam.mu["dense"]["kernel"], adam.nu["dense"]["kernel"]


@pytest.mark.parametrize("saved_mesh, restored_mesh", [((8, 1), (1, 8)), ((1, 8), (8, 1))],
                         ids=["codes_to_float", "float_to_codes"])
def test_nnx_moments_restore_between_codes_and_float(tmp_path, saved_mesh, restored_mesh):
  """8-bit moments saved as codes restored where the target keeps them in float (exactly
  the decoded codes), and float ones where the target keeps codes (within one code step):
  each in the target's form, dtype and shardings, listed as re-tiled, and training goes on."""
  tx = shardopt.adamw(1e-2, state_bits=8)
  specs = {"kernel": P("model", None), "bias": P()}
  make = lambda shape: ck.create_nnx_optimizer(
      lambda: _TallModel(nnx.Rngs(0)), tx,
      {"dense": {k: NamedSharding(partitioning.make_mesh({"data": shape[0], "model": shape[1]}), s)
                 for k, s in specs.items()}})
  x = jnp.linspace(-1.0, 1.0, 4 * 8).reshape(4, 8)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean(jnp.sin(m(x)) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  model, optimizer = make(saved_mesh)
  for _ in range(2):
    step(model, optimizer)
  saved = _kernel_moments(optimizer)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(2, ck.nnx_checkpoint_state(model, optimizer))
  new_model, new_optimizer = make(restored_mesh)
  target = _kernel_moments(new_optimizer)
  assert [_is_q(m) for m in saved] == [saved_mesh == (8, 1)] * 2
  assert [_is_q(m) for m in target] == [not _is_q(m) for m in saved]
  with ck.CheckpointManager(tmp_path) as mngr:
    restored = mngr.restore(ck.nnx_checkpoint_state(new_model, new_optimizer))
  assert sorted(restored.retiled) == ["optimizer.opt_state.0.mu.dense.kernel",
                                      "optimizer.opt_state.0.nu.dense.kernel"]
  ck.nnx_load_state(new_model, new_optimizer, restored.state)
  got = _kernel_moments(new_optimizer)
  arrays = lambda m: (m.codes, m.scales) if _is_q(m) else (m,)
  for moment, like in zip(got, target):
    for array, like_array in zip(arrays(moment), arrays(like), strict=True):
      assert array.dtype == like_array.dtype
      assert array.sharding.is_equivalent_to(like_array.sharding, array.ndim)
  if _is_q(saved[0]):
    for moment, codes in zip(got, saved):
      np.testing.assert_array_equal(np.asarray(moment), np.asarray(codes.decode(moment.dtype)))
  else:
    (mu, nu), (want_mu, want_nu) = ([np.asarray(q.decode()) for q in got], [np.asarray(m) for m in saved])
    np.testing.assert_allclose(mu, want_mu, atol=np.max(np.abs(want_mu)) * _STEP[8]["signed"])
    np.testing.assert_allclose(nu, want_nu, rtol=_STEP[8]["rtol"], atol=np.max(want_nu) * _STEP[8]["floor"])
  assert np.isfinite(float(step(new_model, new_optimizer)))
