"""validate_specs: each problem's message, and all problems reported together."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from partitioning import PartitionError, make_abstract_mesh, make_mesh, spec_problems, validate_specs

MESH = make_abstract_mesh({"data": 2, "model": 4})
PARAMS = {"w": jax.ShapeDtypeStruct((8, 12), jnp.float32), "b": jax.ShapeDtypeStruct((6,), jnp.float32)}


def test_sound_specs_pass_on_real_and_abstract_meshes():
  specs = {"w": P("data", "model"), "b": P()}
  validate_specs(PARAMS, specs, MESH)
  validate_specs({"w": jnp.zeros((8, 12)), "b": jnp.zeros(6)}, specs, make_mesh("data=2,model=4"))
  assert spec_problems(PARAMS, {"w": P(("data", "model")), "b": P("data")}, MESH) == []


@pytest.mark.parametrize(
    "w_spec, message",
    [
        (P("data", "tensor"),
         "w (8, 12) with P('data', 'tensor'): unknown mesh axes ['tensor']; the mesh has ['data', 'model']."),
        (P(("model", "data"), "model"),
         "w (8, 12) with P(('model', 'data'), 'model'): mesh axes ['model'] used more than once;"
         " an axis can shard one dimension only."),
        (P("data", None, "model"),
         "w (8, 12) with P('data', None, 'model'): spec has 3 entries but the array has rank 2;"
         " drop the extra entries."),
        (P(None, ("data", "model")),
         "w (8, 12) with P(None, ('data', 'model')): dim 1 of size 12 is not divisible by 8, the size of"
         " mesh axes ('data', 'model'); shard another dim or pad it to a multiple of 8."),
        ("data", "w (8, 12) with data: not a PartitionSpec; use P(...) (P() replicates)."),
    ],
)
def test_each_problem_is_named(w_spec, message):
  with pytest.raises(PartitionError) as e:
    validate_specs(PARAMS, {"w": w_spec, "b": P()}, MESH)
  assert str(e.value) == f"1 partitioning problem(s) on mesh (data=2, model=4):\n  {message}"


def test_all_problems_are_reported_together():
  specs = {"w": P("model", "expert", None), "b": P("model")}
  with pytest.raises(PartitionError) as e:
    validate_specs(PARAMS, specs, MESH)
  lines = str(e.value).splitlines()
  assert lines[0] == "3 partitioning problem(s) on mesh (data=2, model=4):"
  assert lines[1].startswith("  b (6,) with P('model',): dim 0 of size 6 is not divisible by 4,")
  assert lines[2].startswith("  w (8, 12) with P('model', 'expert', None): unknown mesh axes ['expert']")
  assert lines[3].startswith("  w (8, 12) with P('model', 'expert', None): spec has 3 entries but the array has rank 2")
  assert len(lines) == 4


def test_mismatched_trees_name_the_missing_and_extra_paths():
  with pytest.raises(PartitionError) as e:
    validate_specs(PARAMS, {"w": P(), "c": P()}, MESH)
  assert "params without a spec: ['b']" in str(e.value)
  assert "specs without a param: ['c']" in str(e.value)
