"""The sharded step at the library boundary: grads checked against params
(once per compiled signature, naming the param), donated arrays refused with
the reason, and the README's pattern leaving the user's arrays alive."""

import re
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import partitioning
import shardopt
from shardopt.sharding import _step

SPECS = {"w": P(None, "model"), "b": P()}


def _setup():
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  shardings = partitioning.named_shardings(mesh, SPECS)
  params = {"w": jnp.ones((8, 16)), "b": jnp.zeros((16,))}
  opt = shardopt.make_sharded_optimizer(shardopt.adam(0.1), params, shardings)
  placed = jax.device_put(jax.tree.map(jnp.copy, params), shardings)
  return opt, placed, opt.init(placed)


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bfloat16])
def test_grads_of_another_dtype_are_rejected_naming_the_param(dtype):
  opt, params, state = _setup()
  grads = {"w": jnp.ones((8, 16), dtype), "b": jnp.ones((16,))}
  with pytest.raises(TypeError, match=rf"grads\['w'\] is {jnp.dtype(dtype)} "
                     r"but params\['w'\] is float32"):
    opt.update(grads, state, params)
  assert not params["w"].is_deleted()  # refused before anything ran


@pytest.mark.parametrize("grad_dtype, why", [
    (jnp.int32, "an integer or boolean gradient is not a gradient"),
    (jnp.float16, "float16 and bfloat16 differ in range and precision"),
    (jnp.float8_e4m3fn, "a lower-precision one would silently lose precision"),
    (jnp.float32, "the step keeps the params' dtypes in the state and the updates"),
    (jnp.complex64, "a complex gradient of a real param, or a real one of a complex param")])
def test_the_reason_a_grad_dtype_is_refused_fits_it(grad_dtype, why):
  """bfloat16 params: an integer, a narrower, another 16-bit and a wider gradient each get
  their own reason."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  params = {"w": jnp.ones((8, 16), jnp.bfloat16)}
  shardings = partitioning.named_shardings(mesh, {"w": P(None, "model")})
  opt = shardopt.make_sharded_optimizer(shardopt.sgd(0.1), params, shardings)
  params = jax.device_put(params, shardings)
  with pytest.raises(TypeError, match=rf"grads\['w'\] is {jnp.dtype(grad_dtype)} but params"
                     rf"\['w'\] is bfloat16: .*\({why}"):
    opt.update({"w": jnp.ones((8, 16), grad_dtype)}, opt.init(params), params)


def test_wrong_shape_names_the_param():
  opt, params, state = _setup()
  grads = {"w": jnp.ones((8, 16)), "b": jnp.ones((8,))}
  with pytest.raises(ValueError, match=r"grads\['b'\] has shape \(8,\) but "
                     r"params\['b'\] has shape \(16,\)"):
    opt.update(grads, state, params)


def test_tree_mismatch_names_the_missing_param():
  opt, params, state = _setup()
  with pytest.raises(ValueError, match=r"params\['b'\] has no gradient"):
    opt.update({"w": jnp.ones((8, 16))}, state, params)
  with pytest.raises(ValueError, match=r"grads\['extra'\] matches no param"):
    opt.update({"w": jnp.ones((8, 16)), "b": jnp.ones(16),
                "extra": jnp.ones(2)}, state, params)
  with pytest.raises(ValueError, match=re.escape(
      "grads is of type list where the params are of type dict")):
    opt.update([jnp.ones(16), jnp.ones((8, 16))], state, params)


def test_grads_are_checked_once_per_compiled_signature(monkeypatch):
  calls = []
  checked = _step.check_grads
  monkeypatch.setattr(_step, "check_grads",
                      lambda g, p: calls.append(1) or checked(g, p))
  opt, params, state = _setup()
  grads = jax.tree.map(jnp.ones_like, params)
  for _ in range(3):
    params, state = opt.update(grads, state, params)
  assert len(calls) == 1  # while tracing, not on every step


def test_a_donated_array_is_refused_with_the_reason():
  opt, params, state = _setup()
  grads = jax.tree.map(jnp.ones_like, params)
  new_params, new_state = opt.update(grads, state, params)
  with pytest.raises(RuntimeError, match=r"params\['b'\], params\['w'\]. They "
                     r"were donated to an earlier call"):
    opt.update(grads, new_state, params)
  with pytest.raises(RuntimeError, match=r"state\[0\]\.mu\['b'\]"):
    opt.update(grads, state, new_params)
  with pytest.raises(RuntimeError, match=re.escape(  # 7 deleted: 5 named
      "got deleted arrays: params['b'], params['w'], state[0].count, "
      "state[0].mu['b'], state[0].mu['w'] and 2 more. They were")):
    opt.update(grads, state, params)
  new_params, _ = opt.update(grads, new_state, new_params)  # still usable
  assert not new_params["w"].is_deleted()


def test_one_array_passed_twice_to_a_donating_step_is_refused_naming_both():
  """A donated use of an array that is also passed elsewhere (grads that
  are the params, one array at two params) crashes the process in this jax
  version; the step refuses it first, and without donation it runs."""
  opt, params, state = _setup()
  with pytest.raises(ValueError, match=re.escape(
      "opt.update: grads['b'] is the same array as params['b'], which the call donates")):
    opt.update(params, state, params)
  with pytest.raises(ValueError, match=re.escape(
      "train_step: params['w'] is the same array as params['b']")):
    tied = {"b": params["b"], "w": params["b"]}
    shardings = {"b": opt.param_shardings["b"], "w": opt.param_shardings["b"]}
    tied_opt = shardopt.make_sharded_optimizer(shardopt.adam(0.1), tied, shardings)
    tied_opt.train_step(_loss)(tied, tied_opt.init(tied), jnp.float32(1))
  assert not any(x.is_deleted() for x in jax.tree.leaves((params, state)))
  params, state = opt.update(jax.tree.map(jnp.ones_like, params), state, params)  # still usable
  kept = shardopt.make_sharded_optimizer(shardopt.adam(0.1), params, opt.param_shardings,
                                         donate=False)
  new_params, _ = kept.update(params, kept.init(params), params)
  np.testing.assert_allclose(np.asarray(new_params["w"]), np.asarray(params["w"]) - 0.1,
                             rtol=1e-6)


def test_readme_pattern_keeps_the_users_arrays():
  """Placing a copy, as the README example does, leaves the user's params
  alive (device_put alone would hand update the same buffers)."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  shardings = partitioning.named_shardings(mesh, SPECS)
  mine = jax.device_put({"w": jnp.ones((8, 16)), "b": jnp.zeros((16,))},
                        shardings)  # already placed, as after a restore
  opt = shardopt.make_sharded_optimizer(shardopt.sgd(0.5), mine, shardings)
  params = jax.device_put(jax.tree.map(jnp.copy, mine), shardings)
  state = opt.init(params)
  params, state = opt.update(jax.tree.map(jnp.ones_like, params), state,
                             params)
  assert not any(x.is_deleted() for x in jax.tree.leaves(mine))
  np.testing.assert_allclose(np.asarray(mine["w"]), 1.0)
  np.testing.assert_allclose(np.asarray(params["w"]), 0.5)
  aliased = jax.device_put(mine, shardings)  # the pitfall the copy avoids
  assert aliased["w"] is mine["w"]


def _loss(params, batch):
  return sum(jnp.sum(p * batch) for p in jax.tree.leaves(params))


def _calls(opt, params, state):
  """init, update and train_step, each given ``params`` and ``state``."""
  grads = jax.tree.map(jnp.ones_like, params)
  train_step = opt.train_step(_loss)
  return {"init": lambda: opt.init(params),
          "update": lambda: opt.update(grads, state, params),
          "train_step": lambda: train_step(params, state, jnp.float32(1))}


@pytest.mark.parametrize("call", ["init", "update", "train_step"])
def test_params_of_another_tree_name_where_they_differ(call):
  opt, params, state = _setup()
  renamed = {"w": params["w"], "c": params["b"]}
  with pytest.raises(ValueError, match=re.escape(
      "params does not have the structure this optimizer was built for: params is a dict"
      " with entries ['c'], ['w'] where the optimizer has a dict with entries ['b'], ['w']."
      " Pass params of the tree the optimizer was built for")):
    _calls(opt, renamed, state)[call]()
  assert not params["w"].is_deleted()  # refused before anything ran


@pytest.mark.parametrize("call", ["update", "train_step"])
def test_a_state_of_another_optimizer_names_where_it_differs(call):
  opt, params, state = _setup()
  momentum = shardopt.sgd(0.1, momentum=0.9).init(params)
  with pytest.raises(ValueError, match=re.escape(
      "state does not have the structure this optimizer was built for: state[0] is a"
      " TraceState with entries .trace where the optimizer has a ScaleByAdamState with entries"
      " .count, .mu, .nu. Pass the state this optimizer's init returned")):
    _calls(opt, params, momentum)[call]()
  with pytest.raises(ValueError, match=re.escape(
      "state is a tuple with entries [0] where the optimizer has a tuple with entries [0], [1]")):
    _calls(opt, params, state[:1])[call]()
  assert not state[0].mu["w"].is_deleted()


def test_a_param_spec_that_does_not_divide_its_param_is_named():
  """One bad spec used to leave every param's state replicated, with only a
  warning naming no param."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  params = {"w": jnp.ones((8, 16)), "odd": jnp.ones((3, 5))}
  shardings = {"w": jax.sharding.NamedSharding(mesh, P(None, "model")),
               "odd": jax.sharding.NamedSharding(mesh, P(None, "model"))}
  with pytest.raises(ValueError, match=re.escape(
      "params['odd'] has shape (3, 5), whose dimension 1 (5) its sharding"
      " P(None, 'model') splits into 4 parts")):
    shardopt.make_sharded_optimizer(shardopt.adam(0.1), params, shardings)


def test_params_of_other_shapes_are_named():
  opt, params, state = _setup()
  wide = {"w": jax.device_put(jnp.ones((8, 32)), opt.param_shardings["w"]), "b": params["b"]}
  with pytest.raises(ValueError, match=re.escape(
      "params['w'] has shape (8, 32); this optimizer was built for (8, 16)")):
    opt.update(jax.tree.map(jnp.ones_like, wide), state, wide)
  train_step = opt.train_step(lambda p, batch: jnp.sum(p["w"]) + jnp.sum(batch))
  with pytest.raises(ValueError, match=re.escape(
      "params['w'] has shape (8, 32); this optimizer was built for (8, 16)")):
    train_step(wide, state, jnp.zeros((8,)))


@pytest.mark.parametrize("state_bits", [None, 8])
@pytest.mark.parametrize("call", ["init", "init.eval_shape"])
def test_init_of_params_of_other_shapes_is_refused_naming_the_param(call, state_bits):
  """init traced a state of the other shapes (float state: no error; 8-bit:
  jax's pytree error on its out_shardings); it now refuses them as update
  does."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  shardings = partitioning.named_shardings(mesh, SPECS)
  params = {"w": jnp.ones((64, 256)), "b": jnp.zeros((16,))}
  opt = shardopt.make_sharded_optimizer(shardopt.adam(0.1, state_bits=state_bits), params,
                                        shardings)
  narrow = jax.device_put({"w": jnp.ones((64, 128)), "b": params["b"]}, shardings)
  init = opt.init if call == "init" else opt.init.eval_shape
  with pytest.raises(ValueError, match=re.escape(
      "params['w'] has shape (64, 128); this optimizer was built for (64, 256)")):
    init(narrow)
  mu = init(jax.device_put(params, shardings))[0].mu["w"]
  assert mu.shape == (64, 256)
  assert isinstance(mu, shardopt.QuantizedArray) == (state_bits is not None)


def test_inputs_placed_otherwise_are_named_with_the_fix():
  """jit refuses an array in another sharding or memory kind without naming
  it; the step names the tree, the leaf and both placements."""
  opt, params, state = _setup()
  mesh = opt.param_shardings["w"].mesh
  grads = {"w": jax.device_put(jnp.ones((8, 16)), jax.sharding.NamedSharding(mesh, P())),
           "b": jnp.ones((16,))}
  with pytest.raises(ValueError, match=re.escape(
      "grads['w'] is placed as P() in device memory, but this optimizer takes it as"
      " P(None, 'model') in device memory: place it so first"
      " (jax.device_put(grads, opt.param_shardings))")):
    opt.update(grads, state, params)
  on_host = shardopt.make_sharded_optimizer(
      shardopt.adam(0.1), jax.tree.map(jnp.copy, params), opt.param_shardings,
      state_memory_kind="pinned_host")
  with pytest.raises(ValueError, match=re.escape(
      "state[0].count is placed as P() in device memory, but this optimizer takes it as"
      " P() in pinned_host memory")):
    on_host.update(jax.tree.map(jnp.ones_like, params), state, params)
  with pytest.raises(ValueError, match=re.escape(
      "state[0].count is placed as P() in device memory, but this optimizer takes it as"
      " P() in pinned_host memory")):
    on_host.train_step(lambda p, batch: jnp.sum(p["w"]) + jnp.sum(batch))(
        params, state, jnp.zeros((8,)))


def test_inputs_placed_on_another_mesh_name_both_meshes():
  """The same spec on a mesh of other axis sizes: the two placements read
  alike but for their meshes, which the message names."""
  opt, params, state = _setup()
  other = partitioning.make_mesh({"data": 4, "model": 2})
  moved = jax.device_put(jax.tree.map(jnp.copy, params),
                         partitioning.named_shardings(other, SPECS))
  with pytest.raises(ValueError, match=re.escape(
      "params['w'] is placed as P(None, 'model') in device memory on the mesh (data=4,"
      " model=2) of devices [0, 1, 2, 3, 4, 5, 6, 7], but this optimizer takes it as"
      " P(None, 'model') in device memory on the mesh (data=2, model=4) of devices"
      " [0, 1, 2, 3, 4, 5, 6, 7]: place it so first")):
    opt.update(jax.tree.map(jnp.ones_like, params), state, moved)


@pytest.mark.parametrize("spec, fix", [
    (P("model", None), "drop the extra entries (P('model',) lays it out the same)"),
    (P(None, "model"), "its entries past dimension 0 ('model') split no dimension of it"),
])
def test_a_param_spec_longer_than_its_rank_is_named(spec, fix):
  """A bias (64,) given P('model', None): its state (and every other
  param's) used to be replicated, with a warning blaming tx.init."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  params = {"w": jnp.ones((256, 512)), "b": jnp.ones(64)}
  shardings = {"w": jax.sharding.NamedSharding(mesh, P(None, "model")),
               "b": jax.sharding.NamedSharding(mesh, spec)}
  expected = re.escape(f"params['b'] has shape (64,) (rank 1), but its sharding {spec} "
                       "has 2 entries (a spec has at most one per dimension): " + fix)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # raised before any state is derived
    for build in (shardopt.plan_state_shardings, shardopt.make_sharded_optimizer):
      with pytest.raises(ValueError, match=expected):
        build(shardopt.adam(0.1), params, shardings)
