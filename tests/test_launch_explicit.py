"""The job on Explicit mesh axes (--axis-types explicit, or one axis of each
kind: data=explicit,model=auto): the demo model's loss, gradients and
samples under every partition preset, and a run that trains as on Auto axes
and resumes across axis types."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launch import cli
from launch import model as model_lib
from launch import train
from launch import training_setup
from launch.validation import checked_mesh
from tests import launch_helpers

_SMALL = ["--layers", "2", "--d-model", "32", "--heads", "2", "--head-dim", "16", "--mlp", "64",
          "--batch", "8", "--seq-len", "17", "--mesh", "data=4,model=2"]


def _tokens(batch: int, length: int, seed: int = 0) -> np.ndarray:
  return np.asarray(jax.random.randint(jax.random.key(seed), (batch, length), 0, 256), np.int32)


# Every axis Explicit, and each axis kind on one axis (a mesh of both kinds).
_EXPLICIT_AXES = {"explicit": ("data", "model"), "data=explicit,model=auto": ("data",),
                  "data=auto,model=explicit": ("model",)}


@pytest.mark.parametrize("axis_types", list(_EXPLICIT_AXES))
@pytest.mark.parametrize("scan", [False, True], ids=["layers", "scan"])
@pytest.mark.parametrize("rules", ["replicated", "fsdp", "tp", "fsdp_tp"])
def test_model_on_explicit_axes_matches_one_device(rules, scan, axis_types):
  """Loss and gradients on a (data=4, model=2) mesh with Explicit axes (all,
  or one of the two) equal the unsharded ones (1e-5), gradients typed in
  their params' layouts; greedy samples of one replicated sequence equal
  too."""
  args = cli.parse_args([*_SMALL, "--rules", rules, "--axis-types", axis_types,
                         *(["--scan-layers"] if scan else [])])
  model = training_setup.build_model(args)
  mesh = checked_mesh(args)
  assert mesh.abstract_mesh.explicit_axes == _EXPLICIT_AXES[axis_types]
  _, _, abstract = training_setup.param_layout(args, mesh, model)
  params = training_setup.init_params(args, model, jax.random.key(0))
  tokens = _tokens(8, 17)
  loss_and_grads = jax.value_and_grad(lambda p, t: model_lib.next_token_loss(model, p, t))
  want_loss, want_grads = jax.jit(loss_and_grads)(params, tokens)
  sample = lambda p, t: model_lib.greedy_continue(model, p, t, start=8)
  want_sample = jax.jit(sample)(params, tokens[:1])

  shardings = jax.tree.map(lambda a: a.sharding, abstract)
  with jax.set_mesh(mesh):
    sharded = jax.device_put(params, shardings)
    batch = jax.device_put(tokens, jax.sharding.PartitionSpec("data", None))
    loss, grads = jax.jit(loss_and_grads)(sharded, batch)
    got_sample = jax.jit(sample)(sharded, jnp.asarray(tokens[:1]))

  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for g, w, p in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), jax.tree.leaves(sharded)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
    assert jax.typeof(g).sharding.spec == jax.typeof(p).sharding.spec
  np.testing.assert_array_equal(got_sample, want_sample)


def test_a_run_on_explicit_axes_trains_as_on_auto_and_resumes_across_axis_types(tmp_path, capsys):
  """8-bit state with ZeRO: the same losses (1e-5) on Explicit as on Auto
  axes; the Auto run resumed on Explicit axes of another mesh shape, on a
  mesh of both kinds, and back, finishes."""
  common = ["--state-bits", "8", "--checkpoint-every", "2", "--eval-every", "2",
            "--sample-every", "4", "--steps", "4", "--heads", "4", "--head-dim", "8"]
  auto = launch_helpers.run_in_process(tmp_path / "auto", *common)
  explicit = launch_helpers.run_in_process(tmp_path / "explicit", *common, "--axis-types", "explicit")
  assert "mesh: {'data': 4, 'model': 2}, explicit axes" in capsys.readouterr().out
  np.testing.assert_allclose(explicit, auto, rtol=1e-5)
  for steps, axes, mesh, said_axes in (
      (6, "explicit", "data=2,model=4", "explicit axes"),
      (8, "data=explicit,model=auto", "data=8,model=1", "data explicit, model auto axes"),
      (10, "auto", "data=4,model=2", "auto axes")):
    assert train.main(["--cpu-devices", "0", "--out", str(tmp_path / "auto"), "--resume",
                       "--axis-types", axes, "--mesh", mesh, "--steps", str(steps)]) == 0
    said = capsys.readouterr().out
    assert f"resumed from step {steps - 2}" in said and said_axes in said
    losses = launch_helpers.losses(tmp_path / "auto")
    assert len(losses) == steps and np.all(np.isfinite(losses))
