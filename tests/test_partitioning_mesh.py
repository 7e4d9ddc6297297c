"""Meshes from dicts and strings on the 8 simulated devices; abstract meshes; bad shapes."""

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from partitioning import (PartitionError, describe_axis_types, make_abstract_mesh, make_mesh,
                          parse_mesh_shape)


@pytest.mark.parametrize(
    "shape, expected",
    [
        ({"data": 2, "model": 4}, {"data": 2, "model": 4}),
        ("data=2,model=4", {"data": 2, "model": 4}),
        (" data = -1 , model = 2 ", {"data": 4, "model": 2}),
        ({"data": -1}, {"data": 8}),
    ],
)
def test_make_mesh_uses_all_devices_with_auto_axes(shape, expected):
  mesh = make_mesh(shape)
  assert dict(mesh.shape) == expected
  assert mesh.devices.size == 8 and set(mesh.devices.flat) == set(jax.devices())
  assert mesh.axis_types == (AxisType.Auto,) * len(expected)


def test_explicit_axes_on_request_and_given_devices():
  mesh = make_mesh("data=-1", axis_types="explicit", devices=jax.devices()[:4])
  assert dict(mesh.shape) == {"data": 4}
  assert mesh.axis_types == (AxisType.Explicit,)
  assert set(mesh.devices.flat) == set(jax.devices()[:4])


def test_abstract_mesh_of_256_devices_needs_none():
  mesh = make_abstract_mesh({"fsdp": 16, "model": 16})
  assert dict(mesh.shape) == {"fsdp": 16, "model": 16} and mesh.size == 256
  assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
  assert dict(make_abstract_mesh("data=-1,model=8", num_devices=256).shape) == {"data": 32, "model": 8}


def test_parse_keeps_minus_one_without_device_count():
  assert parse_mesh_shape("data=-1,model=4") == {"data": -1, "model": 4}


def test_numpy_integer_sizes_are_sizes():
  """Sizes computed with NumPy (np.prod, // on arrays) were refused as not positive integers."""
  mesh = make_mesh({"data": np.int64(4), "model": np.int32(-1)})
  assert dict(mesh.shape) == {"data": 4, "model": 2}
  assert {type(size) for size in parse_mesh_shape({"data": np.int64(2)}).values()} == {int}
  with pytest.raises(PartitionError, match="Bad mesh axis 'data'=True"):
    make_mesh({"data": True})


@pytest.mark.parametrize(
    "shape, message",
    [
        ("data=3,model=-1", "the fixed axes multiply to 3, which does not divide the 8 devices"),
        ({"data": 2, "model": 2}, "has 4 devices but there are 8"),
        ("data=-1,model=-1", "more than one -1 axis (data, model)"),
        ("data=2,model", "part 'model' is not 'name=size'"),
        ("data=two", "size 'two' of axis 'data' is not an integer"),
        ("data=2,data=4", "axis 'data' appears twice"),
        ({"data": 0, "model": 8}, "Bad mesh axis 'data'=0"),
        ({}, "Empty mesh shape"),
    ],
)
def test_bad_shapes_raise_clear_errors(shape, message):
  with pytest.raises(PartitionError) as e:
    make_mesh(shape)
  assert message in str(e.value)


@pytest.mark.parametrize("axis_types", [
    {"data": "explicit", "model": "auto"},
    {"model": AxisType.Auto, "data": AxisType.Explicit},
    "data=explicit, model=auto",
])
def test_each_axis_may_have_its_own_type(axis_types):
  mesh = make_mesh("data=2,model=4", axis_types=axis_types)
  assert mesh.axis_types == (AxisType.Explicit, AxisType.Auto)
  assert mesh.abstract_mesh.explicit_axes == ("data",)
  abstract = make_abstract_mesh({"data": 16, "model": 16}, axis_types=axis_types)
  assert abstract.axis_types == (AxisType.Explicit, AxisType.Auto)
  assert describe_axis_types(mesh) == "data explicit, model auto axes"
  assert describe_axis_types(make_mesh("data=8", axis_types="explicit")) == "explicit axes"


@pytest.mark.parametrize(
    "axis_types, message",
    [
        ("data=explicit", "gives no type to axis 'model': name every axis, e.g."
                          " 'data=explicit,model=auto'"),
        ({"data": "auto", "model": "auto", "batch": "auto"},
         "names 'batch', which is not an axis of the mesh (axes: data, model)"),
        ("data=explicit,model=manual", "type 'manual' of axis 'model' is not one of"),
        ("data=explicit,model", "part 'model' is not 'name=type'"),
        ("data=auto,data=explicit", "axis 'data' appears twice"),
    ],
)
def test_bad_per_axis_types_raise_clear_errors(axis_types, message):
  with pytest.raises(PartitionError) as e:
    make_mesh("data=2,model=4", axis_types=axis_types)
  assert message in str(e.value)


def test_bad_axis_types_and_abstract_minus_one():
  with pytest.raises(PartitionError, match=r"axis_types='manual': expected one of \['auto', 'explicit'\]"):
    make_mesh("data=8", axis_types="manual")
  with pytest.raises(PartitionError, match="has a -1 axis: an abstract mesh has no devices"):
    make_abstract_mesh("data=-1")
