"""Every catalogue transformation as the tx of flax's ``nnx.Optimizer``, given
plainly (no adapter), float and quantized state: the params of the same
transformation run on the model's pure arrays.

``nnx.Optimizer`` writes the state back into its object graph after every
update, rebuilding containers inside the params' mapping (SM3's covers,
Shampoo's factors, a ``QuantizedArray``) as mappings; the transformations
read such a state in their own structure (``shardopt/_src/state_structure.py``).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import shardopt
from tests import catalogue

STEPS = 2  # the second update reads the state nnx.Optimizer wrote back


class _MLP(nnx.Module):

  def __init__(self, rngs):
    self.hidden = nnx.Linear(16, 32, rngs=rngs)
    self.out = nnx.Linear(32, 4, rngs=rngs)

  def __call__(self, x):
    return self.out(jnp.tanh(self.hidden(x)))


def _batch():
  kx, ky = jax.random.split(jax.random.PRNGKey(0))
  return jax.random.normal(kx, (8, 16)), jax.random.normal(ky, (8, 4))


def _loss(model, x, y):
  return jnp.mean((model(x) - y) ** 2)


def _through_nnx_optimizer(tx):
  model = _MLP(nnx.Rngs(1))
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  x, y = _batch()

  @nnx.jit
  def step(model, optimizer):
    optimizer.update(model, nnx.grad(_loss)(model, x, y))

  for _ in range(STEPS):
    step(model, optimizer)
  return nnx.as_pure(nnx.state(model, nnx.Param))


def _on_pure_arrays(tx):
  graphdef, params, rest = nnx.split(_MLP(nnx.Rngs(1)), nnx.Param, ...)
  params = nnx.as_pure(params)
  x, y = _batch()

  @jax.jit
  def step(params, state):
    grads = jax.grad(lambda p: _loss(nnx.merge(graphdef, p, rest), x, y))(params)
    updates, state = tx.update(grads, state, params)
    return shardopt.apply_updates(params, updates), state

  state = tx.init(params)
  for _ in range(STEPS):
    params, state = step(params, state)
  return params


def _quantized(tx, bits):
  return tx if bits is None else shardopt.quantized_state(tx, bits=bits, min_size=64)


@pytest.mark.parametrize("bits", [None, 8, 4], ids=["float", "8bit", "4bit"])
@pytest.mark.parametrize("entry", [e for e in catalogue.ENTRIES
                                   if e.transformation and not e.extra_args],
                         ids=lambda e: e.label)
def test_nnx_optimizer_gives_the_params_of_the_pure_arrays(entry, bits):
  try:
    want = _on_pure_arrays(_quantized(catalogue.build(entry), bits))
  except ValueError as error:  # e.g. per-example clipping: these grads have no batch axis
    with pytest.raises(type(error)):
      _through_nnx_optimizer(_quantized(catalogue.build(entry), bits))
    return
  got = _through_nnx_optimizer(_quantized(catalogue.build(entry), bits))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
               got, want)
