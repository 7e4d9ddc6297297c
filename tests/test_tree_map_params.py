"""tree_map_params: maps over the same parts of the state as optax's, for a
range of transformations, and hands each mirror its param's sharding."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardopt
from tests import catalogue
from tests import oracle

# Entries whose params-shaped parts mirror the params leaf for leaf, and
# entries whose params-structured parts hold reductions of each param.
_MIRRORS = ["sgd", "adamw", "inject_hyperparams", "MultiSteps",
            "scale_by_optimistic_gradient"]
_REDUCTIONS = ["scale_by_factored_rms", "scale_by_distance_over_gradients"]


def _mapped(lib, label, with_params):
  tx = catalogue.build(next(e for e in catalogue.ENTRIES if e.label == label),
                       lib)
  params = oracle.mixed_tree()
  rest = (params,) if with_params else ()
  # each leaf of a params-shaped part (+ its param) + 1; other leaves -> -1
  return lib.tree_map_params(
      tx, lambda leaf, *param: leaf + sum(param) + 1.0, tx.init(params), *rest,
      transform_non_params=lambda _: -1.0)


@pytest.mark.parametrize("label", _MIRRORS + _REDUCTIONS)
def test_matches_optax(label):
  with_params = label in _MIRRORS
  got = jax.tree.leaves(_mapped(shardopt, label, with_params))
  want = jax.tree.leaves(_mapped(optax, label, with_params))
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g, np.float32),
                               np.asarray(w, np.float32), rtol=1e-6)


def test_gives_mirrors_their_params_sharding():
  mesh = jax.make_mesh((2, 4), ("data", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  params = {"w": jnp.ones((8, 16)), "b": jnp.ones(16)}
  shardings = {"w": NamedSharding(mesh, P("data", "model")),
               "b": NamedSharding(mesh, P("model"))}
  tx = shardopt.adam(0.1)
  state = tx.init(params)
  replicated = NamedSharding(mesh, P())
  mapped = shardopt.tree_map_params(tx, lambda _, s: s, state, shardings,
                                    transform_non_params=lambda _: replicated)
  adam_state = mapped[0]
  assert adam_state.mu == shardings and adam_state.nu == shardings
  assert adam_state.count == replicated
  placed = jax.device_put(state, mapped)
  assert placed[0].mu["w"].sharding == shardings["w"]


def test_masked_state_maps_as_in_optax():
  params = {"a": (jnp.zeros((1, 2)), jnp.zeros((2, 2))),
            "c": {"d": jnp.zeros((1, 2)), "e": (jnp.zeros((1, 2)), jnp.zeros((1, 2)))}}
  mask = {"a": (True, False), "c": {"d": True, "e": (False, True)}}
  axes = {"a": (1, 2), "c": {"d": 1, "e": (1, 2)}}

  def mapped(lib):
    inner = lib.GradientTransformation(
        lambda p: {"count": jnp.ones([]), "params": p, "copy": p}, lambda u, s, p=None: (u, s))
    tx = lib.masked(inner, mask)
    state = tx.init(params)
    grown = lib.tree.map_params(tx, lambda v: v + 1 if v.shape[0] == 1 else v, state)
    named = lib.tree.map_params(
        tx, lambda p, axis: None if isinstance(p, lib.MaskedNode) else axis, state, axes,
        is_leaf=lambda v: isinstance(v, lib.MaskedNode), transform_non_params=lambda v: None)
    return grown, named, tx.init(jax.tree.map(lambda v: v + 1 if v.shape[0] == 1 else v,
                                              params))

  ours, theirs = mapped(shardopt), mapped(optax)
  for g, w in zip(jax.tree.leaves(ours[0]), jax.tree.leaves(theirs[0]), strict=True):
    np.testing.assert_array_equal(g, w)
  oracle.assert_trees_close(ours[0], ours[2], rtol=0, atol=0)  # as init on mapped params
  named = ours[1].inner_state
  assert named["params"] == named["copy"] == {"a": (1, None), "c": {"d": 1, "e": (None, 2)}}
  assert named["count"] is None
  assert jax.tree.structure(ours[1]).num_leaves == jax.tree.structure(theirs[1]).num_leaves


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("kind", ["auto", "explicit"])
def test_gives_quantized_moments_the_shardings_the_state_has(kind, bits):
  """The optax idiom for state shardings on 8- and 4-bit state: each quantized
  moment's codes and scales get its param's sharding, as
  ``state_shardings`` derives them, and the state placed with them holds
  each device's shard of the codes."""
  axis_type = {"auto": jax.sharding.AxisType.Auto,
               "explicit": jax.sharding.AxisType.Explicit}[kind]
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(axis_type,) * 2)
  params = {"w": jnp.ones((64, 128)), "b": jnp.ones(128)}
  shardings = {"w": NamedSharding(mesh, P(None, "model")),
               "b": NamedSharding(mesh, P("model"))}
  tx = shardopt.adamw(1e-3, state_bits=bits)
  state = tx.init(jax.device_put(params, shardings))
  replicated = NamedSharding(mesh, P())
  mapped = shardopt.tree_map_params(tx, lambda _, s: s, state, shardings,
                                    transform_non_params=lambda _: replicated)
  derived = shardopt.state_shardings(tx, params, shardings)
  assert jax.tree.structure(mapped) == jax.tree.structure(derived)
  for got, want, leaf in zip(jax.tree.leaves(mapped), jax.tree.leaves(derived),
                             jax.tree.leaves(state)):
    assert got.is_equivalent_to(want, leaf.ndim), (got, want)
  codes = jax.device_put(state, mapped)[0].mu["w"].codes
  assert {s.data.shape for s in codes.addressable_shards} == {
      (64, 32 if bits == 8 else 16)}
