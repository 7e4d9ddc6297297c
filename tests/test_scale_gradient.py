"""scale_gradient: forward unchanged, gradients scaled, equal to optax's."""

import jax
import jax.numpy as jnp
import optax
import pytest

import shardopt
from tests import oracle


def _loss(lib, scale):
  def loss(params):
    scaled = lib.scale_gradient(params, scale)
    return sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(scaled))
  return loss


@pytest.mark.parametrize("scale", [0.0, 1.0, 0.3, -2.0])
def test_matches_optax(scale):
  params = oracle.mixed_tree()
  value, grads = jax.jit(jax.value_and_grad(_loss(shardopt, scale)))(params)
  want_value, want = jax.value_and_grad(_loss(optax, scale))(params)
  oracle.assert_trees_close(grads, want)
  oracle.assert_trees_close(value, want_value)
  oracle.assert_trees_close(
      grads, jax.tree.map(lambda x: scale * jnp.cos(x), params))
