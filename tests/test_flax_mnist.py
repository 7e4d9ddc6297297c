"""flax's MNIST example (linen CNN, integer-label cross-entropy, SGD with
momentum) with ``import shardopt as optax``: the same losses and final params
as with optax over 30 steps, on synthetic 16x16 one-channel images (no
download; smaller than MNIST's 28x28 to keep the test cheap)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.training import train_state

import shardopt

STEPS, BATCH, BATCHES, SIDE = 30, 8, 4, 16


class CNN(nn.Module):
  """The CNN of flax's examples/mnist."""

  @nn.compact
  def __call__(self, x):
    x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), strides=(2, 2))
    x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), strides=(2, 2))
    x = nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1))))
    return nn.Dense(10)(x)


def _data():
  """Images whose label is the brightest of ten horizontal bands, plus noise
  (NumPy: no compilations for the data)."""
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, (BATCHES, BATCH))
  bands = np.arange(SIDE) * 10 // SIDE  # the band of each image row
  images = (bands[None, None, :, None] == labels[..., None, None]) * np.ones((SIDE, SIDE))
  images = images + 0.5 * rng.standard_normal(images.shape)
  return images[..., None].astype(np.float32), labels.astype(np.int32)


def _train(optax):  # noqa: ANN001 (the module: optax itself, or shardopt in its place)
  """flax's examples/mnist/train.py steps, with ``optax`` as given."""
  images, labels = _data()
  model = CNN()
  params = jax.jit(model.init)(jax.random.PRNGKey(1), jnp.ones((1, SIDE, SIDE, 1)))["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=optax.sgd(0.1, 0.9))

  @jax.jit
  def train_step(state, images, labels):
    def loss_fn(params):
      logits = state.apply_fn({"params": params}, images)
      return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, labels))
    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss

  losses = []
  for step in range(STEPS):
    state, loss = train_step(state, images[step % BATCHES], labels[step % BATCHES])
    losses.append(loss)
  return np.array(losses), state.params


def test_mnist_example_with_shardopt_as_optax_gives_optaxs_losses_and_params():
  ours, our_params = _train(shardopt)
  theirs, their_params = _train(optax)
  np.testing.assert_allclose(ours, theirs, rtol=1e-6)
  assert min(theirs) < 0.1 * theirs[0]  # it learns (then overshoots: lr 0.1, momentum 0.9)
  paths = jax.tree_util.tree_leaves_with_path(their_params)
  for (path, want), got in zip(paths, jax.tree.leaves(our_params), strict=True):
    error = float(jnp.max(jnp.abs(got - want)))
    assert error <= 1e-5 * float(jnp.max(jnp.abs(want))), (jax.tree_util.keystr(path), error)
