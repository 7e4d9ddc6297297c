"""8-bit and 4-bit optimizer state against float32 state, sharded.

For each optimizer, float32 state against ``shardopt.quantized_state`` (8 and
4 bits, its default ``block_layout="portable"``: where they can, blocks that
fit every mesh of the device count), each with
both code families of ``quantized_state(..., code=)``: ``dynamic``
(Dettmers et al.) and ``companded`` (FlashOptim), on:

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
* the optimizer state's bytes on disk (``checkpoints.CheckpointManager``);
* where the update's time goes: operations per element of quantizing and
  dequantizing with each code book, the kernels of the compiled update and
  each kind's kernel time from a profile.

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
import re
import sys
import tempfile
import time
import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from benchmarks import low_precision
from benchmarks import resident
from benchmarks import timing
from benchmarks.variants import VARIANTS
from benchmarks.variants import label
import checkpoints
from launch import data
from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
import partitioning
import shardopt
from shardopt._src.quantization import blocks
from shardopt._src.quantization import codes

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "quantized_state.md"
BATCH, LENGTH, EVAL_BATCHES, WARMUP = 32, 65, 4, 20
SAVES = 3  # checkpoint sizes: fresh saves of the same state

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
LARGE = ModelConfig(d_model=512, head_dim=128, mlp=2048)


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


def build(name, variant, steps, min_size=4096):
  peak, factory = OPTIMIZERS[name]
  schedule = shardopt.warmup_cosine_decay_schedule(
      0.0, peak, WARMUP, steps, end_value=0.1 * peak)
  tx = shardopt.chain(shardopt.clip_by_global_norm(1.0), factory(schedule))
  if variant is None:
    return tx
  bits, code = variant
  return shardopt.quantized_state(tx, bits=bits, min_size=min_size, code=code)


def state_bytes(state, n_params, devices):
  """(bytes per param over unique shards, max per-device bytes / ideal)."""
  unique, per_device = resident.unique_and_per_device(state)
  return unique / n_params, max(per_device.values()) / (unique / devices)


def train_lm(name, variant, seeds, steps, setup, corpus):
  mesh, model, shapes, shardings, init = setup
  tx = build(name, variant, steps)
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


def measure_layout(name, variant, setup, n_params, corpus, steps=20):
  """After ``steps`` training steps (so the state is not all zeros): state
  bytes per param, per-device ratios (all state; state of the matrices),
  checkpoint bytes, and the optimizer with its params and state."""
  mesh, model, shapes, shardings, init = setup
  opt = shardopt.make_sharded_optimizer(build(name, variant, 200),
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
  saves = [_saved_bytes(state) for _ in range(SAVES)]
  disk = tuple((min(kind), max(kind)) for kind in zip(*saves))
  return opt, params, state, per_param, ratio, disk


def _saved_bytes(state) -> tuple[int, int]:
  """(bytes of the data files ``d/``, bytes of all files) of ``state``
  saved alone as a fresh checkpoint."""
  with tempfile.TemporaryDirectory() as tmp:
    with checkpoints.CheckpointManager(tmp) as manager:
      manager.save(0, {"opt_state": state}, force=True)
      manager.wait_until_finished()
    files = [f for f in pathlib.Path(tmp).rglob("*") if f.is_file()]
    return (sum(f.stat().st_size for f in files if f.parent.name == "d"),
            sum(f.stat().st_size for f in files))


def _grads(setup):
  return jax.tree.map(lambda p: 1e-3 * jnp.ones_like(p),
                      setup[-1](jax.random.key(1)))


def layout_table(tree, setup, corpus):
  """Rows of the layout table (float32 and each quantized AdamW variant) for
  one tree, and the optimizers with their params and state."""
  n_params = sum(x.size for x in jax.tree.leaves(setup[2]))
  rows, layouts = [], {}
  for variant in VARIANTS:
    opt, params, state, per_param, ratio, disk = measure_layout(
        "adamw", variant, setup, n_params, corpus)
    layouts[variant] = (opt, params, state)
    rows.append((variant, per_param, ratio, disk))
  step_times = timing.interleaved(layouts, _grads(setup))
  disk32 = rows[0][3]
  return [
      f"| {tree} ({n_params:,}) | {label(v)} |"
      f" {pp:.3f} | {r[0]:.3f} | {r[1]:.3f} |"
      f" {step_times[v][0] * 1e3:.2f} ms ({step_times[v][1]:.2f}x) |"
      f" {_span(d[0])} ({d[0][0] / disk32[0][0]:.1%}) |"
      f" {_span(d[1])} ({d[1][0] / disk32[1][0]:.1%}) |"
      for v, pp, r, d in rows], layouts


def _span(low_high) -> str:
  low, high = low_high
  return f"{low:,}" if low == high else f"{low:,} to {high:,}"


def _unsharded(tx):
  """``tx`` as ``opt.update(grads, state, params) -> (params, state)``,
  jitted with params and state donated, on the default device. The jitted
  step takes ``(params, grads, state)``: donated buffers come back in the
  order they were passed (passed as ``(state, params)``, XLA:CPU copied
  float32 state at every call, 77 copies on the wide tree, and float32's
  update took 1.5-1.7x its time in two interleaved runs)."""
  def step(params, grads, state):
    updates, state = tx.update(grads, state, params)
    return shardopt.apply_updates(params, updates), state
  jitted = jax.jit(step, donate_argnums=(0, 2))
  return types.SimpleNamespace(
      update=lambda grads, state, params: jitted(params, grads, state))


def _llc_text() -> str:
  """The last-level cache's size as the OS reports it, for the results."""
  caches = sorted(pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
  return (f"{caches[-1].read_text().strip()} on this machine" if caches
          else "size not reported by the OS")


def one_device_rows():
  """Rows of the one-device table: AdamW's update time per state variant on
  the wide tree and on one whose float32 state alone exceeds the CPU's
  last-level cache, no mesh; first with glibc's default allocation, then
  with freed memory kept (``timing.keep_freed_memory``, for the rest of the
  process); and the seconds ``jit(tx.init)`` takes to compile."""
  trees = {}
  for tree, config in (("wide", WIDE), ("large", LARGE)):
    init = jax.jit(lambda key, c=config: Transformer(c).init(
        key, jnp.zeros((1, LENGTH - 1), jnp.int32))["params"])
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 1e-3, p.dtype),
                         jax.eval_shape(init, jax.random.key(1)))
    layouts, compile_seconds = {}, {}
    for variant in VARIANTS:
      tx = build("adamw", variant, 200)
      params = init(jax.random.key(0))
      start = time.perf_counter()
      tx_init = jax.jit(tx.init).lower(params).compile()
      compile_seconds[variant] = time.perf_counter() - start
      layouts[variant] = (_unsharded(tx), params, tx_init(params))
    trees[tree] = (grads, layouts, compile_seconds, timing.interleaved(layouts, grads))
  timing.keep_freed_memory()
  rows = []
  for tree, (grads, layouts, compile_seconds, default) in trees.items():
    kept = timing.interleaved(layouts, grads)
    n_params = sum(x.size for x in jax.tree.leaves(grads))
    rows += [f"| {tree} ({n_params:,}; float32 state {8 * n_params / 2**20:.0f} MiB)"
             f" | {label(v)} | {default[v][0] * 1e3:.2f} ms ({default[v][1]:.2f}x)"
             f" | {kept[v][0] * 1e3:.2f} ms ({kept[v][1]:.2f}x)"
             f" | {compile_seconds[v]:.2f} s |" for v in VARIANTS]
    print("\n".join(rows[-len(VARIANTS):]), flush=True)
  return rows


# --- where the time goes ---------------------------------------------------

_STRUCTURAL = {"reshape", "broadcast_in_dim", "squeeze", "expand_dims", "pjit"}


def _elementwise_ops(fn, arg, size: int) -> int:
  """Operations in ``fn(arg)``'s jaxpr with an output of ``size`` elements
  (or half as many, 4-bit pairs): the work per element, reshapes and
  broadcasts left out, and of a choice by platform only this backend's
  branch (the choice itself is no operation)."""
  sizes = {size, size // 2}
  def count(jaxpr):
    n = 0
    for eqn in jaxpr.eqns:
      for sub in _compiled_here(eqn):
        n += count(sub)
      if eqn.primitive.name not in _STRUCTURAL and not eqn.params.get(
          "branches_platforms") and any(
          getattr(v.aval, "size", 0) in sizes for v in eqn.outvars):
        n += 1
    return n
  return count(jax.make_jaxpr(fn)(arg).jaxpr)


def _compiled_here(eqn):
  """The sub-jaxprs of ``eqn`` that this backend compiles: of a
  ``jax.lax.platform_dependent`` choice, only this backend's branch."""
  platforms = eqn.params.get("branches_platforms")
  if not platforms:
    return jax.extend.core.jaxprs_in_params(eqn.params)
  for branch, names in zip(eqn.params["branches"], platforms):
    if names is None or jax.default_backend() in names:
      return [branch.jaxpr]
  return []


def op_rows() -> list[str]:
  """Per code book: its largest error and the elementwise operations of
  quantizing and dequantizing a (256, 1024) leaf (tile (1, 256) at 8 bits,
  (1, 128) at 4)."""
  rows = []
  x = jax.ShapeDtypeStruct((256, 1024), jnp.float32)
  for bits in (8, 4):
    tile = (1, 256 if bits == 8 else 128)
    for code in codes.CODES:
      for signed in (True, False):
        book = codes.code_book(bits, signed, code)
        quantize = lambda v: blocks.quantize(v, tile, book, bits)
        stored = jax.eval_shape(quantize, x)
        dequantize = lambda q: blocks.dequantize(q, tile, book, bits, jnp.float32)
        rows.append(
            f"| {bits} | {code} | {'signed' if signed else 'non-negative'} |"
            f" `{book.name}` | {codes.max_error(book):.4g} |"
            f" {_elementwise_ops(quantize, x, x.size)} |"
            f" {_elementwise_ops(dequantize, stored, x.size)} |")
  return rows


def _kernels(hlo: str) -> collections.Counter:
  """Kernels of a compiled program's entry computation, by kind."""
  entry = hlo[hlo.index("ENTRY"):]
  return collections.Counter(re.findall(
      r"= \S+ (fusion|copy|concatenate|all-gather|all-reduce|all-to-all"
      r"|collective-permute)(?:-start)?\(", entry))


def _kernel_times(opt, params, state, grads, steps=10) -> collections.Counter:
  """Per kernel kind (XLA's fusion name without its number): the sum over
  the kind's kernels of each one's shortest run (over devices and steps),
  times 8 devices. Shortest runs leave out most of the other processes'
  load; collectives (their runs include waiting for the slowest device) are
  summed as one kind. Only the update's program counts (the program with
  the most kernel runs in the trace: a process's first trace also holds
  kernels of programs that ran before it started)."""
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp)
    for _ in range(steps):
      params, state = opt.update(grads, state, params)
      jax.block_until_ready(state)
    jax.profiler.stop_trace()
    trace = next(pathlib.Path(tmp).rglob("*.xplane.pb"))
    profile = jax.profiler.ProfileData.from_file(str(trace))
  runs = collections.defaultdict(list)  # program id -> [(kernel, ns)]
  for plane in profile.planes:
    for line in plane.lines:
      for event in line.events:
        stats = dict(event.stats)
        if "hlo_op" in stats and "program_id" in stats:
          runs[stats["program_id"]].append((stats["hlo_op"], event.duration_ns))
  shortest = {}
  for name, ns in max(runs.values(), key=len):
    shortest[name] = min(shortest.get(name, np.inf), ns)
  kinds = collections.Counter()
  for name, ns in shortest.items():
    kind = re.sub(r"[.\d]+$", "", name)
    kinds["collectives" if kind.startswith("all-") else kind] += ns * 8 / 1e3
  return kinds


def breakdown_tables(layouts, setup):
  """(kernel counts, kernel times in microseconds) per variant, as rows."""
  grads = _grads(setup)
  counts, times = {}, {}
  for variant, (opt, params, state) in layouts.items():
    counts[variant] = _kernels(
        opt.update.lower(grads, state, params).compile().as_text())
    times[variant] = _kernel_times(opt, params, state, grads)
  header = ["| kernel | " + " | ".join(label(v) for v in layouts) + " |",
            "|---" * (len(layouts) + 1) + "|"]
  kinds = sorted({k for c in counts.values() for k in c})
  count_rows = header + [
      f"| {k} | " + " | ".join(str(counts[v][k]) for v in layouts) + " |"
      for k in kinds]
  names = sorted({k for t in times.values() for k in t},
                 key=lambda k: -max(t[k] for t in times.values()))
  time_rows = header + [
      f"| {k} | " + " | ".join(f"{times[v][k]:,.0f}" for v in layouts) + " |"
      for k in names if max(t[k] for t in times.values()) >= 100] + [
      "| all | " + " | ".join(f"{sum(times[v].values()):,.0f}"
                              for v in layouts) + " |"]
  return count_rows, time_rows


def mlp_rows(steps):
  params, loss_fn = low_precision.make_problem(width=256)
  rows = []
  for name in OPTIMIZERS:
    f32, _ = low_precision.train(build(name, None, steps), params,
                                 loss_fn, steps)
    cells = [f"{f32:.5f}"]
    for variant in VARIANTS[1:]:
      loss, _ = low_precision.train(build(name, variant, steps, 256),
                                    params, loss_fn, steps)
      cells.append(f"{loss:.5f} ({(loss - f32) / f32:+.2%})")
    rows.append(f"| {name} | " + " | ".join(cells) + " |")
    print(rows[-1], flush=True)
  return rows


def lm_row(name, seeds, steps, setup, corpus) -> str:
  """One row of the LM table: float32 and quantized held-out losses."""
  base = train_lm(name, None, seeds, steps, setup, corpus)
  cells = [f"{base.mean():.4f} ± {base.std():.4f}"]
  for variant in VARIANTS[1:]:
    if variant[0] not in LM_BITS[name]:
      cells.append("not run")
      continue
    q = train_lm(name, variant, seeds, steps, setup, corpus)
    rel = (q.mean() - base.mean()) / base.mean()
    cells.append(f"{q.mean():.4f} ± {q.std():.4f} ({rel:+.2%})")
    print(name, label(variant), cells[-1], flush=True)
  return f"| {name} | " + " | ".join(cells) + " |"


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--mlp-steps", type=int, default=300)
  parser.add_argument("--optimizers", default=",".join(OPTIMIZERS),
                      help="comma-separated LM rows to run (AdamW's first)")
  args = parser.parse_args(argv)
  names = args.optimizers.split(",")
  unknown = sorted(set(names) - set(OPTIMIZERS))
  if unknown:
    parser.error(f"--optimizers: unknown {unknown}; expected some of "
                 f"{list(OPTIMIZERS)}")
  command = "python -m benchmarks.quantized_state " + " ".join(
      sys.argv[1:] if argv is None else argv)
  setup = lm_setup()
  corpus = data.load_corpus()
  seeds = list(range(args.seeds))

  results = collections.defaultdict(list)
  write = lambda status: write_results(command, args, results, status)
  results["ops"] = op_rows()
  for i, name in enumerate(names):
    results["lm"].append(lm_row(name, seeds, args.steps, setup, corpus))
    print(results["lm"][-1], flush=True)
    write("partial: LM runs, layout and MLP still running")
    if i == 0:
      for tree, config in (("demo", DEMO), ("wide", WIDE)):
        tree_setup = setup if config is DEMO else lm_setup(config)
        rows, layouts = layout_table(tree, tree_setup, corpus)
        results["layout"] += rows
        print("\n".join(rows), flush=True)
      results["kernels"], results["kernel_times"] = breakdown_tables(
          layouts, tree_setup)
      write("partial: LM runs, MLP and one device still running")
      results["mlp"] = mlp_rows(args.mlp_steps)
      results["one_device"] = one_device_rows()
  write("")


def write_results(command, args, results, status) -> None:
  variants = " | ".join(label(v) for v in VARIANTS)
  rule = "|---" * (len(VARIANTS) + 1) + "|"
  RESULTS.parent.mkdir(exist_ok=True)
  RESULTS.write_text("\n".join([
      "# Quantized (8-bit / 4-bit) optimizer state against float32 state",
      "",
      *([f"Status: {status}.", ""] if status else []),
      (f"Command: `{command.strip()}` (from the repository root; CPU, 8 simulated"
       f" devices, jax {jax.__version__}). Quantized state: `shardopt.quantized_state`"
       " with its default block sizes (256 at 8 bits, 128 at 4 bits) and its"
       " default `block_layout=\"portable\"` (where they can, blocks that fit every"
       " mesh of the device count), and each code family"
       " (`code=\"dynamic\"`: Dettmers et al.'s dynamic code, at 4 bits Li et al.'s"
       " linear zero-free code of the root for second moments; `code=\"companded\"`:"
       " FlashOptim's companded `2x / (1 + |x|)` for signed moments, a zero-free"
       " unsigned minifloat of the value for second moments: e5m3 at 8 bits, the"
       " powers of two at 4; the default at both widths)."),
      "",
      "## AdamW state on the LM trees, data=2 x model=4, ZeRO over data",
      "",
      ("State bytes per param: every leaf's unique shards (`addressable_shards`,"
      " replicas counted once) over the param count. Per-device / ideal: the"
      " fullest device's state bytes over (all state bytes / 8); the norm scales"
      " (64 elements) are below ZeRO's 4 KiB threshold and replicate (next column:"
      " all other leaves). Measured after 20 training steps. Step time:"
      " median of 15 interleaved rounds of 10 donated `opt.update` calls on the"
      " same sharded tree, and in parentheses the median over the rounds of its"
      " time over float32's in the same round (the machine is shared: absolute"
      " times vary with its load, ratios much less). Checkpoint: the optimizer"
      f" state alone saved with `checkpoints.CheckpointManager`, {SAVES} fresh saves"
      " of the same state, smallest to largest (in parentheses the smallest"
      " over float32's smallest): the data files (`d/`: the arrays' chunks and"
      " OCDBT's own records; their total varies between saves of the same"
      " state) and all files of the"
      " step (adds per-leaf metadata: paths, shardings, checksums; quantized"
      " state has two leaves per moment)."),
      "",
      (f"Trees: the demo model and a wider one ({WIDE}), both 'tp' rules."),
      "",
      ("| tree (params) | state | bytes / param | per-device / ideal | same, without"
       " the norm scales' state | step time (vs float32) | checkpoint data files"
       " bytes (vs float32) | checkpoint all files (vs float32) |"),
      "|---|---|---|---|---|---|---|---|",
      *results["layout"],
      "",
      "## AdamW update on one device, no mesh",
      "",
      ("The same AdamW (clipping, schedule) as plain `jax.jit` of `tx.update`"
       " and `apply_updates` on the default device (one of the 8; the others"
       " idle), params and state donated (the step takes params, grads, state"
       " and returns params, state: donated buffers back in the order they"
       " came, or XLA:CPU copies the state at every call); timed as above."
       f" The wide tree and a larger one ({LARGE}) whose float32 state alone"
       f" is larger than this CPU's last-level cache ({_llc_text()}), where"
       " the update is bound by memory traffic as a large model's is. XLA:CPU"
       " allocates an update's temporaries (the decoded first moments, the"
       " clipped gradients) at every call; with glibc's default allocation"
       " those over 32 MiB are fresh pages, faulted in at every call. The next"
       " column keeps freed memory (`mallopt`, as a pooling allocator would;"
       " measured after the first, in the same process). Compile: seconds to"
       " compile `jit(tx.init)` (moments that start as constants are quantized"
       " when init runs, not by XLA's constant folder while compiling)."),
      "",
      ("| tree (params) | state | step time (vs float32), glibc default |"
       " step time (vs float32), freed memory kept | init compile |"),
      "|---|---|---|---|---|",
      *results["one_device"],
      "",
      "## Where the update's time goes",
      "",
      ("Per code book: the largest error of a stored value (`codes.max_error`,"
       " in units of the block's absmax; for a root book of the root, in units"
       " of the absmax's root) and the elementwise operations per element of"
       " quantizing and dequantizing a (256, 1024) leaf (operations in the"
       " traced program whose output has one value per element, or per pair at"
       " 4 bits; reshapes and broadcasts left out). Quantizing also reduces each"
       " block to its largest and smallest value (one loop over the moment's"
       " computation)."),
      "",
      ("| bits | code | moments | book | max error | quantize ops / element |"
       " dequantize ops / element |"),
      "|---|---|---|---|---|---|---|",
      *results["ops"],
      "",
      ("Kernels of the compiled AdamW update (`opt.update`) on the wide tree,"
       " one device's program (every device runs the same): loops are XLA"
       " fusions, each one pass over its operands."),
      "",
      *results["kernels"],
      "",
      ("Kernel time of one update on the wide tree in microseconds, by kernel"
       " kind (XLA's fusion names): from a `jax.profiler` trace of 10 updates"
       " (the update's program's kernels only), the sum over kernels of each"
       " one's shortest run on any device, times the 8 devices: the CPU time"
       " the kernels need with the other processes' load left out. Collectives'"
       " runs include waiting for the slowest device. Kinds under 100 us in"
       " every column left out of the rows (not of `all`)."),
      "",
      *results["kernel_times"],
      "",
      f"## LM demo: held-out loss after {args.steps} steps, {args.seeds} seeds (mean ± std)",
      "",
      (f"`launch.model` defaults (d_model 64, 2 layers, vocab 256), batch {BATCH} x"
      f" {LENGTH - 1} tokens, warmup {WARMUP} + cosine to 0.1 x peak, clip 1.0;"
      f" loss on {EVAL_BATCHES} held-out batches. Relative difference of the means"
      " in parentheses. Peak learning rates: "
       + ", ".join(f"{k} {v[0]:g}" for k, v in OPTIMIZERS.items()) + "."),
      "",
      f"| optimizer | float32 state | {variants[len('float32 | '):]} |",
      rule,
      *results["lm"],
      "",
      (f"## MLP regression (benchmarks/low_precision.py, width 256), {args.mlp_steps}"
       " full-batch steps, final loss"),
      "",
      ("Loss goes towards 0 here, so relative differences exaggerate (see"
       " low_precision.md). `min_size=256` so both layers are quantized."),
      "",
      f"| optimizer | {variants} |",
      rule,
      *results["mlp"],
      "",
  ]))


if __name__ == "__main__":
  main()
