"""scale_by_factored_rms against optax, and the shardings of its state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shardopt
from tests import oracle

MESH = jax.sharding.AbstractMesh(
    (2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def abstract_init(tx, specs: dict) -> tuple:
  """``tx.init`` traced on abstract params {name: (shape, spec)} on MESH."""
  with jax.sharding.use_abstract_mesh(MESH):
    params = {
        name: jax.ShapeDtypeStruct(
            shape, jnp.float32, sharding=NamedSharding(MESH, P(*spec)))
        for name, (shape, spec) in specs.items()
    }
    return params, jax.eval_shape(tx.init, params)


def spec_of(aval) -> tuple:
  return tuple(aval.sharding.spec)


def assert_update_keeps_specs(tx, params, state, parts) -> None:
  """``tx.update`` traced on MESH returns ``parts`` of the state unchanged."""
  with jax.sharding.use_abstract_mesh(MESH):
    _, new_state = jax.eval_shape(tx.update, params, state, params)
  for part in parts:
    before = jax.tree.map(spec_of, getattr(state, part))
    assert jax.tree.map(spec_of, getattr(new_state, part)) == before, part


# min_dim_size_to_factor=2 factors the matrix, the 3-D and the 4-D leaves.
CASES = [
    dict(),
    dict(min_dim_size_to_factor=2),
    dict(min_dim_size_to_factor=2, decay_rate=0.5, step_offset=3,
         epsilon=1e-20),
    dict(min_dim_size_to_factor=2, factored=False),
]


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("kwargs", CASES)
def test_matches_optax(kwargs, jit):
  oracle.assert_matches_optax(
      shardopt.scale_by_factored_rms(**kwargs),
      optax.scale_by_factored_rms(**kwargs), jit=jit)


def test_custom_decay_rate_fn_matches_optax():
  capped = lambda step, rate: jnp.minimum(0.999, 1.0 - (step + 1.0) ** -rate)
  kwargs = dict(min_dim_size_to_factor=2, decay_rate_fn=capped)
  oracle.assert_matches_optax(
      shardopt.scale_by_factored_rms(**kwargs),
      optax.scale_by_factored_rms(**kwargs), steps=5)


def test_params_optional_and_state_equal_to_optax():
  params = oracle.mixed_tree()
  ours = shardopt.scale_by_factored_rms(min_dim_size_to_factor=2)
  theirs = optax.scale_by_factored_rms(min_dim_size_to_factor=2)
  our_state, their_state = ours.init(params), theirs.init(params)
  for grads in oracle.gradient_stream(params, 5):
    got, our_state = jax.jit(ours.update)(grads, our_state)
    want, their_state = jax.jit(theirs.update)(grads, their_state, params)
    oracle.assert_trees_close(got, want)
  assert type(our_state).__name__ == "FactoredState"
  oracle.assert_trees_close(tuple(our_state), tuple(their_state))
  v_row_shapes = jax.tree.map(jnp.shape, our_state.v_row)
  assert v_row_shapes["dense"]["kernel"] == (4,)
  assert v_row_shapes["conv"]["kernel"] == (3, 3, 2)
  assert v_row_shapes["vector"] == (1,)


def test_bfloat16_state_keeps_param_dtype():
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), oracle.mixed_tree())
  tx = shardopt.scale_by_factored_rms(min_dim_size_to_factor=2)
  state = tx.init(params)
  _, state = tx.update(params, state)
  want = optax.scale_by_factored_rms(min_dim_size_to_factor=2).init(params)
  assert jax.tree.map(lambda x: x.dtype, state[1:]) == jax.tree.map(
      lambda x: x.dtype, tuple(want[1:]))


def test_statistics_keep_mesh_axes():
  tx = shardopt.scale_by_factored_rms(min_dim_size_to_factor=2)
  params, state = abstract_init(tx, {
      "wide": ((8, 16), ("data", "model")),
      "tall": ((16, 8), ("data", "model")),
      "conv": ((3, 8, 16), (None, "data", "model")),
      "bias": ((16,), ("model",)),
  })
  assert (state.v_row["wide"].shape, spec_of(state.v_row["wide"])) == (
      (8,), ("data",))
  assert (state.v_col["wide"].shape, spec_of(state.v_col["wide"])) == (
      (16,), ("model",))
  # The largest dimension of "tall" is the first: v_row reduces it.
  assert spec_of(state.v_row["tall"]) == ("model",)
  assert spec_of(state.v_col["tall"]) == ("data",)
  assert state.v_row["conv"].shape == (3, 8)
  assert spec_of(state.v_row["conv"]) == (None, "data")
  assert spec_of(state.v_col["conv"]) == (None, "model")
  assert spec_of(state.v["bias"]) == ("model",)
  assert state.v["wide"].shape == (1,)
  assert_update_keeps_specs(tx, params, state, ["v_row", "v_col", "v"])


def test_factored_state_is_sublinear():
  params = {"w": jnp.ones((256, 512))}
  state = shardopt.scale_by_factored_rms().init(params)
  sizes = [np.size(x) for x in jax.tree.leaves(state)]
  assert sum(sizes) == 1 + 256 + 512 + 1
