"""The job with --param-dtype bfloat16 (--correction-bits), --state-bits 8 and
--state-memory-kind pinned_host: the model computes in bfloat16, the demo's
training state is 5 bytes per param, the header says so, and a run resumes
with its state in device memory."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import resident
import checkpoints
from launch import cli
from launch import memory
from launch import train
from launch import training_setup
from launch.model import ModelConfig
from launch.model import Transformer
from launch.validation import checked_mesh
from tests import launch_helpers


def _dot_dtypes(jaxpr) -> collections.Counter:
  """Operand dtypes of every dot_general, nested jaxprs included."""
  found = collections.Counter()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      found[tuple(str(v.aval.dtype) for v in eqn.invars)] += 1
    for value in eqn.params.values():
      inner = getattr(value, "jaxpr", None)
      if inner is not None:
        found += _dot_dtypes(getattr(inner, "jaxpr", inner))
  return found


@pytest.mark.parametrize("scan", [False, True])
def test_the_model_computes_in_its_params_dtype(scan):
  model = Transformer(ModelConfig(scan_layers=scan))
  tokens = jnp.zeros((2, 16), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.key(0), tokens)["params"]
  params = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, jnp.bfloat16), params)
  closed = jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens))(params)
  assert closed.out_avals[0].dtype == jnp.bfloat16
  dots = _dot_dtypes(closed.jaxpr)
  assert dots and set(dots) == {("bfloat16", "bfloat16")}, dots


def test_demo_training_state_is_five_bytes_per_param():
  """The demo model on data=2,model=4, ZeRO over data, bfloat16 params, 8-bit
  corrections and 8-bit AdamW moments: params + state <= 5.2 bytes per param
  (unique shards, scales included), each device <= 1.05x its params' share
  plus all state / 8; the header's figures are the same bytes."""
  args = cli.parse_args(["--mesh", "data=2,model=4", "--param-dtype", "bfloat16",
                         "--state-bits", "8"])
  assert args.correction_bits == 8
  model = training_setup.build_model(args)
  _, _, abstract = training_setup.param_layout(args, checked_mesh(args), model)
  opt = training_setup.sharded_optimizer(args, abstract)
  params = jax.jit(lambda key: training_setup.init_params(args, model, key),
                   out_shardings=opt.param_shardings)(jax.random.key(0))
  state = opt.init(params)
  n_params = sum(p.size for p in jax.tree.leaves(params))
  param_bytes, param_device = resident.unique_and_per_device(params)
  state_bytes, state_device = resident.unique_and_per_device(state)
  assert (param_bytes + state_bytes) / n_params <= 5.2
  for device in param_device:
    assert (param_device[device] + state_device[device]
            <= 1.05 * (param_device[device] + state_bytes / 8)), device
  header = memory.describe(params, state, _Compiled())[0]
  assert (f"params {param_bytes / n_params:.3f}, optimizer state"
          f" {state_bytes / n_params:.3f}") in header
  assert "params 2.000, optimizer state 3.054" in header  # the README's figures


class _Compiled:
  """Stands in for a compiled step in ``memory.describe``."""

  def memory_analysis(self):
    fields = ("argument", "output", "alias", "temp")
    return collections.namedtuple("Stats", [f"{h}{f}_size_in_bytes" for h in ("", "host_")
                                            for f in fields])(*[0] * 8)


def test_correction_bits_without_bfloat16_params_is_a_usage_error():
  with pytest.raises(cli.UsageError, match="--correction-bits 8: corrects bfloat16 params"):
    cli.parse_args(["--correction-bits", "8"])
  assert cli.parse_args(["--param-dtype", "bfloat16", "--correction-bits", "0"]
                        ).correction_bits == 0


@pytest.mark.slow
def test_a_bfloat16_host_state_run_resumes_with_device_state(tmp_path, capsys):
  """Params are bfloat16 and corrections int8 in the checkpoint; the header
  states bytes per param and the step's peak; the run resumes with its state
  in device memory (--state-memory-kind may change on resume)."""
  out = tmp_path / "run"
  launch_helpers.run_in_process(
      out, "--param-dtype", "bfloat16", "--state-bits", "8", "--state-memory-kind",
      "pinned_host", "--steps", "2", "--checkpoint-every", "2", "--eval-every", "0",
      "--sample-every", "0")
  header = capsys.readouterr().out
  assert "bytes per param: params 2.000, optimizer state" in header
  assert "train step peak:" in header
  with checkpoints.CheckpointManager(out / "checkpoints", read_only=True) as manager:
    layout = manager.saved_layout(2)
  dtypes = {path: leaf["dtype"] for path, leaf in layout.items()}
  assert {d for p, d in dtypes.items() if p.startswith("params.")} == {"bfloat16"}
  assert {d for p, d in dtypes.items() if ".correction." in p} == {"int8"}
  assert train.main(["--cpu-devices", "0", "--out", str(out), "--resume", "--steps", "4",
                     "--state-memory-kind", "device"]) == 0
  losses = launch_helpers.losses(out)
  assert len(losses) == 4 and all(np.isfinite(losses))
