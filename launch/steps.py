"""The job's compiled programs: the training step with the norms people plot,
the held-out loss, and a greedy sample. Each is one jitted program on the
training mesh, reading the params in their training shardings.

``train_step`` is ``ShardedOptimizer.train_step``'s program (loss, gradients
and the optimizer's update, params and state donated, gradients kept in the
params' layout) that also returns, computed inside the program, the global
norms of the gradients (before any clipping the optimizer does), of the
update applied and of the new params: they come back with the loss, as
replicated device scalars, and cost no host sync of their own.
"""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardopt
from launch.model import greedy_continue

__all__ = ["STATS", "eval_loss", "greedy_sample", "train_step"]

STATS = ("loss", "grad_norm", "update_norm", "param_norm")


def _replicated(shardings):
  return NamedSharding(jax.tree.leaves(shardings)[0].mesh, P())


def train_step(opt, loss_fn, batch_sharding):
  """``(params, state, batch) -> (params, state, stats)``, ``stats`` a dict of
  the scalars named in ``STATS``; params and state donated (use only the
  returned ones)."""
  param_shardings = opt.param_shardings

  def step(params, state, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    grads = jax.lax.with_sharding_constraint(grads, param_shardings)
    updates, new_state = opt.tx.update(grads, state, params)
    new_params = shardopt.apply_updates(params, updates)
    norms = [shardopt.global_norm(tree) for tree in (grads, updates, new_params)]
    return new_params, new_state, dict(zip(STATS, [loss, *norms]))

  return jax.jit(step, in_shardings=(param_shardings, opt.state_shardings, batch_sharding),
                 out_shardings=(param_shardings, opt.state_shardings,
                                _replicated(param_shardings)),
                 donate_argnums=(0, 1), keep_unused=True)


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
