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
  that no code changes shape between the moments and their bytes.

Freed memory is kept (``timing.keep_freed_memory``, as a pooling allocator
would), so no update pays for fresh pages of its temporaries at each call.
Each minimal form runs 5 steps from zero state beside the float32 one and
reports the mean relative error of the params' move against it, so the
times are those of a working AdamW.

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
CHECK_STEPS = 5


def _adamw(p, g, m, v, count):
  """(params, m, v) after one AdamW step from float ``m``, ``v``."""
  m = B1 * m + (1 - B1) * g
  v = B2 * v + (1 - B2) * g * g
  t = count.astype(jnp.float32)
  m_hat, v_hat = m / (1 - B1 ** t), v / (1 - B2 ** t)
  return p - LR * (m_hat / (jnp.sqrt(v_hat) + EPS) + WEIGHT_DECAY * p), m, v


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
  p, m, v = _adamw(p, g, *state, count)
  return p, (m, v)


def _eight_bit_step(p, g, state, count, block):
  (mc, ms), (vc, vs) = state
  m = mc.astype(jnp.float32) * (ms / 127)
  v = jnp.square(vc.astype(jnp.float32) / 255) * vs
  p, m, v = _adamw(_blocks(p, block), _blocks(g, block), m, v, count)
  ms, vs = _absmax(m), jnp.max(v, axis=-1, keepdims=True)
  mc = jnp.round(m * (127 / _safe(ms))).astype(jnp.int8)
  vc = jnp.round(jnp.sqrt(v / _safe(vs)) * 255).astype(jnp.uint8)
  return p.reshape(g.shape), ((mc, ms), (vc, vs))


def _four_bit_step(p, g, state, count, block):
  (mc, ms), (vc, vs) = state
  m = (_unhalve(mc) - 8).astype(jnp.float32) * (ms / 7)
  v = _pow2_value(_unhalve(vc), vs)
  p, m, v = _adamw(_blocks(p, block), _blocks(g, block), m, v, count)
  ms, vs = _absmax(m), jnp.max(v, axis=-1, keepdims=True)
  mc = _halves(jnp.round(m * (7 / _safe(ms))).astype(jnp.int32) + 8)
  vc = _halves(_pow2_code(v, vs))
  return p.reshape(g.shape), ((mc, ms), (vc, vs))


def _four_bit_joint_step(p, g, state, count, block):
  codes, ms, vs = state
  codes = codes.astype(jnp.int32)
  m = ((codes & 15) - 8).astype(jnp.float32) * (ms / 7)
  v = _pow2_value(codes >> 4, vs)
  p, m, v = _adamw(_blocks(p, block), _blocks(g, block), m, v, count)
  ms, vs = _absmax(m), jnp.max(v, axis=-1, keepdims=True)
  m_code = jnp.round(m * (7 / _safe(ms))).astype(jnp.int32) + 8
  codes = (m_code | (_pow2_code(v, vs) << 4)).astype(jnp.uint8)
  return p.reshape(g.shape), (codes, ms, vs)


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
  return jnp.full(blocked, 0x08, jnp.uint8), scales(), scales()


# name -> (step, block length)
MINIMAL = {
    "minimal float32": (_float32_step, 1),
    "minimal 8-bit": (_eight_bit_step, 256),
    "minimal 4-bit": (_four_bit_step, 128),
    "minimal 4-bit, one byte per element": (_four_bit_joint_step, 128),
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


def _moves(opt, params, grads):
  """The params' moves over ``CHECK_STEPS`` updates from fresh state."""
  own = jax.tree.map(jnp.copy, params)
  state, moves = opt.init(own), []
  for _ in range(CHECK_STEPS):
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
  reference = _moves(optimizers["shardopt float32"], params, grads)
  layouts, errors, kernels = {}, {}, {}
  for name, opt in optimizers.items():
    errors[name] = _move_error(_moves(opt, params, grads), reference)
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
      " (shardopt's float32 the reference). Kernels: fusions in the compiled"
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
