"""shardopt's transformations as the tx of Flax linen's TrainState and of nnx.Optimizer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.training import train_state

import checkpoints
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


def _nnx_losses(tx, steps=STEPS):
  model = NnxMLP(nnx.Rngs(1))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = _batch()

  @nnx.jit
  def step(model, optimizer):
    loss_fn = lambda m: jnp.mean((m(x) - y) ** 2)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  return np.array([float(step(model, optimizer)) for _ in range(steps)])


def test_nnx_optimizer_matches_optax():
  ours = _nnx_losses(shardopt.adamw(**ADAMW))
  theirs = _nnx_losses(optax.adamw(**ADAMW))
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  assert ours[-1] < 0.5 * ours[0]


def _functional_losses(tx, steps):
  """The same training as ``_nnx_losses``, on the model's pure arrays."""
  model = NnxMLP(nnx.Rngs(1))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  x, y = _batch()
  params = nnx.as_pure(params)

  @jax.jit
  def step(params, state):
    def loss_fn(p):
      return jnp.mean((nnx.merge(graphdef, p, rest)(x) - y) ** 2)
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = tx.update(grads, state, params)
    return shardopt.apply_updates(params, updates), state, loss

  state, losses = tx.init(params), []
  for _ in range(steps):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  return np.array(losses)


@pytest.mark.parametrize("make_tx", [
    lambda: shardopt.quantized_state(shardopt.adamw(0.05), bits=8, min_size=32),
    lambda: shardopt.quantized_state(shardopt.adam(0.05), bits=4, min_size=32),
    lambda: shardopt.contrib.shampoo(0.05, block_size=4),
    lambda: shardopt.contrib.soap(0.05),
    lambda: shardopt.sm3(0.05),
], ids=["adamw-8bit", "adam-4bit", "shampoo", "soap", "sm3"])
@pytest.mark.parametrize("adapt", [lambda tx: tx, checkpoints.nnx_tx],
                         ids=["plain", "nnx_tx"])
def test_nnx_optimizer_with_per_param_state_trees(make_tx, adapt):
  """State with a tree per param (quantized codes and scales, Shampoo's and
  SOAP's blocks, SM3's covers) through nnx.Optimizer, given plainly or with
  checkpoints.nnx_tx: 6 steps, the losses of the same tx on the pure arrays."""
  got = _nnx_losses(adapt(make_tx()), steps=6)
  want = _functional_losses(make_tx(), steps=6)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got[-1] < got[0]
