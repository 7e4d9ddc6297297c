"""low_precision_params: bfloat16 params, the master weight as a correction.

Truths: a table of every bfloat16 value (its neighbours, found by sorting,
not by the module's bit arithmetic); a hand-written NumPy reference of the
split (decode, round to bfloat16, encode) around the inner transformation's
own float32 step; float32 training of the same inner transformation; bytes
read from ``addressable_shards``; a checkpoint read back on another mesh.
"""

from flax import nnx
from flax.training import train_state
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_dtypes
import numpy as np
import pytest

from benchmarks import resident
import checkpoints
import shardopt
from shardopt._src.wrappers import low_precision_params as lpp

BF16 = ml_dtypes.bfloat16


# --- the reference: every bfloat16 value, its neighbours -------------------

def _bf16_table() -> np.ndarray:
  """Every finite bfloat16 value, ascending, as float64 (one zero), and
  +-2**128, the values beyond the largest had the exponent one more."""
  values = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)
  with np.errstate(invalid="ignore"):
    values = values[np.isfinite(values)].astype(np.float64)
  return np.unique(np.concatenate([values, [-2.0**128, 2.0**128]]))


_TABLE = _bf16_table()


def _gap(param: np.ndarray, toward_zero: np.ndarray) -> np.ndarray:
  """Distance from each (finite) bfloat16 value to its neighbour, toward
  zero or away from it, from the table."""
  p = param.astype(np.float64)
  i = np.searchsorted(_TABLE, p)
  below = p - _TABLE[np.maximum(i - 1, 0)]
  above = _TABLE[np.minimum(i + 1, _TABLE.size - 1)] - p
  downward = np.where(p > 0, toward_zero, ~toward_zero)
  return np.where(downward, below, above)


def _ref_step(param, direction, bits):
  gap = _gap(param, np.sign(direction) == -np.sign(param.astype(np.float64)))
  step = gap * 2.0**-bits
  return np.where(step >= 2.0**-126, step, 0.0)  # float32 normals only


def ref_decode(param, code, bits):
  """float64 master: param + code * (2**-bits of the gap on code's side)."""
  return param.astype(np.float64) + code * _ref_step(param, code, bits)


def ref_encode(master, param, bits):
  offset = master.astype(np.float64) - param.astype(np.float64)
  step = _ref_step(param, offset, bits)
  limit = 2 ** (bits - 1) - 1
  with np.errstate(divide="ignore", invalid="ignore"):
    code = np.clip(np.round(offset / step), -limit, limit)
  return np.where(step > 0, code, 0).astype(f"int{bits}")


def _random_masters(n, seed=0):
  """float32 values over many binades, both signs."""
  rng = np.random.default_rng(seed)
  magnitude = 2.0 ** rng.uniform(-100, 100, n) * rng.uniform(1, 2, n)
  return (magnitude * rng.choice([-1, 1], n)).astype(np.float32)


# --- the codes ---------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 16])
def test_every_code_rounds_back_to_its_param(bits):
  """Over every finite value of the dtype but subnormals (below float32's
  normals, where XLA:CPU flushes to zero), the extreme and smallest codes:
  the master is exact in float32 (equal to the reference's float64) and
  rounds to the param."""
  dtype = BF16
  params = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(dtype)
  with np.errstate(invalid="ignore"):
    wide = params.astype(np.float32)
  params = params[np.isfinite(wide) & ((np.abs(wide) >= ml_dtypes.finfo(dtype).tiny)
                                       | (wide == 0))]
  limit = 2 ** (bits - 1) - 1
  for c in (-limit, -limit + 1, -1, 1, limit - 1, limit):
    code = np.full(params.shape, c, f"int{bits}")
    master = np.asarray(lpp.decode_master(jnp.asarray(params), jnp.asarray(code), bits))
    assert master.dtype == np.float32
    np.testing.assert_array_equal(master.astype(dtype).astype(np.float32),
                                  params.astype(np.float32), err_msg=f"code {c}")
    np.testing.assert_array_equal(master, ref_decode(params, code, bits))


def test_eight_bit_master_within_a_512th_of_the_gap():
  masters = _random_masters(200_000)
  params = masters.astype(BF16)
  code = np.asarray(lpp.correction_of(jnp.asarray(masters), jnp.asarray(params), 8))
  np.testing.assert_array_equal(code, ref_encode(masters, params, 8))
  got = ref_decode(params, code, 8)
  offset = masters.astype(np.float64) - params.astype(np.float64)
  gap = _gap(params, np.sign(offset) == -np.sign(params.astype(np.float64)))
  error = np.abs(got - masters)
  inner = np.abs(offset) <= 127.5 / 256 * gap
  assert np.all(error[inner] <= gap[inner] / 512)
  assert np.all(error[~inner] <= gap[~inner] / 256)
  assert 0 < np.sum(~inner) < 0.01 * masters.size


def test_sixteen_bit_master_is_the_float32_master():
  """Exact but for masters halfway between two bfloat16 values (their low
  16 bits 0x8000), which lose their last bit."""
  masters = _random_masters(200_000, seed=1)
  masters[:4] = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 3 + 2.0**-7],
                         np.float32)  # ties: rounded down, up, down, up
  params = masters.astype(BF16)
  code = lpp.correction_of(jnp.asarray(masters), jnp.asarray(params), 16)
  got = np.asarray(lpp.decode_master(jnp.asarray(params), code, 16))
  tie = (masters.view(np.uint32) & 0xFFFF) == 0x8000
  assert np.all(tie[:4])
  np.testing.assert_array_equal(got[~tie], masters[~tie])
  np.testing.assert_array_equal(got[tie], np.nextafter(masters[tie], params[tie].astype(np.float32)))


def test_tiny_params_keep_no_correction():
  """A step below float32's normals (|param| < 2**-111 at 8 bits) is not
  used: code 0, the master is the param."""
  params = np.array([2.0**-111, 2.0**-112 * 1.5, 0.0], BF16)
  masters = params.astype(np.float32) * np.float32(1 + 2**-10)
  code = np.asarray(lpp.correction_of(jnp.asarray(masters), jnp.asarray(params), 8))
  assert code[0] != 0 and code[1] == 0 and code[2] == 0


def test_non_finite_masters_get_code_zero():
  masters = jnp.array([jnp.inf, -jnp.inf, jnp.nan], jnp.float32)
  code = lpp.correction_of(masters, masters.astype(jnp.bfloat16), 8)
  assert np.all(np.asarray(code) == 0)


# --- the apply step against the reference ------------------------------------

def _tree():
  """bfloat16 params of assorted magnitudes: some near zero (they cross it),
  some exact powers of two; one float32 param (its own master)."""
  key = jax.random.key(3)
  k1, k2 = jax.random.split(key)
  return {
      "w": (0.5 * jax.random.normal(k1, (8, 16))).astype(jnp.bfloat16),
      "small": (1e-3 * jax.random.normal(k2, (32,))).astype(jnp.bfloat16),
      "pow2": jnp.array([1.0, -2.0, 0.25, 4.0, -0.5, 8.0, 1.0, 2.0], jnp.bfloat16),
      "f32": jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32),
  }


def _grads(params, step):
  keys = jax.random.split(jax.random.key(100 + step), len(params))
  return {name: (0.3 * p.astype(jnp.float32)
                 + 0.05 * jax.random.normal(k, p.shape)).astype(p.dtype)
          for k, (name, p) in zip(keys, sorted(params.items()))}


def _inner():
  return shardopt.adamw(3e-3, weight_decay=0.1)


def _reference_masters(params, state, bits):
  """Each param's float32 master by the reference's decoding."""
  masters = {}
  for name, p in jax.device_get(params).items():
    if p.dtype == np.float32:
      masters[name] = jnp.asarray(p)
    elif bits:
      code = np.asarray(state.correction[name])
      masters[name] = jnp.asarray(ref_decode(p, code, bits).astype(np.float32))
    else:
      masters[name] = jnp.asarray(p.astype(np.float32))
  return masters


def _inner_step(inner):
  """The inner transformation's own float32 step: update, then apply."""

  def step(grads, inner_state, masters):
    grads32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    inner_updates, inner_state = inner.update(grads32, inner_state, masters)
    return shardopt.apply_updates(masters, inner_updates), inner_state

  return step


@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 16, 0])
def test_params_are_the_rounded_master_after_every_step(bits):
  """12 steps, op by op. Each step, from the params and codes the wrapper
  holds: the reference decodes the master, runs the inner AdamW's own
  float32 step on it and rounds; the params equal that bit for bit, the
  codes the reference's encoding of it, the inner state the inner step's."""
  inner = _inner()
  tx = lpp.low_precision_params(inner, correction_bits=bits)
  params = _tree()
  state = tx.init(params)
  crossed = 0
  for step in range(12):
    grads = _grads(params, step)
    want, inner_state = _inner_step(inner)(
        grads, state.inner_state, _reference_masters(params, state, bits))
    want = jax.device_get(want)
    updates, new_state = tx.update(grads, state, params)
    new_params = shardopt.apply_updates(params, updates)
    for name, p in jax.device_get(new_params).items():
      np.testing.assert_array_equal(p.astype(np.float32),
                                    want[name].astype(p.dtype).astype(np.float32),
                                    err_msg=f"{name} step {step}")
      if bits and p.dtype == BF16:
        np.testing.assert_array_equal(np.asarray(new_state.correction[name]),
                                      ref_encode(want[name], p, bits))
      crossed += int(np.sum(np.sign(p.astype(np.float32))
                            != np.sign(np.asarray(params[name], np.float32))))
    for a, b in zip(jax.tree.leaves(new_state.inner_state),
                    jax.tree.leaves(inner_state)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    params, state = new_params, new_state
  assert crossed > 0  # some params crossed zero


@pytest.mark.parametrize("bits", [8, 16])
def test_jitted_params_round_their_master_over_60_steps(bits):
  """Jitted (XLA fuses the inner arithmetic as it likes, so the update's last
  float32 bits may differ from a separately compiled reference's): after
  every step each param is its master rounded, bit for bit, and the master
  is the reference's within one code step (half a step but at the ends of
  the rounding interval), two float32 roundings of it and two of the update
  (larger than the master's where a param crosses zero)."""
  inner = _inner()
  tx = lpp.low_precision_params(inner, correction_bits=bits)
  inner_step = jax.jit(_inner_step(inner))
  update = jax.jit(tx.update)
  params = _tree()
  state = tx.init(params)
  for step in range(60):
    grads = _grads(params, step)
    masters = _reference_masters(params, state, bits)
    want, _ = inner_step(grads, state.inner_state, masters)
    updates, state = update(grads, state, params)
    params = shardopt.apply_updates(params, updates)
    for name in ("w", "small", "pow2"):
      p, code = np.asarray(params[name]), np.asarray(state.correction[name])
      master = ref_decode(p, code, bits)
      np.testing.assert_array_equal(master.astype(np.float32).astype(BF16), p)
      target = np.asarray(want[name], np.float64)
      moved = np.abs(target - np.asarray(masters[name], np.float64))
      roundings = 2 * (np.spacing(np.abs(target).astype(np.float32))
                       + np.spacing(moved.astype(np.float32)))
      np.testing.assert_array_less(
          np.abs(master - target),
          _ref_step(p, target - master, bits) + roundings)


def _float32_run(steps):
  """The inner AdamW on float32 copies of the params, same gradients."""
  inner = _inner()
  params = jax.tree.map(lambda p: p.astype(jnp.float32), _tree())
  low = _tree()
  state = inner.init(params)
  for step in range(steps):
    grads = jax.tree.map(lambda g: g.astype(jnp.float32), _grads(low, step))
    updates, state = inner.update(grads, state, params)
    params = shardopt.apply_updates(params, updates)
  return params


def _masters_after(bits, steps):
  """The wrapper's masters after ``steps`` steps on gradients that do not
  depend on the params (so the float32 run sees the same ones)."""
  tx = lpp.low_precision_params(_inner(), correction_bits=bits)
  params = _tree()
  fixed = _tree()
  state = tx.init(params)
  for step in range(steps):
    updates, state = tx.update(_grads(fixed, step), state, params)
    params = shardopt.apply_updates(params, updates)
  return {name: p if p.dtype == jnp.float32 or not bits
          else lpp.decode_master(p, state.correction[name], bits)
          for name, p in params.items()}


def test_corrections_track_float32_training():
  """Op by op, 16 bits: the masters are float32 training's params bit for
  bit (jitted, within roundings:
  ``test_jitted_params_round_their_master_over_60_steps``). 8 bits: far
  closer to them than plain bfloat16 params (bits 0)."""
  steps = 30
  want = _float32_run(steps)
  exact = _masters_after(16, steps)
  for name in want:
    np.testing.assert_array_equal(np.asarray(exact[name]), np.asarray(want[name]))
  errors = {}
  for bits in (8, 0):
    got = _masters_after(bits, steps)
    errors[bits] = max(float(jnp.max(jnp.abs(got[n].astype(jnp.float32) - want[n])
                                     / (jnp.abs(want[n]) + 1e-6))) for n in ("w", "pow2"))
  assert errors[8] < errors[0] / 50, errors


def test_moves_land_exactly_unless_the_param_falls_below_2_to_minus_15():
  """apply_updates(p, move) is the target bfloat16 value for random pairs
  whose ratio |target / p| spans 2**-15 to 2**40 (both signs), and for
  targets of zero, all of at least 2**-110 in magnitude (so that their
  difference is a float32 normal: XLA:CPU flushes subnormals to zero);
  below 2**-15 some miss (the next test's case)."""
  rng = np.random.default_rng(5)
  n = 100_000
  p = (_random_masters(n, seed=2) * 2.0**-30).astype(BF16)
  ratio = 2.0 ** rng.uniform(-15, 40, n) * rng.choice([-1, 1], n)
  target = (p.astype(np.float64) * ratio).astype(np.float32).astype(BF16)
  target[:100] = 0
  wide_p, wide_target = np.abs(p.astype(np.float64)), np.abs(target.astype(np.float64))
  normal = (wide_p >= 2.0**-110) & ((wide_target >= 2.0**-110) | (wide_target == 0))
  keep = normal & ((wide_target >= 2.0**-15 * wide_p) | (wide_target == 0))
  assert keep.sum() > 0.8 * n
  move = lpp._move(jnp.asarray(p), jnp.asarray(target.astype(np.float32)))
  landed = np.asarray(shardopt.apply_updates(jnp.asarray(p), move))
  np.testing.assert_array_equal(landed[keep].astype(np.float32),
                                target[keep].astype(np.float32))
  far = (p.astype(np.float64)[:2000] * 2.0 ** -rng.uniform(16, 30, 2000))
  far = far.astype(np.float32).astype(BF16)
  move = lpp._move(jnp.asarray(p[:2000]), jnp.asarray(far.astype(np.float32)))
  landed = np.asarray(shardopt.apply_updates(jnp.asarray(p[:2000]), move))
  assert np.any(landed != far)


def test_far_fall_lands_where_apply_updates_puts_it():
  """A param crossing zero to 2**-22 of its size in one step: the rounded
  master is not reachable with a float32 update (2 + 3 * 2**-23 is not a
  float32). The param lands on what apply_updates gives, the code is taken
  against it, and the master still rounds to the param."""
  param = {"p": jnp.array([2.0], jnp.bfloat16)}
  tx = lpp.low_precision_params(shardopt.sgd(1.0), correction_bits=8)
  state = tx.init(param)._replace(correction={"p": jnp.array([-127], jnp.int8)})
  master = np.float32(lpp.decode_master(param["p"], state.correction["p"], 8)[0])
  grad = master + np.float32(3 * 2.0**-23)  # sgd(1.0): new master -3 * 2**-23
  assert master - grad == np.float32(-3 * 2.0**-23)
  updates, state = tx.update({"p": jnp.array([grad])}, state, param)
  landed = shardopt.apply_updates(param, updates)["p"]
  assert float(landed[0]) != -3 * 2.0**-23  # not the rounded master
  decoded = lpp.decode_master(landed, state.correction["p"], 8)
  assert decoded.astype(jnp.bfloat16)[0] == landed[0]


def test_bad_arguments_say_what_to_do():
  for bad in (4, 8.0, True, "8"):
    with pytest.raises(ValueError, match=f"correction_bits={bad!r}"):
      lpp.low_precision_params(_inner(), correction_bits=bad)
  tx = lpp.low_precision_params(_inner())
  state = tx.init(_tree())
  with pytest.raises(ValueError, match="needs the params"):
    tx.update(_tree(), state)
  with pytest.raises(ValueError, match=r"params\['h'\] is float16; expected bfloat16"):
    tx.init({"h": jnp.ones(3, jnp.float16)})


@pytest.mark.parametrize("built, given", [
    (jnp.bfloat16, jnp.float16), (jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float32)])
def test_params_of_another_dtype_than_init_saw_are_named(built, given):
  """update checks what init checks, and a param whose dtype changed since init (a bfloat16
  param would train with no master, silently): an error naming the param."""
  tx = lpp.low_precision_params(shardopt.adamw(1e-2))
  state = tx.init({"w": jnp.ones((4, 4), built)})
  params = {"w": jnp.ones((4, 4), given)}
  with pytest.raises(ValueError, match=r"params\['w'\] is "):
    tx.update(jax.tree.map(lambda p: 1e-3 * p, params), state, params)


@pytest.mark.parametrize("built, given", [(8, 16), (16, 8)])
def test_a_state_of_another_correction_width_is_refused(built, given):
  """A state built with one correction_bits handed to a transformation with the other: the codes
  would be read with the wrong step (8-bit codes as 16-bit moved the master of a zero-lr step from
  1.00305 to 1.00001); an error naming the param and both widths instead, the state untouched."""
  params = {"w": jnp.full((4,), 1.003, jnp.float32).astype(jnp.bfloat16)}
  state = lpp.low_precision_params(shardopt.sgd(0.0), correction_bits=built).init(params)
  tx = lpp.low_precision_params(shardopt.sgd(0.0), correction_bits=given)
  with pytest.raises(ValueError, match=rf"params\['w'\]: the state holds int{built} correction "
                     rf"codes, but this transformation has correction_bits={given}"):
    tx.update(jax.tree.map(jnp.zeros_like, params), state, params)


def test_lbfgs_loop_with_value_and_grad_from_state():
  """optax's L-BFGS loop (value_and_grad_from_state, then update with value, grad and
  value_fn) on bfloat16 params: the stored pair (the float32 master's) comes back in the dtypes
  of the loss and of the params' gradient, close to a fresh evaluation, and the loop trains."""
  target = jnp.linspace(-1, 1, 64, dtype=jnp.bfloat16).reshape(8, 8)
  loss = lambda p: jnp.sum((p["w"] - target) ** 2)
  tx = lpp.low_precision_params(shardopt.lbfgs())
  params = {"w": jnp.zeros((8, 8), jnp.bfloat16)}
  state = tx.init(params)
  value_and_grad = shardopt.value_and_grad_from_state(loss)
  for _ in range(4):
    value, grad = value_and_grad(params, state=state)
    fresh_value, fresh_grad = jax.value_and_grad(loss)(params)
    assert (value.dtype, grad["w"].dtype) == (jnp.bfloat16, jnp.bfloat16)
    np.testing.assert_allclose(np.float32(value), np.float32(fresh_value), rtol=2e-2, atol=1e-3)
    np.testing.assert_allclose(np.float32(grad["w"]), np.float32(fresh_grad["w"]), atol=2e-2)
    updates, state = tx.update(grad, state, params, value=value, grad=grad, value_fn=loss)
    params = shardopt.apply_updates(params, updates)
  assert float(loss(params)) < 1e-3 * float(loss({"w": jnp.zeros((8, 8), jnp.bfloat16)}))


# --- sharded: bytes, the sharded step, checkpoints ----------------------------

# bfloat16 matrices shaped like the LM demo's, with its 'tp' specs.
LAYOUT = {
    "embed": ((256, 64), P("model", None)),
    "query": ((64, 4, 16), P(None, "model", None)),
    "wi": ((64, 256), P(None, "model")),
    "wo": ((256, 64), P("model", None)),
    "norm": ((64,), P()),
}


def _mesh(shape=(2, 4)):
  return jax.make_mesh(shape, ("data", "model"), devices=jax.devices()[:shape[0] * shape[1]],
                       axis_types=(AxisType.Auto,) * 2)


def _sharded_params(mesh):
  keys = jax.random.split(jax.random.key(0), len(LAYOUT))
  host = {name: (0.1 * jax.random.normal(k, shape)).astype(jnp.bfloat16)
          for k, (name, (shape, _)) in zip(keys, LAYOUT.items())}
  return jax.device_put(host, _shardings(mesh))


def _shardings(mesh):
  return {name: NamedSharding(mesh, spec) for name, (_, spec) in LAYOUT.items()}


def _adamw_8bit(bits=8):
  return lpp.low_precision_params(shardopt.adamw(1e-2, weight_decay=0.1, state_bits=8),
                                  correction_bits=bits)


def _sharded_grads(params, step):
  return jax.tree.map(lambda p: (0.5 * p.astype(jnp.float32) + 0.1 * jax.random.normal(
      jax.random.key(100 + step), p.shape)).astype(p.dtype), params)


def _trained(mesh, steps=3, tx=None):
  opt = shardopt.make_sharded_optimizer(tx or _adamw_8bit(), _sharded_params(mesh),
                                        _shardings(mesh), shard_state_over="data")
  params = _sharded_params(mesh)
  state = opt.init(params)
  for step in range(steps):
    params, state = opt.update(_sharded_grads(params, step), state, params)
  return opt, params, state


@pytest.mark.slow
def test_five_bytes_per_param_zero_splits_them():
  """bfloat16 params + int8 corrections + 8-bit moments (scales included):
  at most 5.2 bytes per param; with ZeRO on data=2 x model=4, each device
  at most 1.05x its params' share plus 1/8 of all state."""
  mesh = _mesh()
  _, params, state = _trained(mesh)
  n_params = sum(int(np.prod(shape)) for shape, _ in LAYOUT.values())
  param_bytes, param_device = resident.unique_and_per_device(params)
  state_bytes, state_device = resident.unique_and_per_device(state)
  assert param_bytes == 2 * n_params
  assert (param_bytes + state_bytes) / n_params <= 5.2
  for device in param_device:
    held = param_device[device] + state_device[device]
    assert held <= 1.05 * (param_device[device] + state_bytes / 8), device
  codes = state.correction
  assert all(codes[n].dtype == jnp.int8 and codes[n].shape == params[n].shape for n in LAYOUT)
  moments = [x for x in jax.tree.leaves(state.inner_state, is_leaf=_is_q) if _is_q(x)]
  assert len(moments) == 2 * 4  # mu and nu of every matrix; the norm's stay float32


def test_quantized_state_outside_leaves_the_codes_alone():
  """quantized_state(low_precision_params(adamw)): the moments inside are
  quantized, the integer corrections kept as they are (not moments)."""
  params = jax.device_get(_sharded_params(_mesh()))
  tx = shardopt.quantized_state(lpp.low_precision_params(shardopt.adamw(1e-2)), bits=8)
  state = jax.jit(tx.init)(params)
  report = shardopt.describe_quantized_state(tx, params)
  assert not any("correction" in leaf.path for leaf in report.leaves)
  assert {leaf.stored for leaf in report.leaves if "['wi']" in leaf.path} != {"float32"}
  updates, state = jax.jit(tx.update)(_sharded_grads(params, 0), state, params)
  assert jax.tree.leaves(state)[0].dtype == jnp.int8  # correction['embed']
  assert any(_is_q(x) for x in jax.tree.leaves(state, is_leaf=_is_q))


@pytest.mark.slow
@pytest.mark.default_codegen
def test_sharded_step_equals_the_unsharded_one():
  """opt.update and opt.train_step with ZeRO on (2, 4) against the jitted
  step on one device from the same initial state (so the same blocks): the
  same params and codes after 3 steps."""
  mesh = _mesh()
  tx = _adamw_8bit()
  params = _sharded_params(mesh)
  opt = shardopt.make_sharded_optimizer(tx, params, _shardings(mesh), shard_state_over="data",
                                        donate=False)
  state = opt.init(params)
  host, host_state = jax.device_get((params, state))
  step = jax.jit(tx.update)
  train_step = opt.train_step(lambda p, batch: sum(
      jnp.sum(batch[n] * p[n].astype(jnp.float32)) for n in LAYOUT))
  through_update, through_train_step = (params, state), (params, state)
  for i in range(3):
    grads = _sharded_grads(host, i)
    updates, host_state = step(grads, host_state, host)
    host = shardopt.apply_updates(host, updates)
    through_update = opt.update(jax.device_put(grads, _shardings(mesh)), *through_update[::-1])
    batch = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    through_train_step = train_step(*through_train_step, batch)[:2]
  for got_params, got_state in (through_update, through_train_step):
    for name in LAYOUT:
      np.testing.assert_array_equal(np.asarray(got_params[name], np.float32),
                                    np.asarray(host[name], np.float32))
      np.testing.assert_array_equal(np.asarray(got_state.correction[name]),
                                    np.asarray(host_state.correction[name]))


@pytest.mark.slow
def test_checkpoint_restores_onto_another_mesh(tmp_path):
  """Params, corrections and AdamW's 8-bit moments in their default blocks
  (which fit the shards of every mesh of 8 devices), saved on (2, 4) with
  ZeRO, restored onto (4, 2) and (8, 1): nothing is re-encoded, and the next
  step there equals the next step on (2, 4) bit for bit."""
  opt, params, state = _trained(_mesh())
  with checkpoints.CheckpointManager(tmp_path) as manager:
    manager.save(3, {"params": params, "opt_state": state}, force=True)
    manager.wait_until_finished()
  grads = jax.device_get(_sharded_grads(params, 3))
  want = jax.device_get(opt.update(jax.device_put(grads, _shardings(_mesh())), state, params))
  for shape in ((4, 2), (8, 1)):
    other = _mesh(shape)
    other_opt = shardopt.make_sharded_optimizer(_adamw_8bit(), _sharded_params(other),
                                                _shardings(other), shard_state_over="data")
    target_params = jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
                                 _sharded_params(other), _shardings(other))
    target_state = jax.tree.map(lambda t, s: jax.ShapeDtypeStruct(t.shape, t.dtype, sharding=s),
                                jax.eval_shape(other_opt.init, target_params),
                                other_opt.state_shardings)
    with checkpoints.CheckpointManager(tmp_path, read_only=True) as manager:
      restored = manager.restore({"params": target_params, "opt_state": target_state})
    assert not restored.retiled
    got = restored.state
    for leaf, sharding in zip(jax.tree.leaves(got["opt_state"]),
                              jax.tree.leaves(other_opt.state_shardings)):
      assert leaf.sharding == sharding
    got = other_opt.update(jax.device_put(grads, _shardings(other)), got["opt_state"],
                           got["params"])
    for a, b in zip(jax.tree.leaves(jax.device_get(got)), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _is_q(x) -> bool:
  return isinstance(x, shardopt.QuantizedArray)


# --- Flax ---------------------------------------------------------------------

def test_flax_train_state_and_nnx_optimizer_take_the_updates_unchanged():
  """linen's TrainState.apply_gradients and nnx.Optimizer.update give the
  params of tx.update + apply_updates: the rounded masters."""
  tx = lpp.low_precision_params(shardopt.adamw(1e-2, weight_decay=0.1))
  params = {"w": (0.1 * jax.random.normal(jax.random.key(1), (64, 64))).astype(jnp.bfloat16)}
  grads = [_sharded_grads(params, i) for i in range(3)]
  want, state = params, tx.init(params)
  for g in grads:
    updates, state = tx.update(g, state, want)
    want = shardopt.apply_updates(want, updates)

  linen = train_state.TrainState.create(apply_fn=None, params=params, tx=tx)
  for g in grads:
    linen = linen.apply_gradients(grads=g)
  np.testing.assert_array_equal(np.asarray(linen.params["w"]), np.asarray(want["w"]))

  class Model(nnx.Module):

    def __init__(self):
      self.w = nnx.Param(params["w"])

  model = Model()
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  for g in grads:
    optimizer.update(model, nnx.State({"w": nnx.Param(g["w"])}))
  assert model.w[...].dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(model.w[...]), np.asarray(want["w"]))
