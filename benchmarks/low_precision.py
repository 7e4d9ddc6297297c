"""Accuracy of bfloat16 optimizer state against float32 state.

Trains the same small MLP regression with each optimizer twice, once with
float32 state and once with its floating state stored in bfloat16
(``shardopt.low_precision_state``; for Adam also the built-in ``mu_dtype`` /
``nu_dtype``), from the same initialisation and data, and reports the final
losses, their relative difference and the state bytes.

Run from the repository root:  python -m benchmarks.low_precision [--steps N]
Writes benchmarks/results/low_precision.md.
"""

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "low_precision.md"


def make_problem(seed: int = 0, width: int = 64):
  """A 2-layer MLP regression on a fixed random teacher."""
  k_x, k_teacher, k_init1, k_init2 = jax.random.split(jax.random.PRNGKey(seed), 4)
  inputs = jax.random.normal(k_x, (512, 16))
  teacher = jax.random.normal(k_teacher, (16, 1))
  targets = jnp.sin(inputs @ teacher)
  params = {
      "hidden": jax.random.normal(k_init1, (16, width)) / 4.0,
      "out": jax.random.normal(k_init2, (width, 1)) / jnp.sqrt(width),
  }

  def loss_fn(p):
    prediction = jnp.tanh(inputs @ p["hidden"]) @ p["out"]
    return jnp.mean((prediction - targets) ** 2)

  return params, loss_fn


def train(tx, params, loss_fn, steps: int) -> tuple[float, int]:
  """Final loss after ``steps`` full-batch steps, and the state's bytes."""
  state = tx.init(params)

  @jax.jit
  def step(params, state):
    grads = jax.grad(loss_fn)(params)
    updates, state = tx.update(grads, state, params)
    return shardopt.apply_updates(params, updates), state

  for _ in range(steps):
    params, state = step(params, state)
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state) if x.ndim)
  return float(loss_fn(params)), state_bytes


def variants():
  """(name, float32 optimizer, bfloat16-state optimizer) triples."""
  bf16 = jnp.bfloat16
  low = shardopt.low_precision_state
  return [
      ("adam (mu_dtype, nu_dtype)", shardopt.adam(1e-2),
       shardopt.adam(1e-2, mu_dtype=bf16, nu_dtype=bf16)),
      ("adam (mu_dtype only)", shardopt.adam(1e-2), shardopt.adam(1e-2, mu_dtype=bf16)),
      ("adam (low_precision_state)", shardopt.adam(1e-2), low(shardopt.adam(1e-2))),
      ("sgd momentum 0.9", shardopt.sgd(1e-1, momentum=0.9),
       low(shardopt.sgd(1e-1, momentum=0.9))),
      ("rmsprop", shardopt.rmsprop(1e-3), low(shardopt.rmsprop(1e-3))),
      ("adafactor", shardopt.adafactor(1e-2, min_dim_size_to_factor=8),
       low(shardopt.adafactor(1e-2, min_dim_size_to_factor=8))),
      ("sm3", shardopt.sm3(1e-1), low(shardopt.sm3(1e-1))),
      ("lion", shardopt.lion(1e-3), low(shardopt.lion(1e-3))),
  ]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=300)
  args = parser.parse_args(argv)
  params, loss_fn = make_problem()
  initial = float(loss_fn(params))
  rows = []
  for name, full_tx, low_tx in variants():
    full_loss, full_bytes = train(full_tx, params, loss_fn, args.steps)
    low_loss, low_bytes = train(low_tx, params, loss_fn, args.steps)
    relative = abs(low_loss - full_loss) / full_loss
    rows.append(f"| {name} | {full_loss:.5f} | {low_loss:.5f} | {relative:.2%} |"
                f" {full_bytes} | {low_bytes} |")
    print(rows[-1], flush=True)
  command = "python -m benchmarks.low_precision " + " ".join(sys.argv[1:] if argv is None else argv)
  RESULTS.parent.mkdir(exist_ok=True)
  RESULTS.write_text("\n".join([
      "# bfloat16 optimizer state: accuracy against float32 state",
      "",
      f"Command: `{command.strip()}` (from the repository root; CPU, jax {jax.__version__})",
      "",
      f"MLP regression (16 -> 64 -> 1, tanh), 512 examples, full batch, {args.steps} steps;"
      f" initial loss {initial:.5f}. Same init and data for both columns.",
      "",
      "| optimizer | final loss, f32 state | final loss, bf16 state | relative difference |"
      " state bytes f32 | state bytes bf16 |",
      "|---|---|---|---|---|---|",
      *rows,
      "",
  ]))


if __name__ == "__main__":
  main()
