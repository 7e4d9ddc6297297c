"""A small nnx model trained through ``nnx.Optimizer`` and, the same training,
on its pure arrays with ``tx.init``/``tx.update``: the two runs the Flax tests
compare."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import shardopt


def batch():
  kx, ky = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(kx, (16, 4))
  return x, jnp.sin(x.sum(axis=1, keepdims=True)) + 0.1 * jax.random.normal(
      ky, (16, 1))


class NnxMLP(nnx.Module):

  def __init__(self, rngs):
    self.hidden = nnx.Linear(4, 8, rngs=rngs)
    self.out = nnx.Linear(8, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(jnp.tanh(self.hidden(x)))


def _loss(model, x, y):
  return jnp.mean((model(x) - y) ** 2)


def through_nnx_optimizer(tx, steps):
  """``(losses, params)`` of ``steps`` updates by ``nnx.Optimizer(model, tx)``."""
  model = NnxMLP(nnx.Rngs(1))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = batch()

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(_loss)(model, x, y)
    optimizer.update(model, grads)
    return loss

  losses = np.array([float(step(model, optimizer)) for _ in range(steps)])
  return losses, nnx.as_pure(nnx.state(model, nnx.Param))


def on_pure_arrays(tx, steps):
  """``through_nnx_optimizer``'s training on the model's pure arrays."""
  graphdef, params, rest = nnx.split(NnxMLP(nnx.Rngs(1)), nnx.Param, ...)
  params = nnx.as_pure(params)
  x, y = batch()

  @jax.jit
  def step(params, state):
    loss, grads = jax.value_and_grad(
        lambda p: _loss(nnx.merge(graphdef, p, rest), x, y))(params)
    updates, state = tx.update(grads, state, params)
    return shardopt.apply_updates(params, updates), state, loss

  state, losses = tx.init(params), []
  for _ in range(steps):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  return np.array(losses), params
