"""Per-device memory of a 7B model on 256 devices and a 70B model on 2,048.

Abstract meshes (no devices needed): params laid out by the ``fsdp_tp``
preset of ``partitioning.decoder_rules``, gradients as the sharded step holds
them (in the params' shardings), AdamW state derived by
``shardopt.plan_state_shardings`` with ZeRO over the ``fsdp`` axis. Each tree
is compared with its ideal, total bytes / devices.

  7B:  LLaMA-7B shapes (6.74e9 params), mesh fsdp=16 x model=16, a
       ``layers_N`` subtree per layer.
  70B: LLaMA-2-70B shapes (6.90e10 params, grouped-query attention with 8
       key/value heads), mesh fsdp=256 x model=8, layers stacked (scanned)
       under ``layers/`` by the stacked preset.

Run from the repository root:  python -m benchmarks.memory_plans
Writes benchmarks/results/memory_plans.md.
"""

import pathlib
import sys
from typing import NamedTuple
import warnings

import jax

import partitioning
import shardopt

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "memory_plans.md"
ZERO_AXIS = "fsdp"


class Model(NamedTuple):
  shapes: dict  # param tree of ShapeDtypeStruct
  mesh: dict  # mesh axis -> size
  stacked: bool  # layers stacked under layers/ (scanned)


def models() -> dict[str, Model]:
  return {
      "7B": Model(partitioning.decoder_param_shapes(
          32000, 4096, 32, 11008, 32, gated_mlp=True),
          {"fsdp": 16, "model": 16}, False),
      "70B": Model(partitioning.decoder_param_shapes(
          32000, 8192, 80, 28672, 64, gated_mlp=True, kv_heads=8, stacked=True),
          {"fsdp": 256, "model": 8}, True),
  }


def plan(model: Model, tx) -> tuple[partitioning.MemoryPlan, shardopt.StatePlan]:
  """The memory plan of params, gradients and ``tx``'s state with ZeRO."""
  mesh = partitioning.make_abstract_mesh(model.mesh)
  rules = partitioning.decoder_rules("fsdp_tp", stacked=model.stacked)
  params = partitioning.sharded_abstract_params(rules, model.shapes, mesh)
  shardings = jax.tree.map(lambda p: p.sharding, params)
  with warnings.catch_warnings():  # leaves already split over fsdp: listed
    warnings.simplefilter("ignore", shardopt.ReplicatedStateWarning)
    state_plan = shardopt.plan_state_shardings(
        tx, params, shardings, shard_state_over=ZERO_AXIS)
  state = partitioning.abstract_params(jax.eval_shape(tx.init, params),
                                       state_plan.shardings)
  return partitioning.memory_plan(params, state, grads=params), state_plan


def _rows(memory: partitioning.MemoryPlan) -> list[str]:
  rows = []
  for name, tree in (("params", memory.params), ("gradients", memory.grads),
                     ("AdamW state", memory.state)):
    rows.append(
        f"| {name} | {partitioning.format_bytes(tree.total_bytes)} | "
        f"{tree.per_device_bytes:,} ({partitioning.format_bytes(tree.per_device_bytes)}) | "
        f"{tree.ideal_bytes:,.0f} | {tree.ratio:.4f} |")
  return rows


def main() -> None:
  lines = ["# Per-device memory plans: 7B on 256 devices, 70B on 2,048", "",
           ("Command: `python -m benchmarks.memory_plans` (from the repository "
           "root; abstract meshes, no devices needed)"), "",
           ("Params by the `fsdp_tp` preset, gradients in the params' "
           "shardings (as the sharded step holds them), AdamW state (float32 "
           f"mu, nu) derived by `shardopt.plan_state_shardings` with ZeRO over "
           f"`{ZERO_AXIS}`. Ideal = total bytes / devices; the test "
           "`tests/test_memory_plan_7b.py` checks every ratio is within 2%."), ""]
  for name, model in models().items():
    memory, state_plan = plan(model, shardopt.adamw(1e-4))
    count = sum(p.size for p in jax.tree.leaves(model.shapes))
    mesh = " x ".join(f"{k}={v}" for k, v in model.mesh.items())
    layout = "stacked layers" if model.stacked else "a subtree per layer"
    lines += [(f"## {name}: {count:,} params, {memory.num_devices} devices "
              f"({mesh}), {layout}"), "",
              "| tree | total | per device (bytes) | ideal (bytes) | per-device / ideal |",
              "|---|---|---|---|---|", *_rows(memory), "",
              (f"ZeRO over `{ZERO_AXIS}`: {len(state_plan.zero_sharded)} state "
              f"leaves sharded by ZeRO, {len(state_plan.zero_skipped)} left as "
              "they were (already split over it by the params' layout) of "
              f"{len(state_plan.leaves)}."), ""]
    print(f"{name}:\n{memory.table()}\n")
  RESULTS.parent.mkdir(parents=True, exist_ok=True)
  RESULTS.write_text("\n".join(lines))
  print(f"wrote {RESULTS}")


if __name__ == "__main__":
  sys.exit(main())
