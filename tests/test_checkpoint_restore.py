"""Save a sharded TrainState on a (2,4) mesh, restore it onto other meshes and partially."""

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.training import train_state
from jax.sharding import NamedSharding, PartitionSpec as P

import checkpoints as ck
import partitioning
import shardopt

TXS = {"adam": lambda: shardopt.adam(1e-2), "adafactor": lambda: shardopt.adafactor(1e-2)}
SPECS = {"w": P("a", "b"), "b": P("b")}


def _mesh(shape):
  devices = jax.devices()[: shape[0] * shape[1]]
  return partitioning.make_mesh({"a": shape[0], "b": shape[1]}, devices=devices)


def _init_params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {"w": jax.random.normal(k1, (256, 128)) * 0.1, "b": jax.random.normal(k2, (128,)) * 0.1}


def _batch(i):
  x = jax.random.normal(jax.random.key(100 + i), (32, 256))
  return x, jnp.sin(x[:, :128])


def _loss(params, batch):
  x, y = batch
  return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


@jax.jit
def _step(state, batch):
  loss, grads = jax.value_and_grad(_loss)(state.params, batch)
  return state.apply_gradients(grads=grads), loss


def _param_shardings(mesh):
  return {k: NamedSharding(mesh, s) for k, s in SPECS.items()}


def _create(tx, mesh):
  return ck.create_train_state(None, _init_params, tx, _param_shardings(mesh))


def _abstract(tx, mesh):
  """The restore target for ``mesh``: ShapeDtypeStructs carrying the derived shardings."""
  abstract = jax.eval_shape(lambda: train_state.TrainState.create(apply_fn=None, params=_init_params(), tx=tx))
  ps = _param_shardings(mesh)
  shardings = abstract.replace(step=NamedSharding(mesh, P()), params=ps,
                               opt_state=shardopt.state_shardings(tx, abstract.params, ps))
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def _run(state, start, stop):
  losses = []
  for i in range(start, stop):
    state, loss = _step(state, _batch(i))
    losses.append(float(loss))
  return state, losses


def _assert_bit_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module", params=sorted(TXS))
def saved(request, tmp_path_factory):
  """Three steps trained on (2,4), saved; plus the uninterrupted run's later losses."""
  tx = TXS[request.param]()
  state, _ = _run(_create(tx, _mesh((2, 4))), 0, 3)
  directory = tmp_path_factory.mktemp(request.param)
  with ck.CheckpointManager(directory) as mngr:
    assert mngr.save(3, {"train": state, "rng": jax.random.key(7), "raw_rng": jax.random.PRNGKey(8)},
                     metadata={"data_position": 96, "config": {"lr": 1e-2}})
  _, losses = _run(state, 3, 6)
  return tx, directory, state, losses


@pytest.mark.parametrize("shape", [(4, 2), (8, 1), (1, 1)], ids=["4x2", "8x1", "1dev"])
def test_restore_onto_other_mesh_is_bit_equal_and_training_continues(saved, shape):
  tx, directory, state, later_losses = saved
  mesh = _mesh(shape)
  target = {"train": _abstract(tx, mesh), "rng": jax.random.key(0), "raw_rng": jax.random.PRNGKey(0)}
  with ck.CheckpointManager(directory) as mngr:
    restored = mngr.restore(target)
  got = restored.state["train"]
  assert restored.step == 3 and restored.metadata == {"data_position": 96, "config": {"lr": 1e-2}}
  assert type(got) is train_state.TrainState and type(got.opt_state) is type(state.opt_state)
  assert [type(s) for s in got.opt_state] == [type(s) for s in state.opt_state]
  _assert_bit_equal(got.params, state.params)
  _assert_bit_equal(got.opt_state, state.opt_state)
  assert int(got.step) == 3
  assert got.params["w"].sharding == NamedSharding(mesh, SPECS["w"])
  assert jax.tree.leaves(got.opt_state)[1].sharding.mesh.devices.shape == shape
  assert jax.random.key_impl(restored.state["rng"]) == jax.random.key_impl(jax.random.key(0))
  np.testing.assert_array_equal(jax.random.key_data(restored.state["rng"]), jax.random.key_data(jax.random.key(7)))
  np.testing.assert_array_equal(restored.state["raw_rng"], jax.random.PRNGKey(8))
  _, losses = _run(got, 3, 6)
  np.testing.assert_allclose(losses, later_losses, rtol=2e-6)


def test_params_only_restore(saved):
  _, directory, state, _ = saved
  mesh = _mesh((8, 1))
  target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state.params, _param_shardings(mesh))
  with ck.CheckpointManager(directory) as mngr:
    got = mngr.restore_params(target, prefix="train.params")
    # One leaf as the whole target: it was looked for at 'train.params.w.<root>'.
    alone = mngr.restore_subtree(target["w"], "train.params.w")
  _assert_bit_equal(got.state, state.params)
  assert got.state["w"].sharding.mesh.devices.shape == (8, 1)
  _assert_bit_equal(alone.state, state.params["w"])
  assert alone.state.sharding == target["w"].sharding


def test_a_subtree_restore_names_a_wrong_target_or_prefix(saved):
  """The whole state as restore_subtree's target, or a prefix nothing was saved under: every
  leaf was listed as 'in the target, not in the checkpoint' (under a doubled prefix,
  'train.params.train.params.w'), not saying why. Now the message says what to pass."""
  _, directory, state, _ = saved
  mesh = _mesh((8, 1))
  params = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state.params, _param_shardings(mesh))
  with ck.CheckpointManager(directory) as mngr:
    with pytest.raises(ck.StructureMismatchError,
                       match=r"the target is the whole state \(its leaves are named as saved,"
                       r" e\.g\. 'train\.params\.b'\), not the subtree under 'train\.params':"
                       r" pass that subtree \(e\.g\. state\['train\.params'\]\)"):
      mngr.restore_subtree({"train": {"params": params}}, "train.params")
    with pytest.raises(ck.StructureMismatchError,
                       match=r"nothing was saved under 'train\.parms'; the saved tree's"
                       r" top-level names are \['raw_rng', 'rng', 'train'\]"):
      mngr.restore_subtree(params, "train.parms")


def test_changed_optimizer_is_refused_then_reinitialised_on_request(saved, tmp_path):
  tx, directory, state, _ = saved
  mesh = _mesh((4, 2))
  new_tx = optax.sgd(1e-2, momentum=0.9)
  target = {"train": _abstract(new_tx, mesh), "rng": jax.random.key(0), "raw_rng": jax.random.PRNGKey(0)}
  with ck.CheckpointManager(directory) as mngr:
    with pytest.raises(ck.StructureMismatchError) as info:
      mngr.restore(target)
    message = str(info.value)
    assert "train.opt_state.0.trace.w: in the target, not in the checkpoint" in message
    assert "train.opt_state.0" in message and "in the checkpoint, not in the target" in message
    assert "optimizer_changed='reinit'" in message
    with pytest.raises(ValueError, match="concrete"):  # abstract opt_state and no tx to init it
      mngr.restore(target, optimizer_changed="reinit")
    fresh = _create(new_tx, mesh).replace(step=0)
    got = mngr.restore({"train": fresh, "rng": jax.random.key(0), "raw_rng": jax.random.PRNGKey(0)},
                       optimizer_changed="reinit").state["train"]
  _assert_bit_equal(got.params, state.params)
  assert int(got.step) == 3
  expected = new_tx.init(state.params)
  _assert_bit_equal(got.opt_state, expected)
  assert got.opt_state[0].trace["w"].sharding == NamedSharding(mesh, SPECS["w"])


def test_structure_mismatch_names_paths_saved_vs_target(saved):
  tx, directory, state, _ = saved
  target = {"train": _abstract(tx, _mesh((2, 4))), "rng": jax.random.PRNGKey(0)}
  wrong = target["train"].params["b"]
  target["train"] = target["train"].replace(params={"w": target["train"].params["w"],
                                                   "b": jax.ShapeDtypeStruct((64,), jnp.float32, sharding=wrong.sharding)})
  with ck.CheckpointManager(directory) as mngr:
    with pytest.raises(ck.StructureMismatchError) as info:
      mngr.restore(target)
  message = str(info.value)
  assert "train.params.b: saved float32(128,) vs target float32(64,)" in message
  assert "rng: saved key<fry>() (threefry2x32 key) vs target uint32(2,)" in message
  assert "raw_rng: in the checkpoint, not in the target" in message
  assert "optimizer_changed" not in message


def test_bad_user_metadata_and_missing_sharding_are_clear(tmp_path):
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(TypeError, match="metadata must be JSON"):
      mngr.save(1, {"x": jnp.ones(2)}, metadata={"f": object()})
    mngr.save(1, {"x": jnp.ones(2)})
    mngr.wait_until_finished()
    with pytest.raises(ValueError, match=r"'x' has no sharding.*opt\.init\.eval_shape\(params\)"):
      mngr.restore({"x": jax.ShapeDtypeStruct((2,), jnp.float32)})


def _quantized_state(tx, mesh):
  """(opt, params, opt_state) of ``tx`` after 2 steps on ``mesh``."""
  opt = shardopt.make_sharded_optimizer(tx, _init_params(), _param_shardings(mesh))
  params = jax.device_put(_init_params(), _param_shardings(mesh))
  state = opt.init(params)
  for i in range(2):
    grads = jax.device_put(jax.grad(_loss)(params, _batch(i)), _param_shardings(mesh))
    params, state = opt.update(grads, state, params)
  return opt, params, state


@pytest.mark.parametrize("target_tx,meaning", [
    (lambda: shardopt.adamw(1e-2, state_bits=4), "4-bit companded {}"),
    (lambda: shardopt.quantized_state(shardopt.adamw(1e-2), bits=8, code="dynamic"),
     "8-bit dynamic {}"),
], ids=["4bit", "dynamic"])
def test_quantized_codes_of_another_meaning_are_refused(tmp_path, target_tx, meaning):
  """Codes are read by what they mean, not by their shape alone: 8-bit
  companded codes restored into a 4-bit or a dynamic-code target (the same
  shapes for the dynamic code, whose book would misread them) raise
  StructureMismatchError naming each moment's codes as saved and as the
  target holds them (the 4-bit target's were shown in the saved shape)."""
  mesh = _mesh((2, 4))
  _, params, state = _quantized_state(shardopt.adamw(1e-2, state_bits=8), mesh)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(2, {"params": params, "opt_state": state})
    mngr.wait_until_finished()
    target_opt = shardopt.make_sharded_optimizer(target_tx(), _init_params(), _param_shardings(mesh))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params)
    with pytest.raises(ck.StructureMismatchError) as info:
      mngr.restore({"params": abstract, "opt_state": target_opt.init.eval_shape(abstract)})
  message = str(info.value)
  target_state = target_opt.init.eval_shape(abstract)
  for moment, sign in (("mu", "signed"), ("nu", "non-negative")):
    line = next(l for l in message.splitlines() if f"opt_state.0.{moment}.w.codes:" in l)
    saved_codes = getattr(state[0], moment)["w"].codes
    target_codes = getattr(target_state[0], moment)["w"].codes
    assert f"saved uint8{saved_codes.shape} (8-bit companded {sign} codes) vs target" in line, line
    assert line.endswith(f"target uint8{target_codes.shape} ({meaning.format(sign)} codes)"), line


def test_a_record_without_code_meanings_restores_on_shapes():
  """Steps written before codes recorded their meaning compare shapes and
  dtypes alone; a recorded meaning must equal the target's."""
  target = {"shape": [64, 8], "dtype": "uint8", "key_impl": None, "quantized": "8-bit companded signed"}
  older = {k: v for k, v in target.items() if k != "quantized"}
  other = {**target, "quantized": "8-bit dynamic signed"}
  assert ck.layout.differences({"m.codes": older}, {"m.codes": target}) == []
  assert ck.layout.differences({"m.codes": target}, {"m.codes": target}) == []
  assert ck.layout.differences({"m.codes": other}, {"m.codes": target}) == [
      ("m.codes", "saved uint8(64, 8) (8-bit dynamic signed codes) vs "
                  "target uint8(64, 8) (8-bit companded signed codes)")]


@pytest.mark.parametrize("saved_value,target_value", [
    (0.5, 0), (5, 0.0), (True, 0), (5, False)], ids=["float-int", "int-float", "bool-int", "int-bool"])
def test_python_scalars_restore_into_their_own_type_only(tmp_path, saved_value, target_value):
  """A Python scalar saved as one type is not converted into another
  (0.5 came back as 0 into an int target, 5 as True into a bool one)."""
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, {"x": saved_value, "a": jnp.ones(2)})
    mngr.wait_until_finished()
    with pytest.raises(ck.StructureMismatchError, match=(
        f"x: saved python:{type(saved_value).__name__}\\(\\) vs target python:{type(target_value).__name__}")):
      mngr.restore({"x": target_value, "a": jnp.zeros(2)})
    assert mngr.restore({"x": type(saved_value)(0), "a": jnp.zeros(2)}).state["x"] == saved_value


@pytest.mark.parametrize("step", [-1, 1.5, True, jnp.asarray(-2), jnp.asarray(2.0)],
                         ids=["negative", "fraction", "bool", "negative-array", "float-array"])
def test_a_step_that_cannot_be_listed_is_refused(tmp_path, step):
  """A negative step was written and never listed (so never restored)."""
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ValueError, match="a step is an integer >= 0"):
      mngr.save(step, {"a": jnp.ones(2)}, force=True)
    assert mngr.all_steps() == []
  assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_a_step_may_be_a_0d_integer_array(tmp_path):
  """A TrainState's ``step`` (a 0-d int32 array) is a step."""
  with ck.CheckpointManager(tmp_path) as mngr:
    assert mngr.save(jnp.asarray(3, jnp.int32), {"a": jnp.ones(2)}, force=True)
    mngr.wait_until_finished()
    assert mngr.all_steps() == [3]
    assert mngr.restore({"a": jnp.zeros(2)}).step == 3


def test_a_plain_train_state_restored_into_a_fresh_one_trains_on(tmp_path):
  """flax's TrainState.create on params placed on a mesh: tx.init's count is uncommitted and
  comes back uncommitted (committed to device 0 it could not meet the mesh's params in one
  jit); the next step equals the uninterrupted run's."""
  mesh = _mesh((2, 4))

  def fresh():
    params = jax.device_put(_init_params(), _param_shardings(mesh))
    return train_state.TrainState.create(apply_fn=None, params=params, tx=shardopt.adam(1e-2))

  state, _ = _run(fresh(), 0, 2)
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(2, state)
    mngr.wait_until_finished()
    restored = mngr.restore(fresh()).state
  assert not restored.opt_state[0].count.committed
  _assert_bit_equal(_run(restored, 2, 3), _run(state, 2, 3))


def test_numpy_scalars_restore_as_their_own_type(tmp_path):
  with ck.CheckpointManager(tmp_path) as mngr:
    mngr.save(1, {"x": np.float32(2.5), "n": np.int64(7), "a": np.ones(2, np.float32)})
    mngr.wait_until_finished()
    out = mngr.restore({"x": np.float32(0), "n": np.int64(0), "a": np.zeros(2, np.float32)}).state
  assert type(out["x"]) is np.float32 and out["x"] == 2.5
  assert type(out["n"]) is np.int64 and out["n"] == 7
  assert type(out["a"]) is np.ndarray


def test_latest_step_is_the_step_restore_reads_and_a_save_below_it_says_so(tmp_path):
  """After a rewind (steps 100 and 200 saved, 150 written with force), latest_step() is the
  step restore() reads by default in this manager and after reopening; a save below the
  largest step without force is skipped with a warning."""
  target = {"a": jnp.zeros(2)}
  with ck.CheckpointManager(tmp_path) as mngr:
    for step in (100, 200):
      mngr.save(step, {"a": jnp.full(2, float(step))})
    with pytest.warns(UserWarning, match=r"save\(150\) skipped: not above the largest step"
                      r" saved, 200; pass force=True"):
      assert not mngr.save(150, {"a": jnp.full(2, 150.0)})
    assert mngr.save(150, {"a": jnp.full(2, 150.0)}, force=True)
    with pytest.warns(UserWarning, match=r"save\(175\) skipped: not above the largest step"):
      assert not mngr.save(175, {"a": jnp.full(2, 175.0)})  # above 150, the last written
    mngr.wait_until_finished()
    assert mngr.latest_step() == mngr.restore(target).step == 200
  with ck.CheckpointManager(tmp_path) as mngr:
    assert mngr.all_steps() == [100, 150, 200]
    assert mngr.latest_step() == mngr.restore(target).step == 200


def _class_name(x) -> str:
  return f"{type(x).__module__}.{type(x).__qualname__}"


def _adam_saved(directory, mesh, tx=None):
  """A TrainState of Adam (``tx``, shardopt's by default) after 2 steps, saved at step 2."""
  state, _ = _run(_create(tx or shardopt.adam(1e-2), mesh), 0, 2)
  with ck.CheckpointManager(directory) as mngr:
    mngr.save(2, {"train": state})
    mngr.wait_until_finished()
  return state


def test_a_state_of_another_class_with_the_same_fields_is_refused_then_reinitialised_on_request(tmp_path):
  """Adam's state (count, mu, nu) restored into AdaBelief's (count, mu, nu):
  the same leaf names, shapes and dtypes, so Adam's nu was read as
  AdaBelief's. Refused naming the node and both classes, with the reinit
  advice; reinit restores the rest and a fresh AdaBelief state."""
  mesh = _mesh((2, 4))
  state = _adam_saved(tmp_path, mesh)
  fresh = _create(shardopt.adabelief(1e-2), mesh)
  assert jax.tree.structure(fresh.opt_state) != jax.tree.structure(state.opt_state)
  assert [n for n, _ in ck.layout.named_leaves(fresh)] == [n for n, _ in ck.layout.named_leaves(state)]
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.StructureMismatchError) as info:
      mngr.restore({"train": fresh})
    with pytest.raises(ck.StructureMismatchError, match=(
        r"train\.opt_state\.0: saved state class .*\.ScaleByAdamState vs target .*\.ScaleByBeliefState")):
      mngr.restore_subtree(fresh.opt_state, "train.opt_state")
    # The subtree's root is the node: it was named '<prefix>.<root>' and never compared.
    with pytest.raises(ck.StructureMismatchError, match=(
        r"train\.opt_state\.0: saved state class .*\.ScaleByAdamState vs target .*\.ScaleByBeliefState")):
      mngr.restore_subtree(fresh.opt_state[0], "train.opt_state.0")
    got = mngr.restore({"train": fresh}, optimizer_changed="reinit").state["train"]
  message = str(info.value)
  assert (f"train.opt_state.0: saved state class {_class_name(state.opt_state[0])} vs target "
          f"{_class_name(fresh.opt_state[0])}") in message
  assert "at 1 path(s)" in message and "optimizer_changed='reinit'" in message
  _assert_bit_equal(got.params, state.params)
  assert type(got.opt_state[0]) is type(fresh.opt_state[0])
  _assert_bit_equal(got.opt_state, shardopt.adabelief(1e-2).init(state.params))


def test_the_same_state_class_restores_from_optax_or_another_module(tmp_path):
  """optax's Adam state restores into shardopt's (each its own
  ScaleByAdamState, the same fields: shardopt keeps optax's names), bit for
  bit, onto another mesh."""
  state = _adam_saved(tmp_path, _mesh((2, 4)), optax.adam(1e-2))
  target = _create(shardopt.adam(1e-2), _mesh((4, 2)))
  assert _class_name(state.opt_state[0]) != _class_name(target.opt_state[0])
  with ck.CheckpointManager(tmp_path) as mngr:
    got = mngr.restore({"train": target}).state["train"]
  _assert_bit_equal(got, state)


def _rewrite_record(directory, step, edit):
  """The step's record with ``edit(record)`` applied and its digest made
  again as format 3 defines it (sha256 of the sorted JSON of the leaves,
  checksums, metadata and seed, and of the state classes where recorded)."""
  record_file = directory / str(step) / "layout" / "metadata"
  saved = edit(json.loads(record_file.read_text()))
  metadata = json.loads((directory / str(step) / "metadata" / "metadata").read_text())
  fields = {k: saved[k] for k in ("leaves", "checksums", "seed")}
  fields["metadata"] = metadata
  if "state_classes" in saved:
    fields["state_classes"] = saved["state_classes"]
  saved["digest"] = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
  record_file.write_text(json.dumps(saved))


def test_a_step_saved_before_state_classes_were_recorded_restores_unchecked(tmp_path):
  """A record without state classes (written before they were recorded)
  restores as it did; an edited class record is damage (digest mismatch)."""
  mesh = _mesh((2, 4))
  state = _adam_saved(tmp_path, mesh)
  record_file = tmp_path / "2" / "layout" / "metadata"
  assert json.loads(record_file.read_text())["state_classes"]["train.opt_state.0"] == {
      "module": type(state.opt_state[0]).__module__, "qualname": "ScaleByAdamState"}
  original = record_file.read_text()
  edited = json.loads(original)
  edited["state_classes"]["train.opt_state.0"]["qualname"] = "ScaleByBeliefState"
  record_file.write_text(json.dumps(edited))
  with ck.CheckpointManager(tmp_path) as mngr:
    with pytest.raises(ck.CorruptCheckpointError, match="digest mismatch"):
      mngr.restore({"train": _create(shardopt.adam(1e-2), mesh)})
  record_file.write_text(original)
  _rewrite_record(tmp_path, 2, lambda r: {k: v for k, v in r.items() if k != "state_classes"})
  with ck.CheckpointManager(tmp_path) as mngr:
    _assert_bit_equal(mngr.restore({"train": _create(shardopt.adam(1e-2), mesh)}).state["train"], state)
