"""Every --optimizer trains through the job's training step as the job builds
it: its default learning rate and schedule, the extra arguments its update
reads (``optim.update_arguments``), ZeRO over every state leaf.

On Auto and Explicit mesh axes. Truth: three steps give a finite loss and finite params that moved. Before
this test, --optimizer sophia failed at its first step (no objective reached
its update), prodigy and dadapt_adamw gave nan (the default warmup from 0
makes their first step-size estimate 0 / 0, in optax too) and galore's state
could not be planned with ZeRO nor checkpointed (an empty projector).
"""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from launch import cli
from launch import optim
from launch import steps
from launch import validation
import partitioning
import shardopt
from tests.test_launch_optim import _aliases

# Not trainable from the command line alone, each tested where it is:
# dpsgd clips per-example gradients (a batch axis the job's gradients lack);
# schedule_free needs a base optimizer (not a number --opt can give).
_NOT_FROM_THE_COMMAND_LINE = {"dpsgd", "schedule_free"}
SPECS = {"w1": P(None, "model"), "w2": P("model", None), "b": P()}


def _params():
  k1, k2 = jax.random.split(jax.random.key(1))
  return {"w1": jax.random.normal(k1, (16, 64)) / 4, "w2": jax.random.normal(k2, (64, 8)) / 8,
          "b": jnp.zeros((8,))}


def _loss(params, batch):
  hidden = jnp.tanh(batch["x"] @ params["w1"])
  out = jnp.sum(hidden[:, :, None] * params["w2"], axis=1) + params["b"]
  return jnp.mean((out - batch["y"]) ** 2)


def _job_args(tmp_path, name):
  argv = ["--optimizer", name, "--out", str(tmp_path / "run")]
  if not optim.takes_schedule(optim._alias(name)):  # pylint: disable=protected-access
    argv += ["--schedule", "constant"]
  return cli.parse_args(argv)


@pytest.mark.parametrize("axis_types", ["auto", "explicit"])
@pytest.mark.parametrize("name", sorted(set(_aliases()) - _NOT_FROM_THE_COMMAND_LINE))
def test_every_optimizer_trains_through_the_jobs_step(tmp_path, name, axis_types):
  args = _job_args(tmp_path, name)
  mesh = partitioning.make_mesh("data=4,model=2", axis_types=axis_types)
  shardings = partitioning.named_shardings(mesh, SPECS)
  opt = shardopt.make_sharded_optimizer(validation.checked_optimizer(args), _params(), shardings,
                                        shard_state_over="data", min_shard_bytes=0)
  train_step = steps.train_step(opt, _loss, optim.update_arguments(name))
  params = jax.device_put(_params(), shardings)
  state = opt.init(params)
  batch = {"x": jax.random.normal(jax.random.key(2), (32, 16)),
           "y": jax.random.normal(jax.random.key(3), (32, 8))}
  for _ in range(3):
    params, state, loss, _ = train_step(params, state, batch)
  assert np.isfinite(float(loss))
  moved = False
  for got, start in zip(jax.tree.leaves(params), jax.tree.leaves(_params())):
    assert np.all(np.isfinite(np.asarray(got)))
    moved |= not np.array_equal(np.asarray(got), np.asarray(start))
  assert moved
