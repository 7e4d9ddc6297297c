"""Gradient accumulation inside the step: temporary memory against microbatches.

``opt.train_step(loss_fn, microbatches=k)`` splits the batch into ``k``
microbatches scanned inside the one program, so the activations of only one
microbatch are alive at a time. For the demo model (launch/model.py
defaults) on a batch large enough that activations dominate, AdamW with ZeRO
over ``data`` on 8 simulated CPU devices (mesh data=4 x model=2), this
compiles the step for each ``k`` and reads ``compiled.memory_analysis()``
(per device: temporaries, arguments, outputs), then runs one step of each
from the same params and batch and reports how far its gradients (returned
through ``metrics``) and loss are from the one-batch step's.

Run from the repository root:  python -m benchmarks.microbatches [--batch N]
Writes benchmarks/results/microbatches.md.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from launch import data
from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
import partitioning
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "microbatches.md"
SEQ_LEN = 65  # the demo's


def _setup():
  mesh = partitioning.make_mesh({"data": 4, "model": 2})
  model = Transformer(ModelConfig())
  tokens = jnp.zeros((1, SEQ_LEN - 1), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  rules = partitioning.decoder_rules("tp", fsdp_axis="data", model_axis="model")
  shardings = partitioning.named_shardings(
      mesh, partitioning.match_partition_rules(rules, shapes))
  opt = shardopt.make_sharded_optimizer(shardopt.adamw(1e-3), shapes, shardings,
                                        shard_state_over="data")
  init = jax.jit(lambda key: model.init(key, tokens)["params"], out_shardings=shardings)
  loss_fn = lambda p, batch: next_token_loss(model, p, batch)
  return mesh, opt, init, loss_fn


def _max_relative(a, b) -> float:
  """The largest |a - b| of a leaf over that leaf's largest |b|."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))
                   / max(float(np.max(np.abs(np.asarray(y)))), 1e-30))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8])
  args = parser.parse_args()
  mesh, opt, init, loss_fn = _setup()
  batch = data.sharded_batch(data.split(data.load_corpus())[0], 0, 0, args.batch, SEQ_LEN,
                             mesh)
  rows, results = [], {}
  for k in args.microbatches:
    params = init(jax.random.key(0))
    state = opt.init(params)
    step = opt.train_step(loss_fn, microbatches=k, metrics=lambda grads, *_: grads)
    memory = step.lower(params, state, batch).compile().memory_analysis()
    _, _, loss, grads = step(params, state, batch)
    results[k] = (jax.device_get(grads), float(loss))
    rows.append((k, memory.temp_size_in_bytes, memory.argument_size_in_bytes,
                 memory.output_size_in_bytes))
    print(f"microbatches {k}: temp {memory.temp_size_in_bytes:,} bytes, loss {float(loss):.6f}",
          flush=True)
  base_grads, base_loss = results[args.microbatches[0]]
  base_temp = rows[0][1]
  param_count = sum(x.size for x in jax.tree.leaves(base_grads))
  command = "python -m benchmarks.microbatches " + " ".join(sys.argv[1:])
  lines = [
      "# Gradient accumulation inside the step: temporary memory", "",
      f"Command: `{command.strip()}` (from the repository root)", "",
      (f"Demo model (launch/model.py defaults, {param_count:,} params), batch "
       f"{args.batch} x {SEQ_LEN - 1} tokens, AdamW with ZeRO over `data`, "
       f"{jax.device_count()} simulated CPU devices (mesh data=4 x model=2), "
       f"jax {jax.__version__}. `opt.train_step(loss_fn, microbatches=k)`, "
       "compiled once per k; bytes per device from `compiled.memory_analysis()` "
       "(arguments: params, state and batch; outputs: new params, state, loss "
       "and, here, the gradients). Difference from k=1: one step from the same "
       "params and batch; gradients: each leaf's largest difference over that "
       "leaf's largest value, the largest over leaves; loss: relative."), "",
      "| microbatches | temporary bytes | vs k=1 | argument bytes | output bytes |"
      " gradients vs k=1 | loss vs k=1 |",
      "|---|---|---|---|---|---|---|",
      *[f"| {k} | {temp:,} | {temp / base_temp:.3f} | {arg:,} | {out:,} |"
        f" {_max_relative(results[k][0], base_grads):.1e} |"
        f" {abs(results[k][1] - base_loss) / abs(base_loss):.1e} |"
        for k, temp, arg, out in rows], ""]
  RESULTS.parent.mkdir(parents=True, exist_ok=True)
  RESULTS.write_text("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
