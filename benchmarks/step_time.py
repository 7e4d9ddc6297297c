"""Step time of shardopt's optimizers against optax's, on the same sharded tree.

Both run through ``shardopt.make_sharded_optimizer`` (same shardings, same
donation), so the ratio compares the transformations' compiled update alone.
8 simulated CPU devices on a ('data': 2, 'model': 4) mesh; every array length
is even (odd lengths run 3-4x slower on XLA:CPU). The two are measured in
alternating rounds in one process (each going first in every other round), so
machine noise hits both alike.

Run from the repository root:  python -m benchmarks.step_time [--steps N]
Writes benchmarks/results/step_time.md. On an accelerator, set
``JAX_PLATFORMS=cuda`` (or tpu): the mesh then spans the devices present
(``data=1, model=N`` when there are fewer than 8), and ``--layers``,
``--d-model`` and ``--results`` size the tree and name the results file.
"""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import optax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardopt  # noqa: E402

VOCAB = 4096
RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "step_time.md"


def tree(layers: int, d_model: int):
  """(shape, spec) per param: an embedding and MLP blocks (hidden = 2 x
  d_model); the defaults (4, 512) give ~5.2M params."""
  hidden = 2 * d_model
  layer = {"w_in": ((d_model, hidden), P(None, "model")),
           "b_in": ((hidden,), P("model")),
           "w_out": ((hidden, d_model), P("model", None)),
           "scale": ((d_model,), P())}
  return {"embedding": ((VOCAB, d_model // 2), P("model", None)),
          **{f"layer_{i}": dict(layer) for i in range(layers)}}


def mesh_for_devices():
  """('data': 2, 'model': 4) on 8 or more devices, else ('data': 1, 'model': N)."""
  count = jax.device_count()
  shape = (2, 4) if count >= 8 else (1, count)
  return jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def optimizers():
  """name -> (shardopt's, optax's), with the same hyperparameters."""
  return {
      "adam": (shardopt.adam(1e-3), optax.adam(1e-3)),
      "adafactor": (shardopt.adafactor(1e-3), optax.adafactor(1e-3)),
      "sm3": (shardopt.sm3(1e-3), optax.sm3(1e-3)),
  }


class Runner:
  """One optimizer's sharded state, params and compiled step."""

  def __init__(self, tx, params, grads, shardings):
    self.opt = shardopt.make_sharded_optimizer(tx, params, shardings)
    self.params = jax.device_put(jax.tree.map(lambda p: p + 0, params),
                                 shardings)
    self.state = self.opt.init(self.params)
    self.grads = grads
    compiled = self.opt.update.lower(grads, self.state, self.params).compile()
    self.temp_bytes = compiled.memory_analysis().temp_size_in_bytes
    text = compiled.as_text()
    self.fusions = text.split("ENTRY", 1)[1].count(" fusion(")
    # The computations, without source locations (which differ by library).
    self.program = [re.sub(r", metadata=\{[^}]*\}", "", line)
                    for line in text.splitlines()
                    if line.startswith(("%", " ", "ENTRY", "}"))]

  def step_seconds(self) -> float:
    start = time.perf_counter()
    self.params, self.state = self.opt.update(self.grads, self.state,
                                              self.params)
    jax.block_until_ready((self.params, self.state))
    return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=30,
                      help="timed steps per optimizer (after 5 warm-up)")
  parser.add_argument("--rounds", type=int, default=5,
                      help="alternating rounds the steps are split into")
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--d-model", type=int, default=512)
  parser.add_argument("--results", type=pathlib.Path, default=RESULTS)
  args = parser.parse_args()

  mesh = mesh_for_devices()
  shapes = tree(args.layers, args.d_model)
  is_pair = lambda x: isinstance(x, tuple) and isinstance(x[1], P)
  shardings = jax.tree.map(lambda x: NamedSharding(mesh, x[1]), shapes,
                           is_leaf=is_pair)
  leaves, treedef = jax.tree.flatten(shapes, is_leaf=is_pair)
  keys = jax.random.split(jax.random.PRNGKey(0), 2 * len(leaves))
  params = treedef.unflatten([jax.random.normal(k, s) for k, (s, _) in
                              zip(keys, leaves)])
  grads = jax.device_put(treedef.unflatten(
      [1e-2 * jax.random.normal(k, s) for k, (s, _) in
       zip(keys[len(leaves):], leaves)]), shardings)
  count = sum(p.size for p in jax.tree.leaves(params))

  rows = []
  for name, pair in optimizers().items():
    runners = [Runner(tx, params, grads, shardings) for tx in pair]
    for runner in runners:
      for _ in range(5):
        runner.step_seconds()
    times = [[], []]
    per_round = max(1, args.steps // args.rounds)
    for round_ in range(args.rounds):  # who goes first alternates too
      pairs = list(zip(runners, times))
      for runner, out in pairs[::-1] if round_ % 2 else pairs:
        out.extend(runner.step_seconds() for _ in range(per_round))
    ours, theirs = (statistics.median(t) for t in times)
    fastest = [min(t) for t in times]
    same = "yes" if runners[0].program == runners[1].program else "no"
    rows.append((name, ours, theirs, fastest[0] / fastest[1],
                 *(f"{r.fusions} / {r.temp_bytes:,}" for r in runners), same))
    print(f"{name:<10} shardopt {ours * 1e3:7.2f} ms  optax "
          f"{theirs * 1e3:7.2f} ms  ratio {ours / theirs:.3f} (of minima "
          f"{fastest[0] / fastest[1]:.3f})", flush=True)

  command = "python -m benchmarks.step_time " + " ".join(sys.argv[1:])
  lines = [
      "# Step time: shardopt / optax",
      "",
      f"Command: `{command.strip()}` (from the repository root)",
      "",
      f"{count:,} float32 params (even sizes) on {jax.device_count()} "
      f"{jax.devices()[0].device_kind} device(s), mesh {dict(mesh.shape)}; both through "
      "`shardopt.make_sharded_optimizer` (same shardings, donated state and "
      f"params); 5 warm-up steps, then the median of {args.steps} steps each, "
      f"in {args.rounds} alternating rounds. jax {jax.__version__}, "
      f"optax {optax.__version__}. Machine load (1-min average) "
      f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores: timings on a "
      "shared machine are noisy; the compiled steps' fusion counts, "
      "temporaries and programs (compared without source locations) are "
      "not.",
      "",
      "| optimizer | shardopt median (ms) | optax median (ms) | ratio | "
      "ratio of minima | shardopt fusions / temp bytes | "
      "optax fusions / temp bytes | same compiled program |",
      "|---|---|---|---|---|---|---|---|",
  ] + [f"| {n} | {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b:.3f} | {m:.3f} | "
       f"{x} | {y} | {z} |" for n, a, b, m, x, y, z in rows]
  args.results.parent.mkdir(parents=True, exist_ok=True)
  args.results.write_text("\n".join(lines) + "\n")
  print(f"wrote {args.results}")


if __name__ == "__main__":
  main()
