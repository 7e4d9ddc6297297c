"""Device meshes from a shape such as ``{'data': 2, 'model': 4}`` or ``"data=2,model=4"``.

One axis may be ``-1``: it takes the devices the other axes leave. A real mesh
uses all global devices (``jax.devices()``, every host's), so the same call
works on one host or many. Axes are Auto by default (what ``jit`` with
in/out shardings and Flax logical partitioning expect); ``jax.make_mesh``
would make them Explicit in this jax version. ``axis_types`` makes every
axis ``"auto"`` or ``"explicit"``, or gives each axis its own type
(``{"data": "explicit", "model": "auto"}`` or ``"data=explicit,model=auto"``).
"""

import math
from typing import Mapping, Sequence

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh
import numpy as np

from partitioning.specs import PartitionError

__all__ = ["describe_axis_types", "make_abstract_mesh", "make_mesh",
           "parse_axis_types", "parse_mesh_shape"]

MeshShape = Mapping[str, int] | str
AxisTypes = Mapping[str, str | AxisType] | str

_AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _pairs(text: str, what: str, value: str, example: str) -> dict[str, str]:
  """``"a=x,b=y"`` as ``{"a": "x", "b": "y"}``; ``what``, ``value`` and
  ``example`` word the errors."""
  out = {}
  for part in text.split(","):
    name, eq, given = part.strip().partition("=")
    name = name.strip()
    if not eq or not name.isidentifier():
      raise PartitionError(
          f"Bad {what} {text!r}: part {part.strip()!r} is not"
          f" 'name={value}'. Write e.g. {example!r}."
      )
    if name in out:
      raise PartitionError(f"Bad {what} {text!r}: axis {name!r} appears twice.")
    out[name] = given.strip()
  return out


def _parse_string(shape: str) -> dict[str, int]:
  out = {}
  for name, size in _pairs(shape, "mesh shape", "size", "data=2,model=4").items():
    try:
      out[name] = int(size)
    except ValueError:
      raise PartitionError(
          f"Bad mesh shape {shape!r}: size {size!r} of axis {name!r} is not an"
          " integer. Write e.g. 'data=2,model=4' (one axis may be -1)."
      ) from None
  return out


def parse_mesh_shape(shape: MeshShape, num_devices: int | None = None) -> dict[str, int]:
  """Checks a mesh shape and, given ``num_devices``, resolves its -1 axis.

  Without ``num_devices`` a -1 is kept as is. With it, the sizes must multiply
  to exactly ``num_devices``.
  """
  sizes = _parse_string(shape) if isinstance(shape, str) else dict(shape)
  if not sizes:
    raise PartitionError("Empty mesh shape: give at least one axis, e.g. {'data': -1}.")
  for name, size in sizes.items():
    whole = isinstance(size, (int, np.integer)) and not isinstance(size, bool)
    if not isinstance(name, str) or not whole or (size < 1 and size != -1):
      raise PartitionError(
          f"Bad mesh axis {name!r}={size!r} in {shape!r}: sizes are positive"
          " integers, or -1 for the rest of the devices."
      )
  sizes = {name: int(size) for name, size in sizes.items()}
  free = [name for name, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise PartitionError(
        f"Mesh shape {shape!r} has more than one -1 axis ({', '.join(free)}):"
        " at most one axis can take the rest of the devices."
    )
  if num_devices is None:
    return sizes
  fixed = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if num_devices % fixed:
      raise PartitionError(
          f"Mesh shape {shape!r}: the fixed axes multiply to {fixed}, which does"
          f" not divide the {num_devices} devices, so -1 axis {free[0]!r} has no"
          " whole size."
      )
    sizes[free[0]] = num_devices // fixed
  elif fixed != num_devices:
    raise PartitionError(
        f"Mesh shape {shape!r} has {fixed} devices but there are {num_devices}:"
        " the sizes must multiply to the device count (use -1 on one axis to"
        " take the rest)."
    )
  return sizes


def parse_axis_types(axis_types: AxisTypes, axes) -> tuple[AxisType, ...]:
  """One ``AxisType`` per axis of ``axes`` (names, in the mesh's order).

  Args:
    axis_types: ``"auto"`` or ``"explicit"`` for every axis; or each axis's
      own, as a mapping ``{"data": "explicit", "model": "auto"}`` (values
      may be ``jax.sharding.AxisType``s) or the string
      ``"data=explicit,model=auto"``, naming every axis once.
    axes: the mesh's axis names.

  Raises:
    PartitionError: an unknown type, an axis the mesh lacks, or one left
      without a type.
  """
  axes = tuple(axes)
  example = ",".join(f"{a}={k}" for a, k in zip(axes, ("explicit", "auto") * len(axes)))
  if isinstance(axis_types, str) and "=" not in axis_types:
    if axis_types not in _AXIS_TYPES:
      raise PartitionError(
          f"axis_types={axis_types!r}: expected one of {sorted(_AXIS_TYPES)}, or"
          f" a type per axis such as {example!r}."
      )
    return (_AXIS_TYPES[axis_types],) * len(axes)
  per_axis = (_pairs(axis_types, "axis types", "type", example)
              if isinstance(axis_types, str) else dict(axis_types))
  unknown = [a for a in per_axis if a not in axes]
  if unknown:
    raise PartitionError(
        f"axis_types={axis_types!r} names {unknown[0]!r}, which is not an axis"
        f" of the mesh (axes: {', '.join(axes)})."
    )
  missing = [a for a in axes if a not in per_axis]
  if missing:
    raise PartitionError(
        f"axis_types={axis_types!r} gives no type to axis {missing[0]!r}: name"
        f" every axis, e.g. {example!r}."
    )
  for name, kind in per_axis.items():
    if not isinstance(kind, AxisType) and kind not in _AXIS_TYPES:
      raise PartitionError(
          f"axis_types={axis_types!r}: type {kind!r} of axis {name!r} is not one"
          f" of {sorted(_AXIS_TYPES)}."
      )
  return tuple(per_axis[a] if isinstance(per_axis[a], AxisType)
               else _AXIS_TYPES[per_axis[a]] for a in axes)


def describe_axis_types(mesh) -> str:
  """``"auto axes"``, ``"explicit axes"`` or, where they differ, each
  axis's type (``"data explicit, model auto axes"``)."""
  kinds = {t: k for k, t in _AXIS_TYPES.items()}
  named = [kinds.get(t, str(t)) for t in mesh.axis_types]
  if len(set(named)) == 1:
    return f"{named[0]} axes"
  return ", ".join(f"{a} {k}" for a, k in zip(mesh.axis_names, named)) + " axes"


def make_mesh(
    shape: MeshShape,
    *,
    axis_types: AxisTypes = "auto",
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A mesh over all global devices (or ``devices``), Auto axes unless asked."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = parse_mesh_shape(shape, len(devices))
  return jax.make_mesh(
      tuple(sizes.values()),
      tuple(sizes),
      axis_types=parse_axis_types(axis_types, sizes),
      devices=devices,
  )


def make_abstract_mesh(
    shape: MeshShape, *, axis_types: AxisTypes = "auto", num_devices: int | None = None
) -> AbstractMesh:
  """A mesh with no devices, for planning a layout of any size on this machine.

  A -1 axis needs ``num_devices``.
  """
  sizes = parse_mesh_shape(shape, num_devices)
  if -1 in sizes.values():
    raise PartitionError(
        f"Mesh shape {shape!r} has a -1 axis: an abstract mesh has no devices"
        " to fill it, so pass num_devices=..."
    )
  return AbstractMesh(
      tuple(sizes.values()), tuple(sizes), axis_types=parse_axis_types(axis_types, sizes)
  )
