"""state_structure.conform: a state whose containers came back as mappings
(as flax's nnx.Optimizer writes them) read in the structure init gives."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardopt
from shardopt._src import state_structure


class _Pair(NamedTuple):
  first: jax.Array
  second: jax.Array


def test_containers_rebuilt_as_mappings_come_back_in_inits_structure():
  like = _Pair(first={"w": [jnp.zeros(2), jnp.ones(3)]},
               second={"w": (jnp.full(2, 2.0),)})
  mangled = _Pair(first={"w": {0: like.first["w"][0], 1: like.first["w"][1]}},
                  second={"w": {0: like.second["w"][0]}})
  got = state_structure.conform(mangled, like)
  assert jax.tree.structure(got) == jax.tree.structure(like)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(like)):
    np.testing.assert_array_equal(g, w)
  assert state_structure.conform(like, like) is like


def test_another_optimizers_state_names_the_missing_path():
  like = {"w": [jnp.zeros(2), jnp.ones(3)]}
  with pytest.raises(ValueError, match=r"first missing path: \[\('w', 1\)\]"):
    state_structure.conform({"w": {0: jnp.zeros(2), 2: jnp.ones(3)}}, like)


@pytest.mark.parametrize("make_tx", [
    lambda: shardopt.sm3(0.1),
    lambda: shardopt.contrib.shampoo(0.1, block_size=32),
    lambda: shardopt.adamw(0.1, state_bits=4),
    lambda: shardopt.quantized_state(shardopt.adadelta(0.1), bits=4, min_size=8),
], ids=["sm3", "shampoo", "adamw-4bit", "adadelta-4bit-floor-8"])
def test_an_update_reads_its_state_with_containers_as_mappings(make_tx):
  """The same updates from the state as init built it and from the state
  with its per-param containers (covers, factors, QuantizedArrays with
  their static fields dropped) rebuilt as dicts."""
  tx = make_tx()
  params = {"w": jnp.linspace(-1.0, 1.0, 64 * 128).reshape(64, 128)}  # >= min_size
  grads = jax.tree.map(lambda p: 0.1 * p + 0.01, params)
  state = tx.update(grads, tx.init(params), params)[1]
  mangled = _map_param_dicts(state, lambda v: _children(v) if _is_container(v) else v)
  want, _ = tx.update(grads, state, params)
  got, _ = jax.jit(tx.update)(grads, mangled, params)
  np.testing.assert_allclose(got["w"], want["w"], rtol=1e-6)


def _is_container(node) -> bool:
  return isinstance(node, (list, tuple)) or isinstance(node, shardopt.QuantizedArray)


def _children(node) -> dict:
  flat = jax.tree_util.tree_flatten_with_path(node)[0]
  out = {}
  for path, leaf in flat:
    names = state_structure.path_names(path)
    target = out
    for name in names[:-1]:
      target = target.setdefault(name, {})
    target[names[-1]] = leaf
  return out


def _map_param_dicts(state, fn):
  """``fn`` applied to each value of every ``{"w": ...}`` dict in ``state``."""
  is_params_dict = lambda x: isinstance(x, dict) and "w" in x
  return jax.tree.map(
      lambda d: {k: fn(v) for k, v in d.items()} if is_params_dict(d) else d,
      state, is_leaf=is_params_dict)
