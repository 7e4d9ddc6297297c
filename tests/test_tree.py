"""tree_vdot against optax's tree.vdot: unsharded, and sharded on Auto and
Explicit meshes (where a raveling vdot is rejected)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from shardopt import tree
from shardopt import tree_utils
from tests import oracle


def _sharded_pair(axis_type):
  """Two trees on a (2, 4) mesh: a matrix sharded on both axes, a vector on
  one, a replicated scalar."""
  kind = getattr(AxisType, axis_type)
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(kind, kind))
  specs = {"w": P("data", "model"), "b": P("model"), "s": P()}

  def make(seed):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
    leaves = {"w": jax.random.normal(k1, (8, 12)),
              "b": jax.random.normal(k2, (12,)),
              "s": jax.random.normal(k3, ())}
    return jax.tree.map(
        lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), leaves, specs)

  return mesh, make(0), make(1)


@pytest.mark.parametrize("jit", [False, True])
def test_unsharded_matches_optax(jit):
  x, y = oracle.mixed_tree(0), oracle.mixed_tree(1)
  vdot = jax.jit(tree.tree_vdot) if jit else tree.tree_vdot
  got = vdot(x, y)
  assert got.shape == () and got.dtype == jnp.float32
  np.testing.assert_allclose(got, optax.tree.vdot(x, y), rtol=1e-6)


def test_complex_leaves_give_the_real_part():
  x = {"z": jnp.array([1 + 2j, 3 - 1j]), "r": jnp.array([2.0])}
  y = {"z": jnp.array([2 - 1j, 1 + 1j]), "r": jnp.array([3.0])}
  # (1-2i)(2-i) + (3+i)(1+i) = -5i + (2+4i): real part 2, plus 6.
  np.testing.assert_allclose(tree.tree_vdot(x, y), 8.0)
  np.testing.assert_allclose(tree.tree_vdot(x, y),
                             np.real(optax.tree.vdot(x, y)), rtol=1e-6)


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_sharded_matches_optax_unsharded(axis_type):
  mesh, x, y = _sharded_pair(axis_type)
  want = optax.tree.vdot(jax.device_get(x), jax.device_get(y))
  with jax.set_mesh(mesh):
    eager = tree.tree_vdot(x, y)
    jitted = jax.jit(tree.tree_vdot)(x, y)
  for got in (eager, jitted):
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got.sharding.is_fully_replicated


@pytest.mark.parametrize("shape", [(20,), (20, 10), ()])
def test_complex_with_real_equals_jnp_vdot_bit_for_bit(shape):
  rng = np.random.RandomState(0)
  a = rng.randn(*shape) + 1j * rng.randn(*shape)  # complex128: complex64 in jax
  b = rng.randn(*shape)  # float64: float32 in jax
  want = jnp.vdot(a, b, precision=jax.lax.Precision.HIGHEST)
  np.testing.assert_array_equal(tree_utils.tree_vdot(a, b), want)
  np.testing.assert_array_equal(tree_utils.tree_vdot(a, b), optax.tree_utils.tree_vdot(a, b))
  np.testing.assert_array_equal(tree.tree_vdot(a, b), np.real(want))
