"""shardopt's transformations as the tx of Flax linen's TrainState and of nnx.Optimizer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax.training import train_state

import checkpoints
import shardopt
from tests import nnx_training

STEPS = 20
# Decay the kernels only: the mask goes through shardopt.masked on Flax trees.
ADAMW = dict(learning_rate=0.05, weight_decay=0.01,
             mask=lambda params: jax.tree.map(lambda p: p.ndim > 1, params))


class LinenMLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    return nn.Dense(1)(nn.tanh(nn.Dense(8)(x)))


def _linen_losses(tx):
  model = LinenMLP()
  x, y = nnx_training.batch()
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


def test_nnx_optimizer_matches_optax():
  ours, _ = nnx_training.through_nnx_optimizer(shardopt.adamw(**ADAMW), STEPS)
  theirs, _ = nnx_training.through_nnx_optimizer(optax.adamw(**ADAMW), STEPS)
  np.testing.assert_allclose(ours, theirs, rtol=1e-5)
  assert ours[-1] < 0.5 * ours[0]


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
  got, _ = nnx_training.through_nnx_optimizer(adapt(make_tx()), steps=6)
  want, _ = nnx_training.on_pure_arrays(make_tx(), steps=6)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got[-1] < got[0]


@pytest.mark.parametrize("bits", [8, 4])
def test_nnx_optimizer_given_quantized_state_plainly_on_auto_axes(bits):
  """A model sharded with ``nnx.with_partitioning`` under a mesh of Auto axes,
  ``nnx.Optimizer`` given ``adamw(..., state_bits=...)`` plainly: ``init``
  runs on the placed arrays and fits the blocks to their shards (it fitted
  them to the whole kernel, whose (32, 1) or (64, 1) scales flax laid out as the
  kernel, split 4 ways: an IndivisibleError). 4 steps: the losses of
  ``checkpoints.nnx_tx(tx)``, which traces ``init`` on the arrays."""
  from flax import nnx
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  x = jax.random.normal(jax.random.PRNGKey(1), (16, 64))
  y = jax.random.normal(jax.random.PRNGKey(2), (16, 128))

  def losses(adapt):
    with jax.sharding.set_mesh(mesh):
      model = nnx.Linear(64, 128, rngs=nnx.Rngs(0), kernel_init=nnx.with_partitioning(
          nnx.initializers.lecun_normal(), (None, "model")))
      optimizer = nnx.Optimizer(model, adapt(shardopt.adamw(1e-2, state_bits=bits)),
                                wrt=nnx.Param)

      @nnx.jit
      def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

      got = [float(step(model, optimizer)) for _ in range(4)]
      assert model.kernel[...].sharding.spec == jax.P(None, "model")
      return got

  plain = losses(lambda tx: tx)
  np.testing.assert_allclose(plain, losses(checkpoints.nnx_tx), rtol=1e-6)
  assert plain[-1] < plain[0]
