"""State leaves less sharded than the param they derive from.

A leaf that lacks one of its param's mesh axes is reported (never silently)
where that costs memory: a mirror (state built from a bare shape), or any
leaf holding more elements per device than its param (Shampoo's block
statistics where the block grid does not divide over an axis, a replicated
statistic larger than a shard). The message names the leaf, its param, the
spec it got, the axes lost and what keeps it split. Statistics small by
design (Adafactor's rows and columns, per-param scalars) are not reported.
"""

import math
from typing import NamedTuple

from shardopt.sharding._plan import LeafPlan
from shardopt.sharding._specs import entry_size
from shardopt.sharding._specs import spec_axes as _axes

__all__ = ["lost_parts", "under_sharded_message"]


class _Lost(NamedTuple):
  """How much of its param's layout a state leaf lost."""

  axes: tuple[str, ...]  # the param's mesh axes the leaf does not use
  parts: int  # into how many parts the leaf is split
  param_parts: int  # into how many parts its param is split
  elements: int  # the leaf's elements per device
  param_elements: int  # its param's elements per device


def _parts(spec, mesh) -> int:
  return math.prod(mesh.shape[a] for a in _axes(spec))


def lost_parts(plan: LeafPlan, param, param_spec, mesh) -> _Lost | None:
  """What ``plan``'s leaf lost of its param's layout, where it matters; None
  where it lost nothing or nothing that matters.

  A leaf matters when it lacks one of its param's mesh axes and is a mirror
  (its param's shape), or holds more elements per device than its param
  does (a leaf of at least its param's size split into fewer parts than the
  param, e.g. Shampoo's block statistics whose block grid the param's axes
  do not divide, or a replicated statistic larger than a shard). State that
  is small by design (Adafactor's row/column statistics, SM3's covers,
  per-param scalars) holds fewer elements per device than its param and
  is not reported.
  """
  axes = tuple(sorted(a for a in _axes(param_spec) - _axes(plan.spec) if mesh.shape[a] > 1))
  if not axes:
    return None
  parts, param_parts = _parts(plan.spec, mesh), _parts(param_spec, mesh)
  lost = _Lost(axes, parts, param_parts, -(-math.prod(plan.shape) // parts),
               -(-math.prod(param.shape) // param_parts))
  return lost if plan.mirrors or lost.elements > lost.param_elements else None


def _shard_shape(shape, spec, mesh) -> tuple[int, ...]:
  return tuple(-(-d // entry_size(mesh, e)) for d, e in zip(shape, spec))


def under_sharded_message(lost, param_leaves, spec_leaves, param_paths,
                           mesh) -> str:
  """One line per leaf (the param, the spec it got, the parts lost) and per
  param what keeps its state split."""
  lines, hints = [], {}
  for pl, owner, l in lost:
    param, spec = param_leaves[owner], spec_leaves[owner]
    axes = ", ".join(f"{a!r}={mesh.shape[a]}" for a in l.axes)
    lines.append(
        f"  {pl.path} {pl.shape} of params{param_paths[owner]} "
        f"{tuple(param.shape)} {spec}: got {pl.spec}, without {axes}: split "
        f"into {l.parts} parts where its param is split into {l.param_parts}, "
        f"{l.elements} elements per device where its param has "
        f"{l.param_elements} ({l.elements / max(l.param_elements, 1):.2g}x)")
    shard = _shard_shape(param.shape, spec, mesh)
    split = [n for n, e in zip(shard, spec) if e is not None]
    block = math.gcd(*split) if split else None
    hints[owner] = (
        f"  params{param_paths[owner]}: each device holds a {shard} shard"
        + (f"; if its state is built in blocks, a block_size dividing its split"
           f" dimensions (e.g. {block}) keeps each block on one device"
           if block and block > 1 else ""))
  return (
      "these optimizer-state leaves are less sharded than the param they "
      "derive from, so each device holds more of them than its share:\n"
      + "\n".join(lines)
      + "\nTo keep them split: state built from a bare shape "
      "(jnp.zeros(p.shape)) loses its param's layout, build it with "
      "jnp.zeros_like(p); state built in blocks (Shampoo's and SOAP's "
      "block_size) is split only where the blocks tile each shard:\n"
      + "\n".join(hints.values()))
