"""Device meshes from a shape such as ``{'data': 2, 'model': 4}`` or ``"data=2,model=4"``.

One axis may be ``-1``: it takes the devices the other axes leave. A real mesh
uses all global devices (``jax.devices()``, every host's), so the same call
works on one host or many. Axes are Auto by default (what ``jit`` with
in/out shardings and Flax logical partitioning expect); ``jax.make_mesh``
would make them Explicit in this jax version.
"""

import math
from typing import Mapping, Sequence

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh
import numpy as np

from partitioning.specs import PartitionError

__all__ = ["make_abstract_mesh", "make_mesh", "parse_mesh_shape"]

MeshShape = Mapping[str, int] | str

_AXIS_TYPES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def _parse_string(shape: str) -> dict[str, int]:
  out = {}
  for part in shape.split(","):
    name, eq, size = part.strip().partition("=")
    name, size = name.strip(), size.strip()
    if not eq or not name.isidentifier():
      raise PartitionError(
          f"Bad mesh shape {shape!r}: part {part.strip()!r} is not"
          " 'name=size'. Write e.g. 'data=2,model=4'."
      )
    try:
      out_size = int(size)
    except ValueError:
      raise PartitionError(
          f"Bad mesh shape {shape!r}: size {size!r} of axis {name!r} is not an"
          " integer. Write e.g. 'data=2,model=4' (one axis may be -1)."
      ) from None
    if name in out:
      raise PartitionError(f"Bad mesh shape {shape!r}: axis {name!r} appears twice.")
    out[name] = out_size
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


def _axis_types(axis_types: str, n: int) -> tuple[AxisType, ...]:
  if axis_types not in _AXIS_TYPES:
    raise PartitionError(
        f"axis_types={axis_types!r}: expected one of {sorted(_AXIS_TYPES)}."
    )
  return (_AXIS_TYPES[axis_types],) * n


def make_mesh(
    shape: MeshShape,
    *,
    axis_types: str = "auto",
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A mesh over all global devices (or ``devices``), Auto axes unless asked."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = parse_mesh_shape(shape, len(devices))
  return jax.make_mesh(
      tuple(sizes.values()),
      tuple(sizes),
      axis_types=_axis_types(axis_types, len(sizes)),
      devices=devices,
  )


def make_abstract_mesh(
    shape: MeshShape, *, axis_types: str = "auto", num_devices: int | None = None
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
      tuple(sizes.values()), tuple(sizes), axis_types=_axis_types(axis_types, len(sizes))
  )
