"""The job's compiled programs: the training step with the norms people plot,
the held-out loss, and a greedy sample. Each is one jitted program on the
training mesh, reading the params in their training shardings.

``train_step`` is ``ShardedOptimizer.train_step`` with the global norms of
the gradients (before any clipping the optimizer does), of the update applied
and of the new params computed inside the program
(``shardopt.sharding.global_norms``): they come back with the loss, as
replicated device scalars, and cost no host sync of their own. The update runs
as ``opt.update`` does (ZeRO update layout, the extra arguments its
optimizer reads: ``optim.update_arguments``).
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardopt
from launch.model import greedy_continue

__all__ = ["STATS", "eval_loss", "greedy_sample", "stats", "trace", "train_step"]

STATS = ("loss", "grad_norm", "update_norm", "param_norm")


def _replicated(shardings):
  return NamedSharding(jax.tree.leaves(shardings)[0].mesh, P())


def train_step(opt, loss_fn, extra_args: tuple[str, ...]) -> shardopt.sharding.TrainStep:
  """``(params, state, batch) -> (params, state, loss, norms)``, ``norms`` the
  dict of ``shardopt.sharding.global_norms``; params and state donated (use only the returned
  ones); ``tx.update`` receives ``extra_args`` (``optim.update_arguments``).
  ``stats(loss, norms)`` is the dict of the scalars named in ``STATS``."""
  return opt.train_step(loss_fn, metrics=shardopt.sharding.global_norms,
                         extra_args=extra_args)


def trace(step, params, state, batch_shape: tuple[int, int]) -> None:
  """Traces ``step`` (a ``train_step``) on abstract ``params`` and ``state`` and an int32
  batch of ``batch_shape`` in the step's batch layout, compiling nothing: what fails there
  (the optimizer's update with the values given) fails before anything is written."""
  batch = jax.ShapeDtypeStruct(batch_shape, jnp.int32)
  batch = jax.ShapeDtypeStruct(batch_shape, jnp.int32, sharding=step.layout.shardings(batch))
  jax.eval_shape(step.jitted, params, state, batch)


def stats(loss, norms) -> dict:
  """The step's scalars by their ``STATS`` names."""
  return {"loss": loss, **norms}


def eval_loss(loss_fn, param_shardings, batches_sharding):
  """``(params, batches) -> mean loss`` over the leading axis of ``batches``
  (equal-sized batches, so the mean over every predicted byte)."""

  def mean_loss(params, batches):
    return jnp.mean(jax.lax.map(lambda batch: loss_fn(params, batch), batches))

  return jax.jit(mean_loss, in_shardings=(param_shardings, batches_sharding),
                 out_shardings=_replicated(param_shardings))


def greedy_sample(model, param_shardings, start: int):
  """``(params, tokens) -> tokens`` with every position from ``start`` on the
  model's greedy continuation (``model.greedy_continue``); tokens replicated."""
  replicated = _replicated(param_shardings)
  return jax.jit(lambda params, tokens: greedy_continue(model, params, tokens, start),
                 in_shardings=(param_shardings, replicated), out_shardings=replicated)
