"""What the job reports (issue 20): held-out loss, norms, step time and MFU,
TensorBoard event files, a profile, a greedy sample; and the compiled
programs behind them (launch/steps.py), the data split they rely on
(launch/data.py) and the event-file writer (launch/tensorboard.py)."""

import argparse
import gzip
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import checkpoints
import partitioning
import shardopt
from launch import cli
from launch import data
from launch import optim
from launch import report
from launch import steps
from launch import tensorboard
from launch import throughput
from launch import train
from launch import train_loop
from launch import training_setup
from launch.model import ModelConfig
from launch.model import Transformer
from launch.model import next_token_loss
from launch.validation import checked_mesh
from tests import launch_helpers as h

TINY_MODEL = ModelConfig(layers=1, d_model=32, heads=2, head_dim=16, mlp=64)  # h.TINY's
BATCH, SEQ_LEN = 8, 17


def test_held_out_slice_is_never_trained_on():
  """A corpus whose last tenth is marked: no training batch holds a marked
  byte, every eval batch holds only marked bytes (from a paragraph start)."""
  corpus = np.full(20_000, ord("a"), np.uint8)
  corpus[50::100] = ord("\n")  # lines of 100 bytes
  corpus[18_010:18_012] = ord("\n")  # the first blank line after 90% (18,000)
  corpus[18_012:][corpus[18_012:] == ord("a")] = ord("b")  # the held-out text
  train_bytes, held_out = data.split(corpus)
  assert train_bytes.size == 18_012 and np.all(held_out == corpus[18_012:])
  for step in range(200):
    batch = data.batch_at(train_bytes, 0, step, 32, 65)
    assert not np.any(batch == ord("b"))
  batches = data.eval_batches(held_out, 8, 4, 65)
  assert batches.shape == (7, 4, 65)  # 1988 bytes hold 30 windows: 7 whole batches
  assert np.all(batches != ord("a"))
  np.testing.assert_array_equal(batches.reshape(-1), held_out[:7 * 4 * 65])


def test_the_longest_seq_len_has_a_training_window_and_a_prompt():
  """data.check_seq_len's bound: one byte more is refused naming it; at the bound a training
  window can be drawn and the sample's prompt (half a window) fits the held-out slice, one
  byte more would not. (Training and sampling at that length are not run here: attention
  holds a score matrix of the window squared per head, and the greedy sample runs a forward
  of the whole window per byte of its continuation.)"""
  train_bytes, held_out = data.split(data.load_corpus())
  with pytest.raises(ValueError, match=r"^--seq-len 200000: at most (\d+) ") as refused:
    data.check_seq_len(200000, train_bytes, held_out)
  longest = int(refused.value.args[0].split("at most ")[1].split()[0])
  data.check_seq_len(longest, train_bytes, held_out)
  with pytest.raises(ValueError, match=f"^--seq-len {longest + 1}: at most {longest} "):
    data.check_seq_len(longest + 1, train_bytes, held_out)
  assert data.batch_at(train_bytes, 0, 0, 2, longest).shape == (2, longest)
  assert (longest - 1) // 2 <= held_out.size < longest // 2  # the prompt fits; one more would not


def test_the_shipped_corpus_split():
  train_bytes, held_out = data.split(data.load_corpus())
  corpus = data.load_corpus()
  assert train_bytes.size + held_out.size == corpus.size
  assert 0.09 < held_out.size / corpus.size < 0.11
  assert bytes(train_bytes[-2:]) == b"\n\n"  # the held-out slice starts a paragraph


def test_train_step_norms_by_hand():
  """SGD on 0.5 * |w|^2: grads = w, update = -lr * clip(w), new = w + update."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  shardings = {"w": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "model"))}
  w = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
  lr, clip = 0.1, 2.0
  tx = shardopt.chain(shardopt.clip_by_global_norm(clip), shardopt.sgd(lr))
  opt = shardopt.make_sharded_optimizer(tx, {"w": w}, shardings, shard_state_over="data")
  params = jax.device_put({"w": jnp.array(w)}, shardings)
  loss_fn = lambda p, batch: 0.5 * jnp.sum(p["w"] ** 2) + 0 * jnp.sum(batch)
  step = steps.train_step(opt, loss_fn, optim.update_arguments("sgd"))
  new, _, loss, norms = step(params, opt.init(params), jnp.zeros((4,)))
  stats = steps.stats(loss, norms)
  assert set(stats) == set(steps.STATS)
  norm = float(np.sqrt(np.sum(w.astype(np.float64) ** 2)))
  update = lr * min(1.0, clip / norm) * norm
  np.testing.assert_allclose(float(stats["loss"]), 0.5 * norm**2, rtol=1e-6)
  np.testing.assert_allclose(float(stats["grad_norm"]), norm, rtol=1e-6)
  np.testing.assert_allclose(float(stats["update_norm"]), update, rtol=1e-6)
  np.testing.assert_allclose(float(stats["param_norm"]), norm - update, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(new["w"]), w * (1 - update / norm), rtol=1e-6)


@pytest.mark.parametrize("scale", [1e30, 1e-25, 0.1])
def test_train_step_norms_of_finite_trees_are_finite(scale):
  """SGD at lr ``scale`` on sum(w), w = 3 * scale: grads 1, update -scale, new params
  2 * scale. Summed as plain float32 squares, 1e30 overflowed (the update's and the params'
  norm null though 5.7e30 and 1.1e31 are finite) and 1e-25 underflowed to 0; the job's norms
  are each within 1e-6 of the float64 value. A non-finite param still gives an inf norm."""
  mesh = partitioning.make_mesh({"data": 2, "model": 4})
  shardings = {"w": jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "model"))}
  w = np.full((4, 8), 3 * scale, np.float32)
  opt = shardopt.make_sharded_optimizer(shardopt.sgd(scale), {"w": w}, shardings)
  loss_fn = lambda p, batch: jnp.sum(p["w"]) + 0 * jnp.sum(batch)
  step = steps.train_step(opt, loss_fn, optim.update_arguments("sgd"))
  params = jax.device_put({"w": jnp.array(w)}, shardings)
  _, _, _, norms = step(params, opt.init(params), jnp.zeros((4,)))
  root = math.sqrt(w.size)
  for name, expected in (("grad_norm", root), ("update_norm", root * scale),
                         ("param_norm", root * 2 * scale)):
    np.testing.assert_allclose(float(norms[name]), expected, rtol=1e-6, err_msg=name)
  w[0, 0] = np.inf
  params = jax.device_put({"w": jnp.array(w)}, shardings)
  _, _, _, norms = step(params, opt.init(params), jnp.zeros((4,)))
  assert float(norms["param_norm"]) == math.inf


def test_a_bucket_checkpoint_dir_reaches_the_checkpoints_as_a_url(monkeypatch):
  """The job made every --checkpoint-dir a local absolute path: gs://bucket/ck became
  CWD/gs:/bucket/ck, where a run with gcsfs installed wrote its checkpoints. The manager gets
  the URL (a local path it makes absolute itself)."""
  opened = []
  monkeypatch.setattr(checkpoints, "CheckpointManager",
                      lambda directory, policy: opened.append(os.fspath(directory)))
  for directory in ("gs://bucket/ck", "run/ck"):
    train_loop.open_manager(argparse.Namespace(
        checkpoint_dir=directory, keep_checkpoints=3))
  assert opened == ["gs://bucket/ck", "run/ck"]


def _flops(flags):
  """(FLOPs the job counts, FLOPs of the step's own lowering) of the tiny model's step."""
  args = cli.parse_args([*h.TINY, "--layers", "3", *flags])
  mesh, model = checked_mesh(args), training_setup.build_model(args)
  _, _, abstract = training_setup.param_layout(args, mesh, model)
  opt, state, step = training_setup.planned_step(args, model, abstract)
  batch = jnp.zeros((args.batch, args.seq_len), jnp.int32)
  counted = training_setup.counted_step(args, opt, model)
  _, flops = throughput.compile_step(step, abstract, state, batch, counted=counted)
  return flops, step.lower(abstract, state, batch).cost_analysis()["flops"]


def test_flops_of_a_scanned_model_count_every_layer():
  """XLA counts a loop's body once: the job counts a scanned model's step from a lowering with
  its layers written out, the FLOPs of the same model unscanned (within 0.1%)."""
  scanned, loop_once = _flops(["--scan-layers"])
  unscanned, _ = _flops([])
  np.testing.assert_allclose(scanned, unscanned, rtol=1e-3)
  assert loop_once < 0.7 * unscanned  # what the scanned program's own analysis gives


@pytest.mark.slow
def test_train_step_losses_equal_opt_train_step():
  """The job's step is ``opt.train_step`` with the norms: the same losses to float32 rounding.

  Not bit for bit: the norms make it another program, which XLA may compile to other
  instructions for the same update (on one CPU with AVX-512 the step-2 losses were 9e-8
  apart relative; on another they were equal)."""
  mesh = partitioning.make_mesh({"data": 4, "model": 2})
  model = Transformer(TINY_MODEL)
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, SEQ_LEN - 1), jnp.int32))["params"]
  specs = partitioning.match_partition_rules(partitioning.decoder_rules("tp"), shapes)
  shardings = partitioning.named_shardings(mesh, specs)
  opt = shardopt.make_sharded_optimizer(shardopt.adamw(1e-2), shapes, shardings,
                                        shard_state_over="data")
  loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
  train_bytes = data.split(data.load_corpus())[0]
  ours = steps.train_step(opt, loss_fn, optim.update_arguments("adamw"))
  losses = {}
  for name, step in (("opt", opt.train_step(loss_fn)), ("job", ours)):
    params = jax.jit(lambda key: model.init(key, jnp.zeros((1, SEQ_LEN - 1), jnp.int32))["params"],
                     out_shardings=shardings)(jax.random.key(0))
    state, losses[name] = opt.init(params), []
    for i in range(3):
      batch = data.sharded_batch(train_bytes, 0, i, BATCH, SEQ_LEN, mesh)
      params, state, loss, *_ = step(params, state, batch)
      losses[name].append(np.float32(loss))
  np.testing.assert_allclose(losses["job"], losses["opt"], rtol=1e-6)


def test_event_files_read_by_tensorboard(tmp_path):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  assert tensorboard.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
  writer = tensorboard.EventWriter(tmp_path)
  for step in range(1, 7):
    writer.scalars(step, {"train/loss": 10.0 - step, "eval/loss": None if step % 2 else step})
  writer.close()
  resumed = tensorboard.EventWriter(tmp_path, first_step=5)  # steps 5 and 6 again
  for step in (5, 6):
    resumed.scalars(step, {"train/loss": 100.0 + step, "eval/loss": math.nan})
  resumed.close()
  events = EventAccumulator(str(tmp_path))
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
      (1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0), (5, 105.0), (6, 106.0)]
  assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, 2.0), (4, 4.0)]


def _restored_params(folder, step):
  model = Transformer(TINY_MODEL)
  target = model.init(jax.random.key(1), jnp.zeros((1, SEQ_LEN - 1), jnp.int32))["params"]
  with checkpoints.CheckpointManager(folder / "checkpoints") as manager:
    return model, manager.restore_params(target, step).state


@pytest.mark.slow
def test_job_reports_held_out_loss_norms_mfu_tensorboard_profile_sample(tmp_path, capsys):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  out = tmp_path / "run"
  assert train.main([*h.TINY, "--cpu-devices", "0", "--out", str(out), "--steps", "6",
                     "--eval-every", "2", "--log-every", "3", "--checkpoint-every", "5",
                     "--profile-steps", "2:3", "--sample-every", "4"]) == 0
  printed = capsys.readouterr().out
  records = report.read_metrics(out / "metrics.jsonl")
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  assert [r["step"] for r in records if "eval_loss" in r] == [2, 4, 6]
  for r in records:
    for field in ("loss", "lr", "grad_norm", "update_norm", "param_norm", "step_time",
                  "tokens_per_s", "mfu"):
      assert r[field] is not None and math.isfinite(r[field]) and r[field] > 0, (field, r)
    np.testing.assert_allclose(r["tokens_per_s"], BATCH * (SEQ_LEN - 1) / r["step_time"])
    assert r["mfu"] < 1
  for step in (2, 4, 6):
    assert any(f"step {step:>5}/6" in line and " eval " in line for line in printed.splitlines())

  # Step 6 recomputed from the checkpoints of steps 5 and 6 (the model and data functions).
  model, before = _restored_params(out, 5)
  _, after = _restored_params(out, 6)
  train_bytes, held_out = data.split(data.load_corpus())
  loss_fn = lambda p, tokens: next_token_loss(model, p, tokens)
  loss, grads = jax.value_and_grad(loss_fn)(before, data.batch_at(train_bytes, 0, 5, BATCH,
                                                                  SEQ_LEN))
  norm = lambda tree: float(np.sqrt(sum(np.sum(np.float64(x) ** 2)
                                        for x in jax.tree.leaves(tree))))
  last = records[-1]
  np.testing.assert_allclose(last["loss"], float(loss), rtol=1e-5)
  np.testing.assert_allclose(last["grad_norm"], norm(grads), rtol=1e-4)
  np.testing.assert_allclose(last["param_norm"], norm(after), rtol=1e-5)
  np.testing.assert_allclose(last["update_norm"], norm(jax.tree.map(np.subtract, after, before)),
                             rtol=1e-3)
  held = [loss_fn(after, batch) for batch in data.eval_batches(held_out, 8, BATCH, SEQ_LEN)]
  np.testing.assert_allclose(last["eval_loss"], float(np.mean(held)), rtol=1e-5)

  events = EventAccumulator(str(out))
  events.Reload()
  for field, tag in [("loss", "train/loss"), ("eval_loss", "eval/loss"), ("lr", "train/lr"),
                     ("grad_norm", "train/grad_norm"), ("update_norm", "train/update_norm"),
                     ("param_norm", "train/param_norm"), ("mfu", "perf/mfu")]:
    want = [(r["step"], np.float32(r[field])) for r in records if field in r]
    assert [(e.step, np.float32(e.value)) for e in events.Scalars(tag)] == want, tag

  traces = list((out / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and f"profile of steps 2-3: {traces[0].parent}" in printed
  profile = jax.profiler.ProfileData.from_file(str(traces[0]))
  assert any(True for plane in profile.planes for line in plane.lines)
  perfetto = next(traces[0].parent.glob("*.trace.json.gz"))
  assert json.loads(gzip.decompress(perfetto.read_bytes()))["traceEvents"]

  samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
  assert [s["step"] for s in samples] == [4, 6]
  tokens = list(held_out[:(SEQ_LEN - 1) // 2])
  while len(tokens) < SEQ_LEN - 1:  # greedy, one prefix at a time
    logits = model.apply({"params": after}, jnp.array([tokens], jnp.int32))
    tokens.append(int(jnp.argmax(logits[0, -1])))
  text = lambda t: bytes(t).decode("utf-8", errors="replace")
  assert samples[-1]["prompt"] == text(tokens[:(SEQ_LEN - 1) // 2])
  assert samples[-1]["continuation"] == text(tokens[(SEQ_LEN - 1) // 2:])
  assert f"sample at step 6 (greedy): {samples[-1]['prompt']!r}" in printed
  assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_lbfgs_trains_in_the_job_at_its_defaults(tmp_path, capsys):
  """``--optimizer lbfgs --steps 20`` with no --lr or --schedule: lr 1.0,
  constant (launch/defaults.LINE_SEARCH); the zoom line search gets the loss,
  gradients and loss function through ``opt.train_step``; the loss falls."""
  flags = list(h.TINY)
  del flags[flags.index("--schedule"):flags.index("--schedule") + 2]  # the default
  out = tmp_path / "run"
  assert train.main([*flags, "--cpu-devices", "0", "--out", str(out), "--optimizer", "lbfgs",
                     "--steps", "20", "--eval-every", "0", "--checkpoint-every", "0"]) == 0
  assert "schedule: constant" in capsys.readouterr().out
  records = report.read_metrics(out / "metrics.jsonl")
  assert [r["step"] for r in records] == list(range(1, 21))
  losses = [r["loss"] for r in records]
  assert all(math.isfinite(r[f]) for r in records for f in steps.STATS)
  assert all(r["lr"] == 1.0 and r["update_norm"] > 0 for r in records)
  assert np.mean(losses[-5:]) < losses[0] - 1.5  # measured: 6.30 -> 3.75 (mean of the last 5)


def test_the_mfu_peak_of_each_gpu_variant_is_its_data_sheet_figure():
  """device_kind strings as jax reports them: the PCIe and NVL parts were scored against the SXM
  parts' 989 TFLOP/s (H100 PCIe's data sheet: 756 dense bfloat16; NVL: 835)."""
  expected = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12,
              "NVIDIA H100 NVL": 835e12, "NVIDIA H200": 989e12, "NVIDIA H200 NVL": 835e12,
              "NVIDIA A100-SXM4-80GB": 312e12, "TPU v5 lite": 197e12, "TPU v5p": 459e12,
              "cpu": None}
  assert {kind: throughput.data_sheet_peak(kind) for kind in expected} == expected
