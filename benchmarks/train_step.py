"""Tokens/s of the demo job's training loop: one program against two.

The old loop (launch/job.py before ``train_step``): a jitted
``value_and_grad`` writing gradients in the params' shardings, then the
jitted, donated ``opt.update``, then ``float(loss)`` (a host sync every
step). The new loop: ``opt.train_step(loss_fn)``, one jitted, donated
program, with the losses fetched every ``--log-every`` steps. Both train the
demo model (launch/model.py, default sizes) on the demo's batches
(launch/data.py: batches made on the host every step, in both loops) with
AdamW and global-norm clipping, ZeRO over ``data``, on 8 simulated CPU
devices, mesh data=4 x model=2, as ``python -m launch.train`` does.

The two are measured in alternating rounds in one process (each going first
in every other round), so machine noise hits both alike. On a machine shared
with other jobs a round can be slowed several-fold by them, so the headline
is the ratio of each loop's best round (the least disturbed one), beside the
median over rounds of the per-round ratio new / old (each round's two runs
adjacent in time) and each loop's median.

Run from the repository root:  python -m benchmarks.train_step [--rounds N]
Writes benchmarks/results/train_step.md.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from launch import data
from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
import partitioning
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "train_step.md"
BATCH, SEQ_LEN = 32, 65  # the demo's defaults


def _setup():
  mesh = partitioning.make_mesh({"data": 4, "model": 2})
  model = Transformer(ModelConfig())
  tokens = jax.ShapeDtypeStruct((1, SEQ_LEN - 1), jnp.int32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  rules = partitioning.decoder_rules("tp", fsdp_axis="data", model_axis="model")
  shardings = partitioning.named_shardings(
      mesh, partitioning.match_partition_rules(rules, shapes))
  tx = shardopt.chain(shardopt.clip_by_global_norm(1.0),
                      shardopt.adamw(shardopt.warmup_cosine_decay_schedule(
                          0.0, 3e-3, 20, 10_000), weight_decay=0.1))
  opt = shardopt.make_sharded_optimizer(tx, shapes, shardings,
                                        shard_state_over="data")
  init = jax.jit(lambda key: model.init(key, jnp.zeros((1, SEQ_LEN - 1), jnp.int32))["params"],
                 out_shardings=shardings)
  return mesh, model, shardings, opt, init


class Loop:
  """One way of training, with its own params, state and step counter."""

  def __init__(self, name, mesh, model, shardings, opt, init, log_every):
    self.name, self.mesh, self.log_every = name, mesh, log_every
    self.corpus, self.step = data.load_corpus(), 0
    self.params = init(jax.random.key(0))
    self.state = opt.init(self.params)
    loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
    if name == "old":
      self.grad_fn = jax.jit(jax.value_and_grad(loss_fn),
                             out_shardings=(NamedSharding(mesh, P()), shardings))
      self.update = opt.update
    else:
      self.train_step = opt.train_step(loss_fn)

  def _batch(self):
    return data.sharded_batch(self.corpus, 0, self.step, BATCH, SEQ_LEN, self.mesh)

  def run(self, steps: int) -> float:
    """Trains ``steps`` steps; returns tokens/s (all losses fetched)."""
    start, losses = time.perf_counter(), []
    for _ in range(steps):
      if self.name == "old":
        loss, grads = self.grad_fn(self.params, self._batch())
        self.params, self.state = self.update(grads, self.state, self.params)
        losses.append(float(loss))  # the per-step host sync
      else:
        self.params, self.state, loss = self.train_step(
            self.params, self.state, self._batch())
        losses.append(loss)
        if (self.step + 1) % self.log_every == 0:
          losses = [float(x) for x in jax.device_get(losses)]
      self.step += 1
    jax.block_until_ready((self.params, jax.device_get(losses)))
    return steps * BATCH * (SEQ_LEN - 1) / (time.perf_counter() - start)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=20)
  parser.add_argument("--steps", type=int, default=10, help="steps per round")
  parser.add_argument("--log-every", type=int, default=10)
  args = parser.parse_args()
  load = os.getloadavg()[0]
  setup = _setup()
  loops = {name: Loop(name, *setup, args.log_every) for name in ("old", "new")}
  for loop in loops.values():  # compile and warm up
    loop.run(3)
  speeds = {name: [] for name in loops}
  for r in range(args.rounds):
    order = ("old", "new") if r % 2 == 0 else ("new", "old")
    for name in order:
      speeds[name].append(loops[name].run(args.steps))
    print(f"round {r}: " + "  ".join(f"{n} {speeds[n][-1]:,.0f} tok/s" for n in loops),
          flush=True)
  median = {name: statistics.median(v) for name, v in speeds.items()}
  best = {name: max(v) for name, v in speeds.items()}
  ratios = [new / old for new, old in zip(speeds["new"], speeds["old"])]
  ratio = best["new"] / best["old"]
  command = "python -m benchmarks.train_step " + " ".join(sys.argv[1:])
  lines = [
      "# Demo training loop: one program (`opt.train_step`) against two", "",
      f"Command: `{command.strip()}` (from the repository root)", "",
      (f"Demo model (launch/model.py defaults), batch {BATCH} x {SEQ_LEN - 1} "
      "tokens made on the host every step, AdamW + clip_by_global_norm, ZeRO "
      "over `data`, 8 simulated CPU devices (mesh data=4 x model=2), "
      f"{jax.device_count()} devices on {os.cpu_count()} CPU cores. Old: "
      "jitted value_and_grad, then the donated `opt.update`, then "
      "`float(loss)` every step. New: `opt.train_step`, losses fetched every "
      f"{args.log_every} steps. {args.rounds} alternating rounds of "
      f"{args.steps} steps each, after 3 warm-up steps. 1-minute load "
      f"average at the start: {load:.1f} (a shared machine; the alternating "
      "rounds share its noise)."), "",
      "| loop | best round tokens/s | median tokens/s | per round |",
      "|---|---|---|---|",
      *[f"| {name} | {best[name]:,.0f} | {median[name]:,.0f} | "
        + ", ".join(f"{v:,.0f}" for v in speeds[name]) + " |" for name in loops],
      "", (f"**new / old = {ratio:.3f}** (best rounds); median of the "
           f"per-round ratios {statistics.median(ratios):.3f} "
           f"({sum(r >= 1 for r in ratios)} of {len(ratios)} rounds >= 1); "
           f"ratio of the medians {median['new'] / median['old']:.3f}"), ""]
  RESULTS.parent.mkdir(parents=True, exist_ok=True)
  RESULTS.write_text("\n".join(lines))
  print(f"new / old = {ratio:.3f} (best rounds); wrote {RESULTS}")


if __name__ == "__main__":
  main()
