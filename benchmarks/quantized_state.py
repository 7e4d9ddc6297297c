"""8-bit and 4-bit optimizer state against float32 state, sharded.

For each optimizer, float32 state against ``shardopt.quantized_state`` (8 and
4 bits, tiles fitted to the params' shardings and the ZeRO axis) on:

* the LM demo (``launch.model`` defaults, 'tp' rules, data=2 x model=4 mesh,
  ZeRO over data, global-norm clipping 1.0, warmup-cosine schedule): held-out
  loss after ``--steps`` steps, ``--seeds`` seeds (init and data order);
* the low-precision MLP (``benchmarks/low_precision.py``, hidden width 256 so
  its first layer has 4096 elements; ``min_size=256`` so both layers are
  quantized): final loss;
* state bytes per param (unique shards summed from ``addressable_shards``)
  and the largest per-device state against the ideal (all state / 8);
* step time of ``opt.update`` against float32 state on the same sharded tree,
  interleaved repetitions in one process;
* the optimizer state's bytes on disk (``checkpoints.CheckpointManager``).

Run from the repository root:  python -m benchmarks.quantized_state
Writes benchmarks/results/quantized_state.md.
"""

import os

# Long collective timeouts: on a loaded 2-core machine a simulated device can
# reach a rendezvous more than XLA's default 40 s after the others.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8"
                      " --xla_cpu_collective_call_terminate_timeout_seconds=1200"
                      " --xla_cpu_collective_timeout_seconds=1200")

import argparse
import collections
import pathlib
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import low_precision
import checkpoints
from launch import data
from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
import partitioning
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "quantized_state.md"
BATCH, LENGTH, EVAL_BATCHES, WARMUP = 32, 65, 4, 20

# Bit widths run on the LM demo per optimizer (4 bits for Adam's two only).
LM_BITS = {"adamw": (8, 4), "adam": (8, 4), "sgd momentum": (8,), "lion": (8,),
           "adafactor+momentum": (8,)}
# name -> (peak learning rate, schedule -> transformation)
OPTIMIZERS = {
    "adamw": (3e-3, lambda lr: shardopt.adamw(lr, weight_decay=1e-4)),
    "adam": (3e-3, shardopt.adam),
    "sgd momentum": (0.3, lambda lr: shardopt.sgd(lr, momentum=0.9)),
    "lion": (3e-4, shardopt.lion),
    "adafactor+momentum": (1e-2, lambda lr: shardopt.adafactor(lr, momentum=0.9)),
}


# The demo model, and a wider one (same layers) whose per-leaf checkpoint
# metadata is small next to its arrays.
DEMO = ModelConfig()
WIDE = ModelConfig(d_model=256, head_dim=64, mlp=1024)


def lm_setup(config=DEMO):
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  model = Transformer(config)
  tokens = jnp.zeros((1, LENGTH - 1), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  rules = partitioning.decoder_rules("tp", fsdp_axis="data", model_axis="model")
  shardings = partitioning.named_shardings(
      mesh, partitioning.match_partition_rules(rules, shapes))
  init = jax.jit(lambda key: model.init(key, tokens)["params"],
                 out_shardings=shardings)
  return mesh, model, shapes, shardings, init


def build(name, bits, steps, shardings, min_size=4096):
  peak, factory = OPTIMIZERS[name]
  schedule = shardopt.warmup_cosine_decay_schedule(
      0.0, peak, WARMUP, steps, end_value=0.1 * peak)
  tx = shardopt.chain(shardopt.clip_by_global_norm(1.0), factory(schedule))
  if bits is None:
    return tx
  return shardopt.quantized_state(tx, bits=bits, min_size=min_size)


def state_bytes(state, n_params, devices):
  """(bytes per param over unique shards, max per-device bytes / ideal)."""
  unique, per_device = 0, collections.Counter()
  for leaf in jax.tree.leaves(state):
    seen = set()
    for shard in leaf.addressable_shards:
      per_device[shard.device] += shard.data.nbytes
      key = str(shard.index)
      if key not in seen:
        seen.add(key)
        unique += shard.data.nbytes
  return unique / n_params, max(per_device.values()) / (unique / devices)


def train_lm(name, bits, seeds, steps, setup, corpus):
  mesh, model, shapes, shardings, init = setup
  tx = build(name, bits, steps, shardings)
  opt = shardopt.make_sharded_optimizer(tx, shapes, shardings,
                                        shard_state_over="data")
  loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
  step = opt.train_step(loss_fn)
  evaluate = jax.jit(loss_fn)
  losses = []
  for seed in seeds:
    params = init(jax.random.key(seed))
    state = opt.init(params)
    for i in range(steps):
      batch = data.sharded_batch(corpus, seed, i, BATCH, LENGTH, mesh)
      params, state, loss = step(params, state, batch)
      # One step in flight at a time: with many queued, simulated devices on
      # 2 cores can each block in a different step's all-reduce (deadlock).
      loss.block_until_ready()
    held_out = [evaluate(params, data.sharded_batch(
        corpus, 10_000, i, BATCH, LENGTH, mesh)) for i in range(EVAL_BATCHES)]
    losses.append(float(np.mean(jax.device_get(held_out))))
  return np.array(losses)


def measure_layout(name, bits, setup, n_params, corpus, steps=20):
  """After ``steps`` training steps (so the state is not all zeros): state
  bytes per param, per-device ratios (all state; state of the matrices),
  checkpoint bytes, and the optimizer with its params and state."""
  mesh, model, shapes, shardings, init = setup
  opt = shardopt.make_sharded_optimizer(build(name, bits, 200, shardings),
                                        shapes, shardings,
                                        shard_state_over="data")
  params = init(jax.random.key(0))
  state = opt.init(params)
  step = opt.train_step(lambda p, tokens: next_token_loss(model, p, tokens))
  for i in range(steps):
    params, state, loss = step(params, state, data.sharded_batch(
        corpus, 0, i, BATCH, LENGTH, mesh))
    loss.block_until_ready()
  per_param, ratio = state_bytes(state, n_params, mesh.size)
  matrices = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(state)
              if "ln_" not in jax.tree_util.keystr(path)]
  _, matrix_ratio = state_bytes(matrices, n_params, mesh.size)
  ratio = (ratio, matrix_ratio)
  with tempfile.TemporaryDirectory() as tmp:
    with checkpoints.CheckpointManager(tmp) as manager:
      manager.save(0, {"opt_state": state}, force=True)
      manager.wait_until_finished()
    files = [f for f in pathlib.Path(tmp).rglob("*") if f.is_file()]
    disk = (sum(f.stat().st_size for f in files if f.parent.name == "d"),
            sum(f.stat().st_size for f in files))
  return opt, params, state, per_param, ratio, disk


def time_updates(layouts, setup, rounds=7, steps=10):
  """Seconds per ``opt.update`` for each layout, interleaved rounds."""
  init = setup[-1]
  grads = jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p), init(jax.random.key(1)))
  live = {k: [v[1], v[2]] for k, v in layouts.items()}
  times = collections.defaultdict(list)
  for _ in range(rounds):
    for key, (opt, *_rest) in layouts.items():
      params, state = live[key]
      params, state = opt.update(grads, state, params)  # warm
      jax.block_until_ready(state)
      start = time.perf_counter()
      for _ in range(steps):
        params, state = opt.update(grads, state, params)
        jax.block_until_ready(state)
      times[key].append((time.perf_counter() - start) / steps)
      live[key] = [params, state]
  return {k: float(np.median(v)) for k, v in times.items()}


def layout_table(tree, setup, corpus):
  """Rows of the layout table (float32, 8-bit, 4-bit AdamW) for one tree."""
  n_params = sum(x.size for x in jax.tree.leaves(setup[2]))
  rows, layouts = [], {}
  for bits in (None, 8, 4):
    opt, params, state, per_param, ratio, disk = measure_layout(
        "adamw", bits, setup, n_params, corpus)
    layouts[bits] = (opt, params, state)
    rows.append((bits, per_param, ratio, disk))
  step_times = time_updates(layouts, setup)
  disk32 = rows[0][3]
  return [
      f"| {tree} ({n_params:,}) | {'float32' if b is None else f'{b}-bit'} |"
      f" {pp:.3f} | {r[0]:.3f} | {r[1]:.3f} |"
      f" {step_times[b] * 1e3:.2f} ms ({step_times[b] / step_times[None]:.2f}x) |"
      f" {d[0]:,} ({d[0] / disk32[0]:.1%}) | {d[1]:,} ({d[1] / disk32[1]:.1%}) |"
      for b, pp, r, d in rows]


def mlp_rows(steps):
  params, loss_fn = low_precision.make_problem(width=256)
  rows = []
  for name in OPTIMIZERS:
    shardings = None
    f32, _ = low_precision.train(build(name, None, steps, shardings), params,
                                 loss_fn, steps)
    cells = [f"{f32:.5f}"]
    for bits in (8, 4):
      loss, _ = low_precision.train(build(name, bits, steps, shardings, 256),
                                    params, loss_fn, steps)
      cells.append(f"{loss:.5f} ({(loss - f32) / f32:+.2%})")
    rows.append(f"| {name} | " + " | ".join(cells) + " |")
    print(rows[-1], flush=True)
  return rows


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--mlp-steps", type=int, default=300)
  args = parser.parse_args(argv)
  command = "python -m benchmarks.quantized_state " + " ".join(
      sys.argv[1:] if argv is None else argv)
  setup = lm_setup()
  corpus = data.load_corpus()
  seeds = list(range(args.seeds))

  table_layout, lm, mlp = [], [], []
  write = lambda status: write_results(command, args, table_layout, lm, mlp, status)
  for i, name in enumerate(OPTIMIZERS):  # AdamW (the acceptance numbers) first
    lm.append(lm_row(name, seeds, args.steps, setup, corpus))
    print(lm[-1], flush=True)
    write("partial: LM runs, layout and MLP still running")
    if i == 0:
      for tree, tree_setup in (("demo", setup), ("wide", lm_setup(WIDE))):
        table_layout += layout_table(tree, tree_setup, corpus)
      print("\n".join(table_layout), flush=True)
      mlp += mlp_rows(args.mlp_steps)
  write("")


def lm_row(name, seeds, steps, setup, corpus) -> str:
  """One row of the LM table: float32 and quantized held-out losses."""
  base = train_lm(name, None, seeds, steps, setup, corpus)
  cells = [f"{base.mean():.4f} ± {base.std():.4f}"]
  for bits in (8, 4):
    if bits not in LM_BITS[name]:
      cells.append("not run")
      continue
    q = train_lm(name, bits, seeds, steps, setup, corpus)
    rel = (q.mean() - base.mean()) / base.mean()
    cells.append(f"{q.mean():.4f} ± {q.std():.4f} ({rel:+.2%})")
  return f"| {name} | " + " | ".join(cells) + " |"


def write_results(command, args, table_layout, lm, mlp, status) -> None:
  RESULTS.parent.mkdir(exist_ok=True)
  RESULTS.write_text("\n".join([
      "# Quantized (8-bit / 4-bit) optimizer state against float32 state",
      "",
      *([f"Status: {status}.", ""] if status else []),
      (f"Command: `{command.strip()}` (from the repository root; CPU, 8 simulated"
       f" devices, jax {jax.__version__}). Quantized state: `shardopt.quantized_state`"
       " with its default block sizes (256 at 8 bits, 128 at 4 bits), tiles fitted"
       " to the params' shardings and the ZeRO axis."),
      "",
      "## AdamW state on the LM trees, data=2 x model=4, ZeRO over data",
      "",
      ("State bytes per param: every leaf's unique shards (`addressable_shards`,"
      " replicas counted once) over the param count. Per-device / ideal: the"
      " fullest device's state bytes over (all state bytes / 8); the norm scales"
      " (64 elements) are below ZeRO's 4 KiB threshold and replicate (next column:"
      " all other leaves). Measured after 20 training steps. Step time:"
      " median of 7 interleaved rounds of 10 donated `opt.update` calls on the same"
      " sharded tree. Checkpoint: the optimizer state alone saved with"
      " `checkpoints.CheckpointManager`: the array chunk files (`d/`, the"
      " optimizer-state bytes) and all files of the step (adds per-leaf"
      " metadata: paths, shardings, checksums; quantized state has two leaves"
      " per moment)."),
      "",
      (f"Trees: the demo model and a wider one ({WIDE}), both 'tp' rules."),
      "",
      ("| tree (params) | state | bytes / param | per-device / ideal | same, without"
       " the norm scales' state | step time (vs float32) | checkpoint array data"
       " bytes (vs float32) | checkpoint all files (vs float32) |"),
      "|---|---|---|---|---|---|---|---|",
      *table_layout,
      "",
      f"## LM demo: held-out loss after {args.steps} steps, {args.seeds} seeds (mean ± std)",
      "",
      (f"`launch.model` defaults (d_model 64, 2 layers, vocab 256), batch {BATCH} x"
      f" {LENGTH - 1} tokens, warmup {WARMUP} + cosine to 0.1 x peak, clip 1.0;"
      f" loss on {EVAL_BATCHES} held-out batches. Relative difference of the means"
      " in parentheses. Peak learning rates: "
       + ", ".join(f"{k} {v[0]:g}" for k, v in OPTIMIZERS.items()) + "."),
      "",
      "| optimizer | float32 state | 8-bit state | 4-bit state |",
      "|---|---|---|---|",
      *lm,
      "",
      (f"## MLP regression (benchmarks/low_precision.py, width 256), {args.mlp_steps}"
       " full-batch steps, final loss"),
      "",
      ("Loss goes towards 0 here, so relative differences exaggerate (see"
       " low_precision.md). `min_size=256` so both layers are quantized."),
      "",
      "| optimizer | float32 state | 8-bit state | 4-bit state |",
      "|---|---|---|---|",
      *mlp,
      "",
  ]))


if __name__ == "__main__":
  main()
