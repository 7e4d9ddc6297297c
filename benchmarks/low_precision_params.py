"""bfloat16 params with a master-weight correction against float32 training.

On the LM demo (``launch.model`` defaults, 'tp' rules, data=2 x model=4,
ZeRO over data, AdamW, clipping 1.0, warmup-cosine), ``--seeds`` seeds of
``--steps`` steps each, held-out loss (the job's held-out slice) for:

* float32 params and float32 AdamW state: the reference;
* bfloat16 params + 8-bit correction + 8-bit moments
  (``low_precision_params(adamw(..., state_bits=8), correction_bits=8)``);
* the same with no correction (``correction_bits=0``: plain bfloat16
  params, what the correction buys), and, to tell the parts apart, with a
  16-bit correction (the float32 master exactly) and with float32 moments.

Bytes per param of params and state (unique shards from
``addressable_shards``, scales included) and the fullest device against its
params' share plus 1/8 of the state, after 20 steps.

Run from the repository root:  python -m benchmarks.low_precision_params
Writes benchmarks/results/low_precision_params.md.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8"
                      " --xla_cpu_collective_call_terminate_timeout_seconds=1200"
                      " --xla_cpu_collective_timeout_seconds=1200")

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import resident
from benchmarks.quantized_state import BATCH, LENGTH, WARMUP, lm_setup
from launch import data
from launch.model import next_token_loss
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "low_precision_params.md"
PEAK, WEIGHT_DECAY, EVAL_BATCHES = 3e-3, 1e-4, 8

# name -> (params dtype, correction bits or None (no wrapper), moment bits or None)
CONFIGS = {
    "float32 params, float32 state (reference)": (jnp.float32, None, None),
    "bfloat16 + 8-bit correction + 8-bit moments": (jnp.bfloat16, 8, 8),
    "bfloat16, no correction + 8-bit moments": (jnp.bfloat16, 0, 8),
    "bfloat16 + 16-bit correction + 8-bit moments": (jnp.bfloat16, 16, 8),
    "bfloat16 + 8-bit correction, float32 moments": (jnp.bfloat16, 8, None),
}


def build(steps, correction_bits, moment_bits):
  schedule = shardopt.warmup_cosine_decay_schedule(0.0, PEAK, WARMUP, steps,
                                                   end_value=0.1 * PEAK)
  tx = shardopt.chain(shardopt.clip_by_global_norm(1.0),
                      shardopt.adamw(schedule, weight_decay=WEIGHT_DECAY,
                                     state_bits=moment_bits))
  if correction_bits is None:
    return tx
  return shardopt.low_precision_params(tx, correction_bits=correction_bits)


def _setup(dtype):
  mesh, model, shapes, shardings, init = lm_setup()
  shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), shapes)
  cast = jax.jit(lambda key: jax.tree.map(lambda p: p.astype(dtype), init(key)),
                 out_shardings=shardings)
  return mesh, model, shapes, shardings, cast


def _optimizer(config, steps):
  dtype, correction_bits, moment_bits = CONFIGS[config]
  mesh, model, shapes, shardings, init = _setup(dtype)
  opt = shardopt.make_sharded_optimizer(build(steps, correction_bits, moment_bits), shapes,
                                        shardings, shard_state_over="data")
  return mesh, model, opt, init


def train(config, seeds, steps, corpus, held_out):
  """Held-out loss after ``steps`` steps, per seed."""
  mesh, model, opt, init = _optimizer(config, steps)
  loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
  step = opt.train_step(loss_fn)
  evaluate = jax.jit(lambda p, batches: jnp.mean(jax.lax.map(lambda b: loss_fn(p, b), batches)))
  losses = []
  for seed in seeds:
    params = init(jax.random.key(seed))
    state = opt.init(params)
    for i in range(steps):
      params, state, loss = step(params, state,
                                 data.sharded_batch(corpus, seed, i, BATCH, LENGTH, mesh))
      loss.block_until_ready()  # one step in flight (see benchmarks/quantized_state.py)
    losses.append(float(evaluate(params, held_out)))
  return np.array(losses)


def layout(config, corpus, steps=20):
  """(params bytes / param, state bytes / param, fullest device / (its params'
  share + all state / 8)) after ``steps`` steps."""
  mesh, model, opt, init = _optimizer(config, 200)
  step = opt.train_step(lambda p, tokens: next_token_loss(model, p, tokens))
  params = init(jax.random.key(0))
  state = opt.init(params)
  for i in range(steps):
    params, state, loss = step(params, state,
                               data.sharded_batch(corpus, 0, i, BATCH, LENGTH, mesh))
    loss.block_until_ready()
  n_params = sum(p.size for p in jax.tree.leaves(params))
  param_bytes, param_device = resident.unique_and_per_device(params)
  state_bytes, state_device = resident.unique_and_per_device(state)
  ratio = max((param_device[d] + state_device[d]) / (param_device[d] + state_bytes / 8)
              for d in param_device)
  return param_bytes / n_params, state_bytes / n_params, ratio


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--seeds", type=int, default=3)
  args = parser.parse_args(argv)
  command = "python -m benchmarks.low_precision_params " + " ".join(
      sys.argv[1:] if argv is None else argv)
  corpus, held = data.split(data.load_corpus())
  mesh = lm_setup()[0]
  held_out = data.sharded_eval_batches(data.eval_batches(held, EVAL_BATCHES, BATCH, LENGTH),
                                       mesh)
  seeds = list(range(args.seeds))
  rows, layouts, reference = [], [], None
  for config in CONFIGS:
    losses = train(config, seeds, args.steps, corpus, held_out)
    reference = losses if reference is None else reference
    rel = (losses.mean() - reference.mean()) / reference.mean()
    rows.append(f"| {config} | {losses.mean():.4f} ± {losses.std():.4f} | {rel:+.2%} | "
                + ", ".join(f"{x:.4f}" for x in losses) + " |")
    print(rows[-1], flush=True)
    per_param, state, ratio = layout(config, corpus)
    layouts.append(f"| {config} | {per_param:.3f} | {state:.3f} | {per_param + state:.3f} |"
                   f" {ratio:.3f} |")
    print(layouts[-1], flush=True)
    write(command, args, rows, layouts)


def write(command, args, rows, layouts) -> None:
  RESULTS.parent.mkdir(exist_ok=True)
  RESULTS.write_text("\n".join([
      "# bfloat16 params with a master-weight correction against float32 training",
      "",
      (f"Command: `{command.strip()}` (from the repository root; CPU, 8 simulated devices,"
       f" jax {jax.__version__})."),
      "",
      (f"LM demo (`launch.model` defaults: d_model 64, 2 layers, vocab 256), 'tp' rules on"
       f" data=2 x model=4, ZeRO over data; AdamW peak {PEAK:g}, weight decay"
       f" {WEIGHT_DECAY:g}, warmup {WARMUP} + cosine to 0.1 x peak, clipping 1.0; batch"
       f" {BATCH} x {LENGTH - 1} tokens, {args.steps} steps; held-out loss on"
       f" {EVAL_BATCHES} batches of the job's held-out slice. bfloat16 runs start from"
       " the float32 init rounded; the model computes in its params' dtype. 8-bit"
       " moments: `adamw(..., state_bits=8)` (blocks of 256, the default companded code)."),
      "",
      f"## Held-out loss, {args.seeds} seeds (mean ± std; relative to the reference's mean)",
      "",
      "| params and state | held-out loss | vs float32 | per seed |",
      "|---|---|---|---|",
      *rows,
      "",
      "## Bytes per param after 20 steps (unique shards, scales included)",
      "",
      ("Fullest device: the largest per-device bytes of params + state over (that"
       " device's params + all state bytes / 8)."),
      "",
      "| params and state | params | optimizer state | total | fullest device |",
      "|---|---|---|---|---|",
      *layouts,
      "",
  ]))


if __name__ == "__main__":
  main()
