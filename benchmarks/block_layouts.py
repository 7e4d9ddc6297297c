"""Portable against fitted quantization blocks: update time and bytes.

``quantized_state(..., block_layout="portable")`` (the default) fits each
moment's blocks to the shards of every mesh of the device count where a
block of at least half ``block_size`` fits them, so a checkpoint moves
between (2, 4), (4, 2) and (8, 1) bit for bit; ``"fitted"`` fits them to
this mesh's shards, whose runs along the last dimension can be longer. Here,
on quantized_state's benchmark setting (the wide LM tree, 'tp' rules,
data=2 x model=4, ZeRO over data, AdamW with clipping): the update's time
side by side with float32 state (interleaved rounds, one process), state
bytes per param (``addressable_shards``), how many quantized leaves keep
their blocks on (4, 2) and (8, 1), and the longest run of the last
dimension's tile lengths.

Run from the repository root:  python -m benchmarks.block_layouts
Writes benchmarks/results/block_layouts.md.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import pathlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import sys

import jax
from jax.sharding import NamedSharding

from benchmarks import quantized_state as bench
from benchmarks import resident
from benchmarks import timing
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "block_layouts.md"
VARIANTS = [(bits, layout) for bits in (8, 4) for layout in ("portable", "fitted")]


def _optimizer(variant, shapes, shardings):
  tx = bench.build("adamw", None, 200)
  if variant is not None:
    bits, layout = variant
    tx = shardopt.quantized_state(tx, bits, block_layout=layout)
  return shardopt.make_sharded_optimizer(tx, shapes, shardings, shard_state_over="data")


def _tiles(state) -> dict[str, tuple[int, ...]]:
  is_q = lambda x: isinstance(x, shardopt.QuantizedArray)
  return {jax.tree_util.keystr(path): q.tile for path, q in
          jax.tree_util.tree_flatten_with_path(state, is_leaf=is_q)[0] if is_q(q)}


def _kept_on_other_meshes(variant, tiles, shapes, specs) -> str:
  """How many of ``tiles`` each of (4, 2) and (8, 1) gives the same."""
  counts = []
  for shape in ((4, 2), (8, 1)):
    mesh = jax.make_mesh(shape, ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
    opt = _optimizer(variant, shapes, shardings)
    other = _tiles(opt.init.eval_shape(jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)))
    counts.append(f"{sum(other[k] == t for k, t in tiles.items())} of {len(tiles)}")
  return " / ".join(counts)


def main() -> None:
  setup = bench.lm_setup(bench.WIDE)
  _, _, shapes, shardings, init = setup
  specs = jax.tree.map(lambda s: s.spec, shardings)
  n_params = sum(x.size for x in jax.tree.leaves(shapes))
  layouts, rows = {}, {}
  for variant in [None, *VARIANTS]:
    opt = _optimizer(variant, shapes, shardings)
    params = init(jax.random.key(0))
    state = opt.init(params)
    layouts[variant] = (opt, params, state)
    if variant is not None:
      tiles = _tiles(state)
      rows[variant] = (resident.unique_and_per_device(state)[0] / n_params,
                       max(t[-1] for t in tiles.values()),
                       min(t[-1] for t in tiles.values()),
                       _kept_on_other_meshes(variant, tiles, shapes, specs))
  times = timing.interleaved(layouts, bench._grads(setup))  # pylint: disable=protected-access
  lines = [
      "# Portable against fitted quantization blocks", "",
      f"Command: `python -m benchmarks.block_layouts` (from the repository root; CPU,"
      f" {len(jax.devices())} simulated devices on {os.cpu_count()} cores, jax {jax.__version__})."
      f" The wide LM tree ({bench.WIDE}; {n_params:,} params), 'tp' rules on data=2 x"
      " model=4, ZeRO over data, AdamW with clipping; `quantized_state(tx, bits,"
      " block_layout=...)` with its default blocks (256 at 8 bits, 128 at 4) and code"
      " (companded). Update time: median of 15 interleaved rounds of 10 `opt.update`"
      " calls, and the median over rounds of its time over float32's in the same round."
      " Bytes: unique shards over params. Last-dimension tile: the longest and shortest"
      " of the quantized leaves' tiles' last lengths. Same blocks: quantized leaves whose"
      " tiles are the same when the optimizer is built on (4, 2) / (8, 1).", "",
      "| state | block_layout | bytes / param | update time (vs float32) |"
      " last-dimension tile (longest, shortest) | same blocks on (4, 2) / (8, 1) |",
      "|---|---|---|---|---|---|",
      f"| float32 | - | 8.000 | {times[None][0] * 1e3:.2f} ms (1.00x) | - | - |",
  ]
  for variant, (per_param, longest, shortest, kept) in rows.items():
    seconds, ratio = times[variant]
    lines.append(f"| {variant[0]}-bit | {variant[1]} | {per_param:.3f} |"
                 f" {seconds * 1e3:.2f} ms ({ratio:.2f}x) | {longest}, {shortest} | {kept} |")
  text = "\n".join(lines) + "\n"
  RESULTS.parent.mkdir(exist_ok=True)
  RESULTS.write_text(text)
  sys.stdout.write(text)


if __name__ == "__main__":
  main()
