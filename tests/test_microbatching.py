"""shardopt.microbatching (microbatch, micro_vmap, micro_grad) against the
unbatched computation and optax's, on unsharded and Explicit-sharded batches."""

import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import shardopt
from shardopt import microbatching

_X = jax.random.normal(jax.random.PRNGKey(0), (8, 3))
_Y = jax.random.normal(jax.random.PRNGKey(1), (8,))


def _fun(x, scale, *, y):
  """Per-row outputs, a sum and a mean over the (micro)batch."""
  rows = scale * jnp.sum(x, axis=1) + y
  return {"rows": rows, "sum": jnp.sum(rows), "mean": jnp.mean(x, axis=0)}


def _run(lib, **kwargs):
  types = lib.microbatching.AccumulationType
  accumulator = {"rows": types.CONCAT, "sum": types.SUM, "mean": types.MEAN}
  fn = lib.microbatch(_fun, argnums=0, microbatch_size=2, accumulator=accumulator,
                      argnames="y", **kwargs)
  return jax.jit(fn)(_X, 2.0, y=_Y)


def test_microbatch_equals_one_batch_and_optax():
  got = _run(shardopt)
  whole = _fun(_X, 2.0, y=_Y)
  for k in whole:
    np.testing.assert_allclose(got[k], whole[k], rtol=1e-6, atol=1e-6)
  for k, v in _run(optax).items():
    np.testing.assert_array_equal(got[k], v)
  assert shardopt.microbatch is microbatching.microbatch


def test_running_mean_over_the_real_microbatches_as_optax():
  def run(lib):
    fn = lib.microbatch(lambda x: jnp.mean(x, axis=0), 0, 2,
                        lib.microbatching.AccumulationType.RUNNING_MEAN, num_real_microbatches=3)
    return fn(_X)
  got = run(shardopt)
  # Microbatch j holds rows j, j + 4: the first three hold rows {0, 4}, {1, 5}, {2, 6}.
  np.testing.assert_allclose(got, jnp.mean(_X[jnp.array([0, 1, 2, 4, 5, 6])], axis=0),
                             rtol=1e-6)
  np.testing.assert_allclose(got, run(optax), rtol=1e-6)


def test_bad_batches_and_accumulators_are_named():
  fn = shardopt.microbatch(jnp.sum, 0, 3)
  with pytest.raises(ValueError, match="not divisible by microbatch_size=3"):
    fn(_X)
  both = shardopt.microbatch(lambda a, b: a.sum() + b.sum(), (0, 1), 2)
  with pytest.raises(ValueError, match="equal batch sizes"):
    both(_X, _Y[:6])
  with pytest.raises(ValueError, match="require floating-point"):
    shardopt.microbatch(jnp.sum, 0, 2, microbatching.AccumulationType.MEAN)(
        jnp.arange(8))
  assert shardopt.microbatch(jnp.sum, 0, None) is jnp.sum


def test_micro_vmap_is_vmap():
  fn = lambda x, s: s * jnp.sum(x ** 2)  # noqa: E731
  got = microbatching.micro_vmap(fn, in_axes=(0, None), microbatch_size=2)(_X, 3.0)
  np.testing.assert_allclose(got, jax.vmap(fn, in_axes=(0, None))(_X, 3.0), rtol=1e-6)
  summed = microbatching.micro_vmap(fn, in_axes=(0, None), microbatch_size=4,
                                    accumulator=microbatching.AccumulationType.SUM)(_X, 3.0)
  np.testing.assert_allclose(summed, jnp.sum(got), rtol=1e-6)


def test_micro_grad_per_example_gradients_as_optax():
  def loss(params, features, targets):
    return 0.5 * jnp.mean((features @ params - targets) ** 2)

  def run(lib):
    return lib.microbatching.micro_grad(
        loss, argnums=0, batch_argnums=(1, 2), microbatch_size=2,
        accumulator=lib.microbatching.AccumulationType.MEAN,
        transform_fn=lambda g: (g, g ** 2), metrics_fn=jnp.linalg.norm)(
            jnp.zeros(3), _X, _Y)

  (mean_grad, mean_sq), aux = run(shardopt)
  per_example = jax.vmap(jax.grad(loss), (None, 0, 0))(jnp.zeros(3), _X[:, None], _Y[:, None])
  np.testing.assert_allclose(mean_grad, per_example.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(mean_sq, (per_example ** 2).mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux.metrics, jnp.linalg.norm(per_example, axis=1), rtol=1e-5)
  np.testing.assert_allclose(aux.values, 0.5 * _Y ** 2, rtol=1e-5)
  want = run(optax)
  for g, w in zip(jax.tree.leaves(((mean_grad, mean_sq), aux)), jax.tree.leaves(want),
                  strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("model_axis", [AxisType.Explicit, AxisType.Auto],
                         ids=["explicit", "mixed"])
def test_batch_sharded_over_an_explicit_axis_stays_sharded(model_axis):
  # "mixed": 'data' Explicit, 'model' Auto (a mesh of both kinds).
  mesh = jax.make_mesh((4, 2), ("data", "model"),
                       axis_types=(AxisType.Explicit, model_axis))
  x = jax.device_put(_X, NamedSharding(mesh, P("data")))
  with jax.set_mesh(mesh):
    split = microbatching.reshape_batch_axis(x, 4)
    rows = jax.jit(shardopt.microbatch(lambda a: a * 2.0, 0, 4,
                                       microbatching.AccumulationType.CONCAT))(x)
  assert split.shape == (2, 4, 3) and split.sharding.spec == P(None, "data", None)
  np.testing.assert_array_equal(split[1], _X[1::2])
  assert rows.sharding.spec == P("data", None)
  np.testing.assert_array_equal(rows, 2.0 * _X)
  with pytest.raises(ValueError, match="4 shards, which must divide microbatch_size=2"):
    microbatching.reshape_batch_axis(x, 2)
