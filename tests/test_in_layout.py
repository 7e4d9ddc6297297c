"""``shardopt.sharding.in_layout`` on every kind of mesh: all axes Auto, all
Explicit, or 'data' Explicit and 'model' Auto, inside ``jit`` and called
eagerly: the array ends in the sharding asked for, its values unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardopt

_KINDS = {"auto": (AxisType.Auto,) * 2, "explicit": (AxisType.Explicit,) * 2,
          "mixed": (AxisType.Explicit, AxisType.Auto)}


@pytest.mark.parametrize("traced", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("kind", list(_KINDS))
@pytest.mark.parametrize("spec", [P("data", "model"), P(None, "model"),
                                  P(("data", "model")), P()], ids=str)
def test_the_array_ends_in_the_sharding_asked_for(kind, spec, traced):
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=_KINDS[kind])
  sharding = NamedSharding(mesh, spec)
  x = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
  lay_out = lambda a: shardopt.sharding.in_layout({"x": a}, {"x": sharding})["x"]
  with jax.sharding.set_mesh(mesh):
    y = jax.jit(lay_out)(x) if traced else lay_out(x)
  assert y.sharding.is_equivalent_to(sharding, 2), (y.sharding, sharding)
  np.testing.assert_array_equal(np.asarray(y), np.asarray(x))
