"""The job with --state-bits: bytes per param on its meshes, the leaves it
keeps in float, and resuming a quantized run onto other meshes."""

import re

import jax
import numpy as np
import pytest

from benchmarks import resident
import shardopt
from launch import cli
from launch import train
from launch import training_setup
from launch.validation import checked_mesh
from tests import launch_helpers


@pytest.mark.parametrize("mesh", ["data=4,model=2", "data=2,model=4",
                                  "data=8,model=1"])
def test_demo_adamw_state_bytes_per_param(mesh, capsys):
  """The demo model's AdamW state on the job's meshes, ZeRO over data:
  <= 2.1 bytes per param at 8 bits, <= 1.1 at 4 (from addressable_shards),
  and the header lists every float leaf it keeps, with why."""
  for bits, most in ((8, 2.1), (4, 1.1)):
    args = cli.parse_args(["--mesh", mesh, "--optimizer", "adamw",
                                    "--state-bits", str(bits)])
    model, device_mesh = training_setup.build_model(args), checked_mesh(args)
    _, _, abstract = training_setup.param_layout(args, device_mesh, model)
    opt = training_setup.sharded_optimizer(args, abstract)
    params = jax.tree.map(lambda a: jax.device_put(
        np.zeros(a.shape, a.dtype), a.sharding), abstract)
    state = opt.init(params)
    n_params = sum(np.prod(a.shape) for a in jax.tree.leaves(abstract))
    assert resident.unique_and_per_device(state)[0] / n_params <= most, (bits, mesh)
    lines = training_setup.quantized_lines(args, opt, abstract)
    report = shardopt.describe_quantized_state(opt.tx, abstract,
                                               opt.update_shardings)
    assert len(lines) == len(report.kept) + 2
    assert all(l.reason in "\n".join(lines) for l in report.kept)


@pytest.mark.parametrize("bits,memory", [("8", "device"), ("4", "pinned_host")])
def test_a_quantized_run_resumes_onto_other_meshes(tmp_path, capsys, bits, memory):
  """Saved on data=4,model=2, resumed onto data=2,model=4, then
  data=8,model=1, with the state in device or host memory: the blocks fit
  every mesh of 8 devices, so nothing is re-encoded; then without ZeRO,
  whose blocks differ: re-encoded, and each leaf named."""
  out = tmp_path / "run"
  common = ["--state-bits", bits, "--state-memory-kind", memory, "--checkpoint-every", "2",
            "--eval-every", "0", "--sample-every", "0"]
  launch_helpers.run_in_process(out, *common, "--heads", "4", "--head-dim", "8",
                                "--steps", "2")
  header = capsys.readouterr().out
  assert f"{bits}-bit optimizer state:" in header
  for step, flags in ((4, ["--mesh", "data=2,model=4"]), (6, ["--mesh", "data=8,model=1"]),
                      (8, ["--mesh", "data=8,model=1", "--no-zero"])):
    assert train.main(["--cpu-devices", "0", "--out", str(out), "--resume", *flags,
                       "--steps", str(step)]) == 0
    losses = launch_helpers.losses(out)
    assert len(losses) == step and all(np.isfinite(losses))
    said = capsys.readouterr().out
    assert f"resumed from step {step - 2}" in said
    retiled = re.search(r"re-encoded (\d+) quantized state leaves in this mesh's blocks, or in"
                        r" float where this mesh keeps them so \(each value within one"
                        r" quantization step of the saved one\): (.*)", said)
    if "--no-zero" not in flags:
      assert "re-encoded" not in said, said
      continue
    assert retiled, said  # ZeRO no longer splits a dimension the blocks were fitted to
    assert len(retiled[2].split(", ")) == int(retiled[1]) > 0
