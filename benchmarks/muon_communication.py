"""What Muon's sharded step communicates per matrix, against gathering first.

For each FSDP x TP-sharded matrix on a ('data': 2, 'model': 4) mesh of 8
simulated CPU devices, three compiled steps of
``shardopt.contrib.scale_by_muon()`` (momentum, then 5 Newton-Schulz
iterations) on that one matrix, each with the momentum sharded like the
param (shardings derived by ``plan_state_shardings``):

* auto: the library's step on a mesh with Auto axes; XLA's sharding
  propagation partitions the Newton-Schulz matmuls;
* explicit: the library's step on a mesh with Explicit axes (the default of
  ``jax.make_mesh``), where the step itself lays the matrix out: rows (the
  Gram side) gathered once, columns kept sharded, one all-reduce of the
  (m, m) Gram matrix per iteration;
* gather-first (baseline, Auto axes): the same momentum update, then the
  debiased momentum is all-gathered (constrained to be replicated) and every
  device orthogonalises the whole matrix, keeping its own block.

From each compiled program (``compiled.as_text()``): its collectives by kind
with their per-device result bytes and the bytes a device sends
(``partitioning.collectives``); its FLOPs per device
(``compiled.cost_analysis()``); and the median step time, the three steps
timed in rotating order in one process. XLA:CPU emits all-reduce +
dynamic-slice where GPUs emit reduce-scatter (JAX-NOTES). All sizes even.

Run from the repository root:  python -m benchmarks.muon_communication
Writes benchmarks/results/muon_communication.md.
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
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from partitioning.collectives import collectives
from partitioning.collectives import summarize_collectives
import shardopt
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.adam import debiased_first_moment
from shardopt.contrib._newton_schulz import orthogonalize_via_newton_schulz

RESULTS = pathlib.Path(__file__).parent / "results" / "muon_communication.md"
MATRICES = (  # name, shape, spec: FSDP ('data') x TP ('model')
    ("very wide (128, 2048)", (128, 2048), P("data", "model")),
    ("wide (256, 1024)", (256, 1024), P("data", "model")),
    ("wide (256, 512)", (256, 512), P("data", "model")),
    ("square (512, 512)", (512, 512), P("data", "model")),
    ("tall (512, 256)", (512, 256), P("model", "data")),
)
BETA = 0.95


def meshes():
  """program name -> its mesh (Auto or Explicit axes, same devices)."""
  make = lambda kind: jax.make_mesh((2, 4), ("data", "model"),
                                    axis_types=(kind,) * 2)
  auto = make(AxisType.Auto)
  return {"auto": auto, "explicit": make(AxisType.Explicit),
          "gather-first": auto}


def _gather_first(replicated):
  """scale_by_muon's update with the debiased momentum gathered first."""

  def update(g, state):
    mu = tree_math.update_moment(g, state.mu, BETA, 1)
    count = numerics.safe_increment(state.count)
    mu_hat = debiased_first_moment(g, mu, BETA, count, True)
    gathered = jax.lax.with_sharding_constraint(mu_hat, replicated)
    orthogonal = jax.lax.with_sharding_constraint(
        orthogonalize_via_newton_schulz(gathered, state.ns_coeffs),
        replicated)
    return orthogonal, state._replace(count=count, mu=mu)

  return update


class Step:
  """One program's compiled step on one matrix: collectives, FLOPs, timing."""

  def __init__(self, name, the_mesh, shape, spec):
    tx = shardopt.contrib.scale_by_muon()
    sharding = NamedSharding(the_mesh, spec)
    param = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)
    state_shardings = shardopt.plan_state_shardings(tx, param,
                                                    sharding).shardings
    update = (_gather_first(NamedSharding(the_mesh, P()))
              if name == "gather-first" else tx.update)
    self.mesh = the_mesh
    with jax.set_mesh(the_mesh):
      self.jitted = jax.jit(update, in_shardings=(sharding, state_shardings),
                            out_shardings=(sharding, state_shardings),
                            donate_argnums=(1,))
      self.grad = jax.device_put(
          jax.random.normal(jax.random.PRNGKey(0), shape), sharding)
      self.state = shardopt.sharded_init(tx, sharding, state_shardings)(
          jax.device_put(jnp.zeros(shape, jnp.float32), sharding))
      compiled = self.jitted.lower(self.grad, self.state).compile()
    self.summary = summarize_collectives(collectives(compiled.as_text()))
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    self.flops = float(cost.get("flops", 0.0))
    self.times = []

  def run(self) -> jax.Array:
    with jax.set_mesh(self.mesh):
      start = time.perf_counter()
      updates, self.state = self.jitted(self.grad, self.state)
      jax.block_until_ready((updates, self.state))
      self.times.append(time.perf_counter() - start)
    return updates

  @property
  def sent(self) -> float:
    return sum(v["wire_bytes"] for v in self.summary.values())

  @property
  def result(self) -> float:
    return sum(v["result_bytes"] for v in self.summary.values())


def measure(shape, spec, steps: int = 0, rounds: int = 1) -> dict:
  """program name -> Step for one matrix, each timed ``steps`` times in
  ``rounds`` rotating rounds (after one warm-up step, not timed)."""
  steps_by_name = {name: Step(name, m, shape, spec)
                   for name, m in meshes().items()}
  for step in steps_by_name.values():
    step.run()
    step.times.clear()
  names = list(steps_by_name)
  for r in range(rounds):
    for name in names[r % len(names):] + names[:r % len(names)]:
      for _ in range(steps // rounds):
        steps_by_name[name].run()
  return steps_by_name


def _kinds(summary) -> str:
  return ", ".join(f"{v['count']} {k}" for k, v in sorted(summary.items()))


def _rows(name, shape, spec, runs) -> list[str]:
  matrix = 4 * shape[0] * shape[1]
  base = runs["gather-first"]
  rows = []
  for program, run in runs.items():
    ms = 1e3 * statistics.median(run.times) if run.times else float("nan")
    rows.append(
        f"| {name} | {tuple(spec)} | {program} | {_kinds(run.summary)} | "
        f"{run.result / matrix:.2f} | {run.sent / matrix:.2f} | "
        f"{run.sent / base.sent:.2f} | {run.flops / 1e6:.1f} | "
        f"{run.flops / base.flops:.3f} | {ms:.2f} |")
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--results", type=pathlib.Path, default=RESULTS)
  args = parser.parse_args()
  rows = []
  for name, shape, spec in MATRICES:
    rows += _rows(name, shape, spec, measure(shape, spec, args.steps,
                                             args.rounds))
    print("\n".join(rows[-3:]), flush=True)
  command = "python -m benchmarks.muon_communication " + " ".join(sys.argv[1:])
  args.results.write_text(_report(command.strip(), rows, args))


def _report(command, rows, args) -> str:
  load = os.getloadavg()[0]
  return f"""# Muon's sharded step: communication per matrix

Command: `{command}` (from the repository root)

One float32 matrix per row group, FSDP x TP-sharded on a ('data': 2,
'model': 4) mesh of 8 simulated CPU devices; `shardopt.contrib.scale_by_muon()`
(5 Newton-Schulz iterations, Gram matrix over the smaller side), momentum
sharded like the param in every program. *auto*: the library's step on Auto
axes, the Newton-Schulz matmuls partitioned by XLA's propagation.
*explicit*: the library's step on Explicit axes, where it gathers the rows
(Gram side) once and all-reduces the (m, m) Gram matrix each iteration.
*gather-first*: the same momentum update, then the debiased momentum
all-gathered and orthogonalised whole on every device. Collectives are
parsed from `compiled.as_text()` (`partitioning.collectives`); *result* is
the sum of their per-device result bytes and *sent* the bytes one device
sends with ring algorithms (all-reduce 2(k-1)/k S, all-gather (k-1)/k S,
collective-permute S), both in units of the matrix's full size; *vs gather*
divides by gather-first's; MFLOP/device from `compiled.cost_analysis()`;
ms is the median of {args.steps} steps per program in {args.rounds} rotating
rounds (machine load {load:.1f} on 2 shared cores: noisy). XLA:CPU emits
all-reduce + dynamic-slice where GPUs emit reduce-scatter.

How to read it. For an (m, n) matrix, m <= n, rows over 'data' (2) and
columns over 'model' (4), *explicit* sends 4 bytes x (m n / 8 + 7.5 m^2),
plus 6 bytes for the norm (tests/test_contrib_muon.py checks this formula
against the compiled HLO), and *gather-first* 4 bytes x 7/8 m n: the
sharded orthogonalisation moves fewer bytes than gathering the matrix only
when n >= 10 m, and pays for keeping the columns sharded with one Gram
all-reduce per iteration otherwise. *auto* (XLA's choice) sends the most but
splits every matmul over all 8 devices (1/8 of the FLOPs); *explicit*
repeats the (m, m) products on every device. On these simulated CPU devices
time follows FLOPs, not bytes; on a real interconnect weigh *sent* against
*MFLOP/device*.

| matrix | spec | program | collectives | result (x matrix) | sent (x matrix) | sent vs gather | MFLOP/device | FLOP vs gather | ms |
|---|---|---|---|---|---|---|---|---|---|
""" + "\n".join(rows) + "\n"


if __name__ == "__main__":
  main()
