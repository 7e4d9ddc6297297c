"""Why some moments declare ``min_bits=8``: their optimizers' 4-bit error.

For each state class that declares a floor (``declare_moments(min_bits=...)``),
the catalogue test's setting (``tests/test_quantized_state.py``: params
``w`` (32, 64), ``k`` (4, 16, 32), ``b``, ``s``; ``min_size=512``; 5 steps on
``sum(0.25 p**2 + 0.1 sin(3 p))``): the largest mean relative error over the
steps of the params' move against float state's, with the state at 8 bits,
at 4 bits as shipped (the floor kept), and at 4 bits with the floor lifted.

Run from the repository root:  python -m benchmarks.quantized_floors
Writes benchmarks/results/quantized_floors.md.
"""

import contextlib
import pathlib
import sys

import jax
import jax.numpy as jnp

import shardopt
from shardopt._src import moments
from shardopt._src.transforms.adadelta import ScaleByAdaDeltaState

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "quantized_floors.md"
SHAPES = {"w": (32, 64), "k": (4, 16, 32), "b": (32,), "s": ()}
STEPS, MIN_SIZE = 5, 512

# name -> (transformation factory, its state class)
OPTIMIZERS = {
    "contrib.simplified_ademamix(0.1, alpha=2)": (
        lambda: shardopt.contrib.simplified_ademamix(0.1, alpha=2.0),
        shardopt.contrib.ScaleBySimplifiedAdEMAMixState),
    "scale_by_adadelta()": (shardopt.scale_by_adadelta, ScaleByAdaDeltaState),
    "adadelta(0.1)": (lambda: shardopt.adadelta(0.1), ScaleByAdaDeltaState),
}


def objective(params):
  return sum(jnp.sum(0.25 * p * p + 0.1 * jnp.sin(3.0 * p))
             for p in jax.tree.leaves(params))


def moves(tx, params):
  """The params' change at each step, one vector per step."""
  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(objective)(params), state, params)
    return shardopt.apply_updates(params, updates), state

  state, out = tx.init(params), []
  for _ in range(STEPS):
    new, state = step(params, state)
    out.append(jnp.concatenate([jnp.ravel(n - p) for n, p in zip(
        jax.tree.leaves(new), jax.tree.leaves(params))]))
    params = new
  return out


def largest_error(got, want) -> float:
  return max(float(jnp.mean(jnp.abs(g - w)) / jnp.mean(jnp.abs(w)))
             for g, w in zip(got, want) if float(jnp.mean(jnp.abs(w))) > 0)


@contextlib.contextmanager
def floor_lifted(state_class):
  """The class's declared floors removed for the duration."""
  declared = moments._MIN_BITS[state_class]
  moments._MIN_BITS[state_class] = {}
  try:
    yield
  finally:
    moments._MIN_BITS[state_class] = declared


def row(name, params) -> str:
  make, state_class = OPTIMIZERS[name]
  want = moves(make(), params)
  quantized = lambda bits: moves(
      shardopt.quantized_state(make(), bits, min_size=MIN_SIZE), params)
  eight, four = quantized(8), quantized(4)
  with floor_lifted(state_class):
    lifted = quantized(4)
  floors = ", ".join(f"{f}: {b}" for f, b in
                     moments._MIN_BITS[state_class].items())
  return (f"| `{name}` | {floors} | {largest_error(eight, want):.3f} | "
          f"{largest_error(four, want):.3f} | {largest_error(lifted, want):.3f} |")


def main() -> None:
  keys = jax.random.split(jax.random.key(11), len(SHAPES))
  params = {k: jax.random.normal(key, shape)
            for key, (k, shape) in zip(keys, SHAPES.items())}
  rows = [row(name, params) for name in OPTIMIZERS]
  text = "\n".join([
      "# Declared floors on a moment's width: the 4-bit error they avoid",
      "",
      "Command: `python -m benchmarks.quantized_floors` (CPU, jax "
      f"{jax.__version__}). " + __doc__.split("\n\n")[1].replace("\n", " "),
      "",
      "| optimizer | declared min_bits | 8-bit | 4-bit (floor kept) | "
      "4-bit (floor lifted) |",
      "|---|---|---|---|---|",
      *rows, ""])
  RESULTS.write_text(text)
  sys.stdout.write(text)


if __name__ == "__main__":
  main()
