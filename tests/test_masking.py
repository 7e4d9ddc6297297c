"""masked (full, prefix and function masks), its mismatch errors, and freeze."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

MASK = {"a": True, "b": [False, True], "c": {"d": True, "e": (False, True)}}


def _params():
  return jax.tree.map(jnp.asarray, {"a": 1.0, "b": [2.0, 3.0],
                                    "c": {"d": 4.0, "e": (5.0, 6.0)}})


def _negate():
  """Negation, stateless or stateful (trace with decay 0): the same numbers."""
  return {"scale": shardopt.scale(-1.0),
          "trace": shardopt.chain(shardopt.trace(0.0), shardopt.scale(-1.0))}


def _negate_where(mask, tree):
  """Negates every subtree of ``tree`` whose (prefix) mask entry is True."""
  return jax.tree.map(
      lambda m, t: jax.tree.map(jnp.negative, t) if m else t, mask, tree)


@pytest.mark.parametrize("inner", ["scale", "trace"])
@pytest.mark.parametrize("mask_kind", ["tree", "fn", "prefix"])
def test_masked_negates_where_true(inner, mask_kind):
  params = _params()
  mask = MASK
  if mask_kind == "prefix":
    mask = {"a": True, "b": False, "c": {"d": False, "e": True}}
    params["b"] = {"f": jnp.asarray(2.0)}
    params["c"]["e"] = ([jnp.asarray(4.0), jnp.asarray(5.0)], jnp.asarray(6.0))
  mask_arg = (lambda _: mask) if mask_kind == "fn" else mask
  tx = shardopt.masked(_negate()[inner], mask_arg)
  update = jax.jit(tx.update)
  state = jax.jit(tx.init)(params)
  updates = jax.tree.map(lambda p: p / 10, params)
  for with_params in (True, False):  # the second time, without params
    want = _negate_where(mask, updates)
    updates, state = update(updates, state, params if with_params else None)
    oracle.assert_trees_close(updates, want)
  assert isinstance(state, shardopt.MaskedState)


def test_inner_state_holds_only_unmasked_leaves():
  state = shardopt.masked(shardopt.trace(0.9), MASK).init(_params())
  assert len(jax.tree.leaves(state)) == 4
  assert state.inner_state.trace["b"][0] == shardopt.MaskedNode()


def test_update_that_needs_params():
  decay = 0.1
  tx = shardopt.masked(shardopt.add_decayed_weights(decay), MASK)
  params = _params()
  state = tx.init(params)
  updates = jax.tree.map(lambda p: p / 10, params)
  for _ in range(2):
    want = jax.tree.map(lambda m, u, p: u + decay * p if m else u,
                        MASK, updates, params)
    updates, state = tx.update(updates, state, params)
    oracle.assert_trees_close(updates, want)
    params = shardopt.apply_updates(params, updates)


def test_mask_fn_by_rank():
  params = {"a": jnp.ones((1, 2)), "b": (jnp.ones((1,)), jnp.ones((1, 2, 3)))}
  tx = shardopt.masked(shardopt.add_decayed_weights(0.1),
                       lambda p: jax.tree.map(lambda x: x.ndim > 1, p))
  grads = jax.tree.map(lambda x: 2 * x, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  np.testing.assert_allclose(updates["a"], 2.1 * np.ones((1, 2)))
  np.testing.assert_allclose(updates["b"][0], grads["b"][0])
  np.testing.assert_allclose(updates["b"][1], 2.1 * np.ones((1, 2, 3)))


@pytest.mark.parametrize("container", [list, tuple, dict])
def test_empty_tree(container):
  tx = shardopt.masked(shardopt.trace(0.9), container())
  updates, _ = tx.update(container(), tx.init(container()))
  assert updates == container()


@pytest.mark.parametrize("use_fn", [True, False])
@pytest.mark.parametrize("extra_key_in", ["mask", "params"])
def test_mismatch_names_the_path(extra_key_in, use_fn):
  mask = jax.tree.map(lambda m: m, MASK)
  params = _params()
  (mask if extra_key_in == "mask" else params)["c"]["extra"] = jnp.asarray(7.0)
  if extra_key_in == "mask":
    mask["c"]["extra"] = True
  tx = shardopt.masked(shardopt.trace(0.9), (lambda _: mask) if use_fn else mask)
  with pytest.raises(ValueError) as err:
    tx.init(params)
  want = {"mask": "the mask has ['c']['extra']",
          "params": "the params have ['c']['extra']"}[extra_key_in]
  assert want in str(err.value) and "prefix" in str(err.value)


def test_mismatch_of_node_types_is_reported():
  tx = shardopt.masked(shardopt.scale(1.0), {"b": (True, False)})
  with pytest.raises(ValueError, match="node types differ"):
    tx.init({"b": [jnp.ones(1), jnp.ones(1)]})


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
def test_masked_matches_optax(jit, with_params):
  mask = lambda p: jax.tree.map(lambda x: x.ndim != 1, p)
  ours = shardopt.masked(shardopt.scale_by_adam(), mask)
  theirs = optax.masked(optax.scale_by_adam(), mask)
  oracle.assert_matches_optax(ours, theirs, jit=jit, with_params=with_params)


def test_mask_compatible_extra_args_are_masked():
  seen = {}

  def update_fn(updates, state, params=None, *, tags):
    seen["tags"] = tags
    return updates, state

  inner = shardopt.GradientTransformationExtraArgs(
      shardopt.init_empty_state, update_fn)
  mask = {"w": True, "b": False}
  params = {"w": jnp.ones(2), "b": jnp.ones(2)}
  tags = {"w": jnp.zeros(2), "b": jnp.zeros(2)}
  for compatible in (True, False):
    tx = shardopt.masked(inner, mask, mask_compatible_extra_args=compatible)
    tx.update(params, tx.init(params), tags=tags)
    assert seen["tags"]["w"] is tags["w"]
    assert isinstance(seen["tags"]["b"], shardopt.MaskedNode) is compatible


@pytest.mark.parametrize("mask", [True, False, {"w": True, "b": False}])
def test_freeze_matches_optax(mask):
  params = {"w": jnp.arange(3.0), "b": jnp.ones(2)}
  ours, theirs = shardopt.freeze(mask), optax.freeze(mask)
  got, _ = ours.update(params, ours.init(params))
  want, _ = theirs.update(params, theirs.init(params))
  oracle.assert_trees_close(got, want, rtol=0, atol=0)
