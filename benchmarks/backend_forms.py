"""Quantized state's per-backend forms against the other backend's, side by
side on this backend.

Three steps of quantizing and dequantizing are written twice, the same
values bit for bit, and ``jax.lax.platform_dependent`` compiles one of each
pair (XLA:CPU the first, every other backend the second):

* the block absmax: ``blocks._absmax_two_valued`` / ``_absmax_of_magnitudes``;
* 4-bit packing: ``packing._pack_by_window_sum`` / ``_pack_halves``;
* 4-bit unpacking: ``packing._unpack_concatenated`` / ``_unpack_by_shifts``
  (the dynamic family's books take the first on every backend).

Each row swaps the two forms of one step (or of all three) for the whole
update, so the other form is compiled, and times AdamW's update on one
device against the update as shardopt compiles it here and against float32
state (median over interleaved rounds of calls back to back), after
checking that the swapped update gives the same state and params bit for
bit.

Run from the repository root:  python -m benchmarks.backend_forms
(a GPU with ``JAX_PLATFORMS=cuda``). Writes
benchmarks/results/backend_forms.md (``--results`` names another).
"""

import contextlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import one_device
from benchmarks import timing
from benchmarks.variants import label
import shardopt
from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes
from shardopt._src.quantization import packing

RESULTS = (pathlib.Path(__file__).resolve().parent / "results"
           / "backend_forms.md")

# step -> (module, the XLA:CPU form's name, the other backends' form's name)
FORMS = {
    "absmax": (blocks, "_absmax_two_valued", "_absmax_of_magnitudes"),
    "pack": (packing, "_pack_by_window_sum", "_pack_halves"),
    "unpack": (packing, "_unpack_concatenated", "_unpack_by_shifts"),
}
SWAPS = {8: ("absmax",), 4: ("absmax", "pack", "unpack", "all")}


@contextlib.contextmanager
def swapped(step):
  """Each of ``step``'s two forms (every step's for ``"all"``) under the
  other's name, so the update compiles the form its backend does not."""
  steps = FORMS if step == "all" else {step: FORMS[step]}
  saved = [(m, a, b, getattr(m, a), getattr(m, b)) for m, a, b in steps.values()]
  for module, a, b, form_a, form_b in saved:
    setattr(module, a, form_b)
    setattr(module, b, form_a)
  try:
    yield
  finally:
    for module, a, b, form_a, form_b in saved:
      setattr(module, a, form_a)
      setattr(module, b, form_b)


def _state_after(opt, params, grads, steps=2):
  """(params, state) after ``steps`` updates from a fresh state (compiles
  the update under whatever forms are in place)."""
  own = jax.tree.map(jnp.copy, params)
  state = opt.init(own)
  for _ in range(steps):
    own, state = opt.update(grads, state, own)
  return own, state


def _same(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def measure(args):
  params, grads, shardings = one_device.problem(args)
  layouts, rows, reference = {}, [], {}
  cases = [(None, None)] + [((bits, code), step) for bits in (8, 4)
                            for code in codes.CODES
                            for step in (None,) + SWAPS[bits]]
  for variant, step in cases:
    tx = one_device.optimizer(variant)
    opt = shardopt.make_sharded_optimizer(tx, params, shardings)
    with swapped(step) if step else contextlib.nullcontext():
      own, state = _state_after(opt, params, grads)
    same = _same((own, state), reference.setdefault(variant, (own, state)))
    layouts[(variant, step)] = (opt, own, state)
    rows.append([variant, step, same])
  times = timing.interleaved(
      {None if k == (None, None) else k: v for k, v in layouts.items()},
      grads, rounds=args.rounds, steps=args.steps, wait_each=False)
  out = []
  for variant, step, same in rows:
    key = None if variant is None else (variant, step)
    seconds, ratio = times[key]
    own_seconds = times[(variant, None)][0] if variant else seconds
    form = "as compiled here" if step is None else f"{step} swapped"
    out.append(f"| {label(variant)} | {form if variant else '-'} |"
               f" {'yes' if same else 'NO'} | {seconds * 1e3:.3f} |"
               f" {ratio:.2f}x | {seconds / own_seconds:.2f}x |")
    print(out[-1], flush=True)
  return out


def main(argv=None) -> None:
  args, command = one_device.parse_arguments(
      "benchmarks.backend_forms", __doc__.splitlines()[0], RESULTS,
      rounds=7, steps=10, argv=argv)
  rows = measure(args)
  args.results.parent.mkdir(parents=True, exist_ok=True)
  args.results.write_text("\n".join([
      "# Quantized state's per-backend forms, side by side",
      "",
      one_device.command_line(command),
      "",
      (f"{args.leaves} float32 matrices of {args.rows} x {args.cols};"
       " AdamW's update (`benchmarks.update_bandwidth`'s) through"
       " `make_sharded_optimizer` on a one-device mesh, params and state"
       " donated. Form: the update as shardopt compiles it on this backend,"
       " or with the two forms of one step swapped (see the module's"
       " docstring), so the other backend's form is compiled here. Same: the"
       " state and params after 2 updates equal, bit for bit, those of the"
       " update as compiled here. Times: the median over"
       f" {args.rounds} interleaved rounds of {args.steps} calls back to back,"
       " waited for after the last; vs float32 and vs as compiled here: the"
       " median over rounds of the time over float32's in the same round,"
       " and the median time over the as-compiled update's median."),
      "",
      "| state | form | same | step time (ms) | vs float32 | vs as compiled here |",
      "|---|---|---|---|---|---|",
      *rows,
      "",
  ]))
  print(f"wrote {args.results}")


if __name__ == "__main__":
  main()
