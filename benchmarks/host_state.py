"""Optimizer state in host memory against state in device memory.

``make_sharded_optimizer(..., state_memory_kind="pinned_host")`` against the
default, for AdamW with float32 and with 8-bit moments, on the LM trees of
``benchmarks/quantized_state.py`` ('tp' rules, data=2 x model=4, ZeRO over
data): seconds per donated ``opt.update`` (median of interleaved rounds, the
two placements side by side in one process), the bytes a step moves each way
(the state's bytes per device from ``addressable_shards``) and what
``memory_analysis()`` of the compiled update reports. On CPU the memory
kinds exist but are the same RAM, so the ratio measures what the transfers
cost there, and ``memory_analysis()`` reports no host part.

Run from the repository root:  python -m benchmarks.host_state
Writes benchmarks/results/host_state.md.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse
import collections
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import resident
from benchmarks import timing
from benchmarks.quantized_state import DEMO, WIDE, lm_setup
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "host_state.md"
PLACEMENTS = {"device": None, "pinned_host": "pinned_host"}


def _optimizer(setup, bits, memory_kind):
  _, _, shapes, shardings, _ = setup
  return shardopt.make_sharded_optimizer(shardopt.adamw(1e-3, state_bits=bits), shapes,
                                         shardings, shard_state_over="data",
                                         state_memory_kind=memory_kind)


def _per_device_bytes(state) -> int:
  return max(resident.unique_and_per_device(state)[1].values())


def measure(setup, bits, rounds, steps):
  """Per placement: (seconds per update, state bytes on the fullest device,
  the compiled update: memory_analysis, count of its instructions by
  opcode)."""
  init = setup[-1]
  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), init(jax.random.key(1)))
  live, compiled, held = {}, {}, {}
  for name, kind in PLACEMENTS.items():
    opt = _optimizer(setup, bits, kind)
    params = init(jax.random.key(0))
    state = opt.init(params)
    compiled[name] = opt.update.lower(grads, state, params).compile()
    held[name] = _per_device_bytes(state)
    live[name] = [opt, params, state]
  times = collections.defaultdict(list)
  for i in range(rounds):
    for name in list(PLACEMENTS)[::1 if i % 2 else -1]:  # each first in turn
      opt, params, state = live[name]
      seconds, params, state = timing.seconds_per_update(opt, grads, params, state, steps)
      times[name].append(seconds)
      live[name][1:] = [params, state]
  assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(live["pinned_host"][2])} == {
      "pinned_host"}
  return {name: (float(np.median(times[name])), held[name],
                 compiled[name].memory_analysis(), _opcodes(compiled[name].as_text()))
          for name in PLACEMENTS}


def _opcodes(hlo: str) -> collections.Counter:
  return collections.Counter(re.findall(r"= \S+ ([a-z][a-z-]*)\(", hlo))


def _ops(counts) -> str:
  names = ("fusion", "copy", "copy-start", "copy-done", "custom-call")
  return ", ".join(f"{counts[n]} {n}" for n in names if counts[n])


def _mib(n) -> str:
  return f"{n / 2**20:.2f}"


def rows_for(tree, setup, rounds, steps):
  n_params = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(setup[2]))
  rows, moved = [], {}
  for bits in (None, 8):
    result = measure(setup, bits, rounds, steps)
    device_time = result["device"][0]
    moved[bits] = result["pinned_host"][1]
    for name, (seconds, held, m, ops) in result.items():
      rows.append(
          f"| {tree} ({n_params:,}) | {'float32' if bits is None else '8-bit'} | {name} |"
          f" {seconds * 1e3:.2f} ms ({seconds / device_time:.2f}x) | {_mib(held)} |"
          f" {_mib(m.argument_size_in_bytes)} / {_mib(m.temp_size_in_bytes)} |"
          f" {_mib(m.host_argument_size_in_bytes)} / {_mib(m.host_temp_size_in_bytes)} |"
          f" {_ops(ops)} |")
      print(rows[-1], flush=True)
  return rows, moved[8] / moved[None]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=7)
  parser.add_argument("--steps", type=int, default=10)
  args = parser.parse_args(argv)
  command = "python -m benchmarks.host_state " + " ".join(sys.argv[1:] if argv is None else argv)
  rows, ratios = [], {}
  for tree, config in (("demo", DEMO), ("wide", WIDE)):
    tree_rows, ratios[tree] = rows_for(tree, lm_setup(config), args.rounds, args.steps)
    rows += tree_rows
  RESULTS.parent.mkdir(exist_ok=True)
  RESULTS.write_text("\n".join([
      "# Optimizer state in host memory against device memory",
      "",
      (f"Command: `{command.strip()}` (from the repository root; CPU, 8 simulated devices,"
       f" jax {jax.__version__}; load average {os.getloadavg()[0]:.1f} on"
       f" {os.cpu_count()} cores at the end; no GPU was lent to this measurement)."),
      "",
      ("AdamW (`shardopt.adamw(1e-3, state_bits=...)`) on the LM trees of"
       " `benchmarks/quantized_state.py` ('tp' rules, data=2 x model=4, ZeRO over data),"
       " `make_sharded_optimizer(..., state_memory_kind=...)`. Time: median over"
       f" {args.rounds} interleaved rounds of {args.steps} donated `opt.update` calls,"
       " both placements in one process, each first in every other round (ratio to"
       " device memory in parentheses). State"
       " per device: the bytes a step reads from host memory and writes back, each way"
       " (fullest device, `addressable_shards`). memory_analysis: the compiled update's"
       " arguments / temporaries, device and host parts; on CPU the memory kinds are the"
       " same RAM and XLA reports no host part. Compiled update: its instructions by"
       " opcode; on CPU the host-state program has the same ones, its state buffers"
       " annotated as host memory, and moves nothing (no copy-start / copy-done), so the"
       " time ratio there is parity up to this machine's noise, not a transfer cost."),
      "",
      ("| tree (params) | state | state memory | update time | state per device (MiB) |"
       " device arguments / temp (MiB) | host arguments / temp (MiB) | compiled update |"),
      "|---|---|---|---|---|---|---|---|",
      *rows,
      "",
      ("Bytes moved per step with 8-bit state against float32 state: "
       + ", ".join(f"{tree} {ratio:.3f}x" for tree, ratio in ratios.items())
       + " (codes and scales; the norms' 64-element moments stay float32)."),
      "",
  ]))


if __name__ == "__main__":
  main()
