"""chain, named_chain, partition / multi_transform and selective_transform."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import partitioning
import shardopt
from tests import oracle


def _by_rank(params):
  """Labels: 'low' for rank <= 1, 'high' otherwise."""
  return jax.tree.map(lambda p: "low" if p.ndim <= 1 else "high", params)


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
def test_chain_matches_optax(jit, with_params):
  # A foreign (optax) stateful part inside our chain, next to ours.
  ours = shardopt.chain(optax.scale_by_adam(), shardopt.trace(0.5),
                        shardopt.scale(-0.1))
  theirs = optax.chain(optax.scale_by_adam(), optax.trace(0.5),
                       optax.scale(-0.1))
  oracle.assert_matches_optax(ours, theirs, jit=jit, with_params=with_params)


def test_chain_equals_manual_application():
  parts = [shardopt.ema(0.9), shardopt.trace(0.5, nesterov=True),
           shardopt.scale(-0.1)]
  params = oracle.mixed_tree()
  tx = shardopt.chain(*parts)
  state = tx.init(params)
  states = [p.init(params) for p in parts]
  for grads in oracle.gradient_stream(params, 5):
    chained, state = tx.update(grads, state)
    manual = grads
    for i, part in enumerate(parts):
      manual, states[i] = part.update(manual, states[i])
    oracle.assert_trees_close(chained, manual, rtol=0, atol=0)
  assert isinstance(state, tuple) and len(state) == 3


def _needs_value():
  """A transformation that requires the extra argument ``value``."""

  def update_fn(updates, state, params=None, *, value):
    return jax.tree.map(lambda u: u * value, updates), state

  return shardopt.GradientTransformationExtraArgs(
      shardopt.init_empty_state, update_fn)


def test_chain_forwards_extra_args_only_to_parts_that_take_them():
  # optax.scale's update takes no extra args: it must not receive `value`.
  tx = shardopt.chain(optax.scale(2.0), _needs_value(), shardopt.scale(3.0))
  updates, _ = tx.update(jnp.ones(3), tx.init(jnp.ones(3)), value=0.5)
  np.testing.assert_allclose(updates, 3.0 * np.ones(3))
  named = shardopt.named_chain(("a", optax.scale(2.0)), ("v", _needs_value()))
  updates, _ = named.update(jnp.ones(3), named.init(jnp.ones(3)), value=4.0)
  np.testing.assert_allclose(updates, 8.0 * np.ones(3))


def test_chain_rejects_a_foreign_state():
  tx = shardopt.chain(shardopt.scale(1.0), shardopt.scale(2.0))
  with pytest.raises(ValueError, match="init"):
    tx.update(jnp.ones(2), (shardopt.EmptyState(),))


def test_named_chain_matches_chain_and_keeps_order():
  named = shardopt.named_chain(("zeta", shardopt.ema(0.9)),
                               ("alpha", shardopt.scale_by_adam()))
  plain = optax.chain(optax.ema(0.9), optax.scale_by_adam())
  oracle.assert_matches_optax(named, plain, steps=5)
  assert list(named.init(oracle.mixed_tree())) == ["zeta", "alpha"]
  with pytest.raises(ValueError, match="unique"):
    shardopt.named_chain(("a", shardopt.scale(1.0)), ("a", shardopt.scale(2.0)))


def _first_letter_labels(tree):
  """Labels each leaf of a nested dict by the first letter of its key."""
  return {k: _first_letter_labels(v) if isinstance(v, dict) else k[0]
          for k, v in tree.items()}


@pytest.mark.parametrize("labels_as_fn", [True, False])
def test_multi_transform_by_hand(labels_as_fn):
  params = {"a1": 1.0, "b1": 2.0, "z1": {"a2": 3.0, "z2": {"c1": 4.0}}}
  params = jax.tree.map(jnp.asarray, params)
  labels = _first_letter_labels if labels_as_fn else _first_letter_labels(params)
  tx = shardopt.multi_transform(
      {"a": shardopt.scale(-1.0), "b": shardopt.ema(0.0),  # ema is stateful
       "c": shardopt.scale(2.0)}, labels)
  update = jax.jit(tx.update)
  state = jax.jit(tx.init)(params)
  factor = {"a1": -1.0, "b1": 1.0, "a2": -1.0, "c1": 2.0}
  expected = lambda u: jax.tree_util.tree_map_with_path(
      lambda path, x: factor[path[-1].key] * x, u)
  updates = jax.tree.map(lambda p: p / 10, params)
  for with_params in (True, False):  # the second time, without params
    want = expected(updates)
    updates, state = update(updates, state, params if with_params else None)
    oracle.assert_trees_close(updates, want)
  assert isinstance(state, shardopt.MultiTransformState)
  assert shardopt.MultiTransformState is shardopt.PartitionState
  assert int(state.inner_states["b"].inner_state.count) == 2


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("labels_as_fn", [True, False])
def test_partition_matches_optax(labels_as_fn, jit, with_params):
  labels = _by_rank if labels_as_fn else _by_rank(oracle.mixed_tree())
  ours = shardopt.partition(
      {"low": shardopt.chain(shardopt.ema(0.9), shardopt.scale(-0.1)),
       "high": shardopt.scale_by_adam()}, labels)
  theirs = optax.partition(
      {"low": optax.chain(optax.ema(0.9), optax.scale(-0.1)),
       "high": optax.scale_by_adam()}, labels)
  oracle.assert_matches_optax(ours, theirs, jit=jit, with_params=with_params)


def test_partition_prefix_labels_and_state_leaves_match_optax():
  params = oracle.mixed_tree()
  labels = {"scalar": "a", "vector": "a", "dense": "b", "conv": "a",
            "block": "b"}
  transforms = lambda m: {"a": m.ema(0.5), "b": m.trace(0.9)}
  ours = shardopt.partition(transforms(shardopt), labels)
  theirs = optax.partition(transforms(optax), labels)
  oracle.assert_matches_optax(ours, theirs, steps=4)
  # Each label's state holds arrays for its own params only, like optax's.
  for got, want in zip(jax.tree.leaves(ours.init(params)),
                       jax.tree.leaves(theirs.init(params)), strict=True):
    assert got.shape == want.shape


def test_partition_names_unlabelled_paths():
  params = {"w": jnp.ones(2), "b": jnp.ones(2)}
  tx = shardopt.partition({"w": shardopt.scale(1.0)}, {"w": "w", "b": "bias"})
  with pytest.raises(ValueError, match=r"\['b'\]: 'bias'"):
    tx.init(params)


@pytest.mark.parametrize("jit", [True, False])
def test_selective_transform_matches_optax(jit):
  freeze_mask = jax.tree.map(lambda p: p.ndim == 2, oracle.mixed_tree())
  ours = shardopt.selective_transform(shardopt.adam(0.1),
                                     freeze_mask=freeze_mask)
  theirs = optax.selective_transform(optax.adam(0.1), freeze_mask=freeze_mask)
  oracle.assert_matches_optax(ours, theirs, jit=jit)
  updates, _ = ours.update(oracle.mixed_tree(1), ours.init(oracle.mixed_tree()))
  assert not np.any(np.asarray(updates["dense"]["kernel"]))


def test_state_of_all_wrappers_follows_param_shardings():
  """Each wrapper's state is built from the params, so specs can be derived."""
  mesh = partitioning.make_abstract_mesh({"data": 2, "model": 4})
  specs = {"w": P(None, "model"), "b": P("model")}
  params = {"w": jax.ShapeDtypeStruct((8, 16), jnp.float32),
            "b": jax.ShapeDtypeStruct((16,), jnp.float32)}
  inner = shardopt.partition(
      {"matrix": shardopt.apply_if_finite(shardopt.adam(0.1), 2),
       "vector": shardopt.masked(shardopt.ema(0.9), {"w": False, "b": True})},
      {"w": "matrix", "b": "vector"})
  tx = shardopt.MultiSteps(
      shardopt.chain(shardopt.apply_every(2), inner,
                     shardopt.conditionally_mask(shardopt.trace(0.9),
                                                 lambda step: step > 0)), 4)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no state less sharded than its param
    plan = shardopt.plan_state_shardings(
        tx, params, partitioning.named_shardings(mesh, specs))
  mirrors = {}
  for leaf in plan.leaves:
    if leaf.param is not None:
      mirrors.setdefault(leaf.param, set()).add(leaf.spec)
  assert mirrors == {"['w']": {specs["w"]}, "['b']": {specs["b"]}}
  # acc_grads + apply_every + adam (mu, nu) + trace for w; + ema for b.
  counts = {p: sum(l.param == p for l in plan.leaves) for p in mirrors}
  assert counts == {"['w']": 5, "['b']": 4}
