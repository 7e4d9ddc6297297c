"""Per-example clipping and adaptive gradient clipping against optax, and the
per-example functions on a batch sharded over 8 devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shardopt
from tests import oracle

BATCH = 16


def _per_example_grads(batch=BATCH):
  """A mixed tree with a leading batch axis; example norms span 0.3 to 9."""
  keys = jax.random.split(jax.random.PRNGKey(3), batch)
  scales = jnp.linspace(0.05, 1.5, batch)

  def example(key, scale):
    leaves, treedef = jax.tree.flatten(oracle.mixed_tree())
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(treedef, [
        scale * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])

  return jax.vmap(example)(keys, scales)


HAND_GRADS = [jnp.array([[0.0, 0, 0], [0, 3, 4], [4, 0, 3], [3, 4, 0]])]


@pytest.mark.parametrize("clip, want_sum, want_count", [
    (jnp.inf, 7.0, 0), (0.0, 0.0, 3), (1.25, 1.75, 3)])
def test_global_clip_hand_computed(clip, want_sum, want_count):
  total, count = shardopt.per_example_global_norm_clip(HAND_GRADS, clip)
  np.testing.assert_allclose(total[0], [want_sum] * 3)
  assert int(count) == want_count


@pytest.mark.parametrize("clip", [3.0, 9.0])
def test_global_clip_matches_optax(clip):
  grads = _per_example_grads()
  got = shardopt.per_example_global_norm_clip(grads, clip)
  want = optax.per_example_global_norm_clip(grads, clip)
  oracle.assert_trees_close(got, want, rtol=1e-5, atol=1e-6)
  assert 0 < int(got[1]) < BATCH  # some examples clipped, not all


@pytest.mark.parametrize("uniform", [True, False])
def test_layer_clip_matches_optax(uniform):
  grads = _per_example_grads()
  got = shardopt.per_example_layer_norm_clip(grads, 1.5, uniform=uniform)
  want = optax.per_example_layer_norm_clip(grads, 1.5, uniform=uniform)
  # Sums of 16 clipped examples: float32 summation order differs slightly.
  oracle.assert_trees_close(got, want, rtol=1e-5, atol=1e-6)


def test_missing_batch_axis_names_the_leaf():
  grads = {"a": jnp.ones((4, 3)), "b": {"c": jnp.ones((5, 3))}}
  with pytest.raises(ValueError, match=r"\['b'\]\['c'\].*batch"):
    shardopt.per_example_global_norm_clip(grads, 1.0)
  with pytest.raises(ValueError, match="scalar"):
    shardopt.per_example_layer_norm_clip({"s": jnp.ones(())}, 1.0)


@pytest.fixture(scope="module")
def data_mesh():
  return jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))


@pytest.mark.parametrize("fn", ["per_example_global_norm_clip",
                                "per_example_layer_norm_clip"])
def test_sharded_batch_is_never_gathered(data_mesh, fn):
  grads = _per_example_grads()
  sharding = NamedSharding(data_mesh, P("data"))
  sharded = jax.device_put(grads, sharding)
  for leaf in jax.tree.leaves(sharded):  # each device holds 2 examples
    assert {s.data.shape[0] for s in leaf.addressable_shards} == {BATCH // 8}
  clip_fn = jax.jit(lambda g: getattr(shardopt, fn)(g, 1.5))
  hlo = clip_fn.lower(sharded).compile().as_text()
  assert "all-gather" not in hlo and "all-to-all" not in hlo
  assert "all-reduce" in hlo  # the batch sum is a cross-device reduction
  got = clip_fn(sharded)
  want = getattr(optax, fn)(grads, 1.5)
  oracle.assert_trees_close(got, want, rtol=1e-5, atol=1e-6)
  # The output has no batch axis: one result per device, not a batch slab.
  for leaf, ref in zip(jax.tree.leaves(got[0]), jax.tree.leaves(grads)):
    assert leaf.shape == ref.shape[1:]


AGC_CASES = [dict(clipping=0.1), dict(clipping=0.5, eps=0.1)]


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("kwargs", AGC_CASES)
def test_adaptive_grad_clip_matches_optax(kwargs, jit):
  oracle.assert_matches_optax(
      shardopt.adaptive_grad_clip(**kwargs), optax.adaptive_grad_clip(**kwargs),
      jit=jit)


@pytest.mark.parametrize("axis", [-1, (0, 1)])
def test_adaptive_grad_clip_custom_axis_matches_optax(axis):
  params = {"w": oracle.mixed_tree()["conv"]["kernel"],
            "b": oracle.mixed_tree()["block"][0]}
  grads = jax.tree.map(lambda p: 3.0 * p[::-1] + 0.1, params)
  got = shardopt.adaptive_grad_clip(0.2, axis=axis).update(grads, None, params)
  want = optax.adaptive_grad_clip(0.2, axis=axis).update(grads, None, params)
  oracle.assert_trees_close(got[0], want[0])


def test_adaptive_grad_clip_clips_and_needs_params():
  tx = shardopt.adaptive_grad_clip(0.1)
  params = {"w": jnp.array([3.0, 4.0])}
  updates, _ = tx.update({"w": jnp.array([30.0, 40.0])}, tx.init(params),
                         params)
  np.testing.assert_allclose(updates["w"], [0.3, 0.4], rtol=1e-6)
  with pytest.raises(ValueError, match="params"):
    tx.update(params, tx.init(params))
  with pytest.raises(ValueError, match="axis"):
    tx.update({"x": jnp.ones((2,) * 6)}, tx.init(None), {"x": jnp.ones((2,) * 6)})
