"""shardopt.adamw as the tx of Flax linen's TrainState and of nnx.Optimizer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax import nnx
from flax.training import train_state

import shardopt

STEPS = 20
# Decay the kernels only: the mask goes through shardopt.masked on Flax trees.
ADAMW = dict(learning_rate=0.05, weight_decay=0.01,
             mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))


def _batch():
  kx, ky = jax.random.split(jax.random.PRNGKey(0))
  x = jax.random.normal(kx, (16, 4))
  return x, jnp.sin(x.sum(axis=1, keepdims=True)) + 0.1 * jax.random.normal(
      ky, (16, 1))


class LinenMLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.tanh(nn.Dense(8)(x)))


def _linen_losses(tx):
  model = LinenMLP()
  x, y = _batch()
  state = train_state.TrainState.create(
      apply_fn=model.apply, params=model.init(jax.random.PRNGKey(1), x),
      tx=tx)

  @jax.jit
  def step(state):
    loss_fn = lambda p: jnp.mean((state.apply_fn(p, x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  losses = []
  for _ in range(STEPS):
    state, loss = step(state)
    losses.append(float(loss))
  return np.array(losses), state


def test_linen_train_state_matches_optax():
  ours, state = _linen_losses(shardopt.adamw(**ADAMW))
  theirs, _ = _linen_losses(optax.adamw(**ADAMW))
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  assert ours[-1] < 0.5 * ours[0]  # it trains
  assert int(state.opt_state[0].count) == STEPS


class NnxMLP(nnx.Module):

  def __init__(self, rngs):
    self.hidden = nnx.Linear(4, 8, rngs=rngs)
    self.out = nnx.Linear(8, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(jnp.tanh(self.hidden(x)))


def _nnx_losses(tx):
  model = NnxMLP(nnx.Rngs(1))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = _batch()

  @nnx.jit
  def step(model, optimizer):
    loss_fn = lambda m: jnp.mean((m(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  return np.array([float(step(model, optimizer)) for _ in range(STEPS)])


def test_nnx_optimizer_matches_optax():
  ours = _nnx_losses(shardopt.adamw(**ADAMW))
  theirs = _nnx_losses(optax.adamw(**ADAMW))
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  assert ours[-1] < 0.5 * ours[0]
