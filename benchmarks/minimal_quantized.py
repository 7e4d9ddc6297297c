"""A block-wise quantized AdamW update on XLA:CPU: shardopt's and minimal forms.

The aim for quantized state on CPU is an update of at most 1.5x (8 bits)
and 1.3x (4 bits) the float32 update's time. This benchmark asks what the
compiler allows: side by side in one process, on one device, shardopt's
AdamW with float32 state and with ``quantized_state`` (8 and 4 bits,
companded codes), against AdamW written directly in ``jax.numpy`` with the
cheapest block-wise codes that keep its update (blocks along each matrix's
last dimension as long as shardopt's defaults, 256 elements at 8 bits and
128 at 4; absmax scales):

* ``minimal float32``: the same AdamW on float32 state, to show what the
  hand-written step costs against shardopt's;
* ``minimal 8-bit``: the first moment as ``round(127 m / absmax)`` in an
  ``int8``, the second as ``round(255 sqrt(v / max))`` in a ``uint8``;
* ``minimal 4-bit``: the first moment as ``round(7 m / absmax) + 8``, the
  second as the power of two nearest ``v / max`` (``2**-15`` to 1), two
  codes of one moment per byte (a block's two halves share its bytes);
* ``minimal 4-bit, one byte per element``: the same codes, the first
  moment's in the low half of a byte and the second's in the high half, so
  that no code changes shape between the moments and their bytes;
* ``minimal 4-bit, scales bounded from ...``: one byte per element, but
  each block's new scales are bounds known before its moments are updated:
  AdamW's recurrence applied to a bound on the stored values and to the
  gradient's block absmax (``b1 * bound + (1 - b1) * absmax(g)``, and
  ``b2 * bound + (1 - b2) * absmax(g)**2``), so no new moment exceeds its
  scale and no block is reduced after the update. ``the last scales``
  bounds the stored values by their scales (no pass over the codes; the
  scale drifts loose where the gradients' signs vary, and with it the
  error); ``the stored maxima`` reads each block's largest stored values
  from its bytes (a reduction over one byte per element, and a tight
  bound).

The params are updated in their own shape (a blocked view of the params
returned as the new params makes XLA copy them at every call).

Freed memory is kept (``timing.keep_freed_memory``, as a pooling allocator
would), so no update pays for fresh pages of its temporaries at each call.
Each minimal form runs ``CHECK_STEPS`` steps from zero state beside the
float32 one, on gradients with fresh noise at each step (a constant
gradient would make the bounded scales exact), and reports the mean
relative error of the params' move against it, so the times are those of
a working AdamW.

Run from the repository root:
  python -m benchmarks.minimal_quantized --leaves 16 --rows 256 --cols 1024
Writes benchmarks/results/minimal_quantized.md (``--results`` names another).
"""

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import one_device
from benchmarks import timing
from benchmarks.variants import label
import shardopt

RESULTS = (pathlib.Path(__file__).resolve().parent / "results"
           / "minimal_quantized.md")
LR, B1, B2, EPS, WEIGHT_DECAY = 1e-3, 0.9, 0.999, 1e-8, 1e-4
CHECK_STEPS = 20
CHECK_NOISE = 3.0  # the noise's scale, in units of the gradient's


def _moments(g, m, v):
  """AdamW's moments after one step from float ``m``, ``v``."""
  return B1 * m + (1 - B1) * g, B2 * v + (1 - B2) * g * g


def _adamw(p, m, v, count):
  """The params after AdamW's step with the updated moments ``m``, ``v``
  (blocked or not: the move takes the params' shape)."""
  t = count.astype(jnp.float32)
  m_hat, v_hat = m / (1 - B1 ** t), v / (1 - B2 ** t)
  move = (m_hat / (jnp.sqrt(v_hat) + EPS)).reshape(p.shape)
  return p - LR * (move + WEIGHT_DECAY * p)


def _blocks(x, block):
  return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _absmax(x):
  return jnp.max(jnp.abs(x), axis=-1, keepdims=True)


def _safe(scale):
  return jnp.where(scale > 0, scale, 1.0)


def _pow2_code(v, vmax):
  """``v / vmax`` rounded to its nearest power of two, ``2**-15`` to 1, as
  the exponent's distance below 1 (float32 bits: exact integer work)."""
  bits = jax.lax.bitcast_convert_type(v / _safe(vmax), jnp.int32)
  return jnp.clip(((bits + (1 << 22)) >> 23) - 112, 0, 15)


def _pow2_value(code, vmax):
  return jax.lax.bitcast_convert_type((code + 112) << 23, jnp.float32) * vmax


def _halves(codes):
  """Two 4-bit codes per byte: a block's first half low, its second high."""
  half = codes.shape[-1] // 2
  return (codes[..., :half] | (codes[..., half:] << 4)).astype(jnp.uint8)


def _unhalve(packed):
  return jnp.concatenate([packed & 15, packed >> 4], axis=-1).astype(jnp.int32)


def _float32_step(p, g, state, count, block):
  del block
  m, v = _moments(g, *state)
  return _adamw(p, m, v, count), (m, v)


def _eight_bit_step(p, g, state, count, block):
  (mc, ms), (vc, vs) = state
  m = mc.astype(jnp.float32) * (ms / 127)
  v = jnp.square(vc.astype(jnp.float32) / 255) * vs
  m, v = _moments(_blocks(g, block), m, v)
  ms, vs = _absmax(m), jnp.max(v, axis=-1, keepdims=True)
  mc = jnp.round(m * (127 / _safe(ms))).astype(jnp.int8)
  vc = jnp.round(jnp.sqrt(v / _safe(vs)) * 255).astype(jnp.uint8)
  return _adamw(p, m, v, count), ((mc, ms), (vc, vs))


def _four_bit_step(p, g, state, count, block):
  (mc, ms), (vc, vs) = state
  m = (_unhalve(mc) - 8).astype(jnp.float32) * (ms / 7)
  v = _pow2_value(_unhalve(vc), vs)
  m, v = _moments(_blocks(g, block), m, v)
  ms, vs = _absmax(m), jnp.max(v, axis=-1, keepdims=True)
  mc = _halves(jnp.round(m * (7 / _safe(ms))).astype(jnp.int32) + 8)
  vc = _halves(_pow2_code(v, vs))
  return _adamw(p, m, v, count), ((mc, ms), (vc, vs))


def _joint_decode(codes, ms, vs):
  codes = codes.astype(jnp.int32)
  return (((codes & 15) - 8).astype(jnp.float32) * (ms / 7),
          _pow2_value(codes >> 4, vs))


def _joint_encode(m, v, ms, vs):
  m_code = jnp.clip(jnp.round(m * (7 / _safe(ms))), -7, 7).astype(jnp.int32)
  return ((m_code + 8) | (_pow2_code(v, vs) << 4)).astype(jnp.uint8)


def _four_bit_joint_step(p, g, state, count, block):
  codes, ms, vs = state
  m, v = _moments(_blocks(g, block), *_joint_decode(codes, ms, vs))
  ms, vs = _absmax(m), jnp.max(v, axis=-1, keepdims=True)
  return _adamw(p, m, v, count), (_joint_encode(m, v, ms, vs), ms, vs)


def _last_scales(codes, m_scale, v_scale):
  """Each block's stored values bounded by its scales (no pass over the
  codes)."""
  del codes
  return m_scale, v_scale


def _stored_maxima(codes, m_scale, v_scale):
  """Each block's largest stored ``|m|`` and ``v``, read from its bytes (the
  second moment's code is the high half: the largest byte holds it)."""
  m_low = codes & 15
  m_code = jnp.maximum(jnp.max(m_low, axis=-1, keepdims=True).astype(jnp.int32) - 8,
                       8 - jnp.min(m_low, axis=-1, keepdims=True).astype(jnp.int32))
  v_code = (jnp.max(codes, axis=-1, keepdims=True) >> 4).astype(jnp.int32)
  return m_code.astype(jnp.float32) * (m_scale / 7), _pow2_value(v_code, v_scale)


def _bounded_step(stored_bound):
  """The one-byte 4-bit step with each block's new scales bounded before
  its moments are updated: the moments' recurrence applied to a bound on
  the stored values (``stored_bound``) and to the gradient's absmax."""
  def step(p, g, state, count, block):
    codes, ms, vs = state
    g = _blocks(g, block)
    m, v = _moments(g, *_joint_decode(codes, ms, vs))
    ms, vs = _moments(_absmax(g), *stored_bound(codes, ms, vs))
    return _adamw(p, m, v, count), (_joint_encode(m, v, ms, vs), ms, vs)
  return step


def _zero_state(form, p, block):
  if form is _float32_step:
    return jnp.zeros_like(p), jnp.zeros_like(p)
  blocked = (*p.shape[:-1], p.shape[-1] // block, block)
  scales = lambda: jnp.zeros((*blocked[:-1], 1), jnp.float32)  # one per leaf
  if form is _eight_bit_step:
    return ((jnp.zeros(blocked, jnp.int8), scales()),
            (jnp.zeros(blocked, jnp.uint8), scales()))
  if form is _four_bit_step:
    half = (*blocked[:-1], block // 2)
    return ((jnp.full(half, 0x88, jnp.uint8), scales()),
            (jnp.zeros(half, jnp.uint8), scales()))
  # One byte per element: the joint and the bounded forms.
  return jnp.full(blocked, 0x08, jnp.uint8), scales(), scales()


# name -> (step, block length)
MINIMAL = {
    "minimal float32": (_float32_step, 1),
    "minimal 8-bit": (_eight_bit_step, 256),
    "minimal 4-bit": (_four_bit_step, 128),
    "minimal 4-bit, one byte per element": (_four_bit_joint_step, 128),
    "minimal 4-bit, scales bounded from the last scales":
        (_bounded_step(_last_scales), 128),
    "minimal 4-bit, scales bounded from the stored maxima":
        (_bounded_step(_stored_maxima), 128),
}


class _Minimal:
  """A minimal form as ``update(grads, state, params) -> (params, state)``
  (``benchmarks.timing``'s interface), jitted, params and state donated;
  its state carries the step count."""

  def __init__(self, form, block):
    def step(params, grads, state):
      count, leaves = state
      count = count + 1
      out = {k: form(params[k], grads[k], leaves[k], count, block)
             for k in params}
      return ({k: o[0] for k, o in out.items()},
              (count, {k: o[1] for k, o in out.items()}))
    self._step = jax.jit(step, donate_argnums=(0, 2))
    self.form, self.block = form, block

  def init(self, params):
    return (jnp.zeros((), jnp.int32),
            {k: _zero_state(self.form, p, self.block) for k, p in params.items()})

  def update(self, grads, state, params):
    return self._step(params, grads, state)

  def compiled_text(self, grads, state, params):
    return self._step.lower(params, grads, state).compile().as_text()


def _check_gradients(grads):
  """``CHECK_STEPS`` trees of ``grads`` plus fresh normal noise,
  ``CHECK_NOISE`` times each leaf's standard deviation, one per step."""
  leaves, treedef = jax.tree.flatten(grads)

  def noisy(step):
    keys = jax.random.split(jax.random.fold_in(jax.random.key(7), step),
                            len(leaves))
    return jax.tree.unflatten(treedef, [
        g + CHECK_NOISE * jnp.std(g) * jax.random.normal(k, g.shape, g.dtype)
        for g, k in zip(leaves, keys)])

  return [noisy(step) for step in range(CHECK_STEPS)]


def _moves(opt, params, gradients):
  """The params' moves over one update per tree of ``gradients``
  (``_check_gradients``) from fresh state."""
  own = jax.tree.map(jnp.copy, params)
  state, moves = opt.init(own), []
  for grads in gradients:
    before = jax.tree.map(np.asarray, own)
    own, state = opt.update(grads, state, own)
    moves.append(jax.tree.map(lambda a, b: np.asarray(a) - b, own, before))
  return moves


def _move_error(moves, reference) -> float:
  """The largest over steps of the mean relative error of the moves."""
  return max(
      float(np.mean([np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in
                     zip(jax.tree.leaves(m), jax.tree.leaves(r))]))
      for m, r in zip(moves, reference))


def _shardopt_variants(params, shardings):
  out = {}
  for variant in (None, (8, "companded"), (4, "companded")):
    out[f"shardopt {label(variant)}"] = shardopt.make_sharded_optimizer(
        one_device.optimizer(variant), params, shardings)
  return out


def _processor() -> str:
  """The CPU's model and core count, as the OS reports them."""
  cpuinfo = pathlib.Path("/proc/cpuinfo")
  names = re.findall(r"model name\s*:\s*(.+)",
                     cpuinfo.read_text() if cpuinfo.exists() else "")
  return (f"{names[0].strip()}, {len(names)} cores" if names
          else "CPU model not reported by the OS")


def measure(args):
  params, grads, shardings = one_device.problem(args)
  optimizers = _shardopt_variants(params, shardings)
  optimizers.update({name: _Minimal(form, block)
                     for name, (form, block) in MINIMAL.items()})
  gradients = _check_gradients(grads)
  reference = _moves(optimizers["shardopt float32"], params, gradients)
  layouts, errors, kernels = {}, {}, {}
  for name, opt in optimizers.items():
    errors[name] = _move_error(_moves(opt, params, gradients), reference)
    own = jax.tree.map(jnp.copy, params)
    state = opt.init(own)
    text = (opt.compiled_text(grads, state, own) if isinstance(opt, _Minimal)
            else opt.update.lower(grads, state, own).compile().as_text())
    kernels[name] = one_device.fusions(text)
    layouts[None if name == "shardopt float32" else name] = (opt, own, state)
  times = timing.interleaved(layouts, grads, rounds=args.rounds,
                             steps=args.steps, wait_each=False)
  rows = []
  for name in optimizers:
    seconds, ratio = times[None if name == "shardopt float32" else name]
    rows.append(f"| {name} | {errors[name]:.4f} | {kernels[name]} |"
                f" {seconds * 1e3:.3f} | {ratio:.2f}x |")
    print(rows[-1], flush=True)
  return rows


def write_results(path: pathlib.Path, command: str, args, rows) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("\n".join([
      "# " + __doc__.splitlines()[0].rstrip("."), "",
      one_device.command_line(command) + f" {_processor()}.", "",
      f"{args.leaves} float32 matrices of {args.rows} x {args.cols} on one"
      f" device; AdamW (lr {LR}, weight decay {WEIGHT_DECAY}), params and"
      " state donated. shardopt's through `make_sharded_optimizer` on a"
      " one-device mesh (`quantized_state` with its default blocks: 256 at 8"
      " bits, 128 at 4); the minimal forms (see the module's docstring) in"
      " blocks of as many along the last dimension, jitted directly."
      f" Move error: the largest over {CHECK_STEPS} steps from zero state of"
      " the mean over leaves of |move - float32 move| / |float32 move|"
      " (shardopt's float32 the reference), the gradients with fresh normal"
      f" noise of {CHECK_NOISE:g} times their standard deviation at each"
      " step. Kernels: fusions in the compiled"
      " update. Times: the median over"
      f" {args.rounds} interleaved rounds of {args.steps} calls back to back,"
      " waited for after the last, freed memory kept (`timing.keep_freed_memory`);"
      " vs float32: the median over rounds of the time over shardopt float32's"
      " in the same round.", "",
      "| update | move error | kernels | step time (ms) | vs float32 |",
      "|---|---|---|---|---|", *rows, ""]))


def main(argv=None) -> None:
  args, command = one_device.parse_arguments(
      "benchmarks.minimal_quantized", __doc__.splitlines()[0], RESULTS,
      rounds=15, steps=10, argv=argv)
  timing.keep_freed_memory()
  write_results(args.results, command, args, measure(args))


if __name__ == "__main__":
  main()
