"""The AdamW update against the device's copy bandwidth: float32 state
against 8-bit and 4-bit ``shardopt.quantized_state`` on one device.

A tree of ``--leaves`` float32 matrices of ``--rows`` x ``--cols``, on the
first device (a GPU with ``JAX_PLATFORMS=cuda``):

* copy bandwidth: ``x + 1`` on a float32 array as large as all the params,
  bytes read plus bytes written over its time;
* per state variant, AdamW's update through ``make_sharded_optimizer``
  (params and state donated, timed in interleaved rounds of calls back to
  back, so the device's time, not the host's dispatch): its median time,
  its time over float32's in the same round, and the fewest bytes it must
  move (gradients read, params and state each read and written once) over
  its time, as a fraction of the copy bandwidth.

Run from the repository root:  python -m benchmarks.update_bandwidth
Writes benchmarks/results/update_bandwidth.md (``--results`` names another).
"""

import pathlib
import statistics
import time

import jax
import jax.numpy as jnp

from benchmarks import one_device
from benchmarks import resident
from benchmarks import timing
from benchmarks.variants import VARIANTS
from benchmarks.variants import label
import shardopt

RESULTS = (pathlib.Path(__file__).resolve().parent / "results"
           / "update_bandwidth.md")


def copy_bandwidth(n_elements: int, rounds: int, steps: int) -> float:
  """Bytes per second of ``x + 1`` over ``n_elements`` float32 values
  (``steps`` back to back, donated, waited for after the last; the median
  of ``rounds``), counting the bytes read and the bytes written."""
  add_one = jax.jit(lambda x: x + 1.0, donate_argnums=0)
  x = jax.block_until_ready(add_one(jnp.ones((n_elements,), jnp.float32)))
  seconds = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      x = add_one(x)
    jax.block_until_ready(x)
    seconds.append((time.perf_counter() - start) / steps)
  return 2 * x.nbytes / statistics.median(seconds)


def _fusions(opt, grads, state, params) -> int:
  return one_device.fusions(
      opt.update.lower(grads, state, params).compile().as_text())


def measure(args):
  """(rows of the table, copy bandwidth in bytes per second, params)."""
  params, grads, shardings = one_device.problem(args)
  param_bytes = sum(p.nbytes for p in jax.tree.leaves(params))
  layouts, traffic, kernels = {}, {}, {}
  for variant in VARIANTS:
    opt = shardopt.make_sharded_optimizer(one_device.optimizer(variant),
                                          params, shardings)
    own = jax.tree.map(jnp.copy, params)
    state = opt.init(own)
    state_bytes, _ = resident.unique_and_per_device(state)
    traffic[variant] = (3 * param_bytes + 2 * state_bytes, state_bytes)
    kernels[variant] = _fusions(opt, grads, state, own)
    layouts[variant] = (opt, own, state)
  bandwidth = copy_bandwidth(param_bytes // 4, args.rounds, args.steps)
  times = timing.interleaved(layouts, grads, rounds=args.rounds,
                             steps=args.steps, wait_each=False)
  rows = []
  n_params = param_bytes // 4
  for variant in VARIANTS:
    seconds, ratio = times[variant]
    moved, state_bytes = traffic[variant]
    rows.append(
        f"| {label(variant)} | {state_bytes / n_params:.3f} | {moved / 2**30:.3f} |"
        f" {kernels[variant]} | {seconds * 1e3:.3f} | {ratio:.2f}x |"
        f" {moved / seconds / 1e9:,.0f} | {moved / seconds / bandwidth:.1%} |")
    print(rows[-1], flush=True)
  return rows, bandwidth, n_params


def main(argv=None) -> None:
  args, command = one_device.parse_arguments(
      "benchmarks.update_bandwidth", __doc__.splitlines()[0], RESULTS,
      rounds=10, steps=20, argv=argv)
  rows, bandwidth, n_params = measure(args)
  args.results.parent.mkdir(parents=True, exist_ok=True)
  args.results.write_text("\n".join([
      "# AdamW update against the device's copy bandwidth",
      "",
      one_device.command_line(command),
      "",
      (f"{args.leaves} float32 matrices of {args.rows} x {args.cols} ({n_params:,}"
       " params). `shardopt.adamw(1e-3, weight_decay=1e-4)`, alone (float32"
       " state) or in `shardopt.quantized_state(tx, bits, code=code)` with its"
       " default block sizes, through `make_sharded_optimizer` on a one-device"
       " mesh (params and state donated). Copy bandwidth: `x + 1` on"
       f" {n_params:,} float32 values (donated), bytes read plus written over"
       f" its time: {bandwidth / 1e9:,.0f} GB/s."),
      "",
      ("Fewest bytes moved: the gradients read once, the params and the state"
       " each read once and written once. Times (the copy's too): the median"
       f" over {args.rounds} interleaved rounds of {args.steps} calls back to"
       " back, waited for after the last (the device's time per call, the"
       " host's dispatch overlapped); vs float32: the median over rounds of its"
       " time over float32's in the same round. Kernels: XLA fusions in the"
       " compiled update. Fraction: the fewest bytes over the step time, over"
       " the copy bandwidth."),
      "",
      ("| state | state bytes / param | fewest bytes moved (GiB) | kernels |"
       " step time (ms) | vs float32 | GB/s | fraction of copy bandwidth |"),
      "|---|---|---|---|---|---|---|---|",
      *rows,
      "",
  ]))
  print(f"copy bandwidth {bandwidth / 1e9:,.0f} GB/s; wrote {args.results}")


if __name__ == "__main__":
  main()
