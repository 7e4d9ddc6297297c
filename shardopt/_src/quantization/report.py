"""What ``quantized_state`` stores, leaf by leaf, and how that is collected.

A ``QuantizedStateReport`` holds one ``QuantizedLeaf`` per float state
leaf. Every ``quantized_state`` whose ``init`` is traced inside
``collecting_reports`` adds its rows (``record``):
``describe_quantized_state`` traces a transformation's ``init`` so, and the
sharding plan keeps the moments left in float for want of a block that
fits their shard (``fallbacks``).
"""

import contextlib
import contextvars
from typing import Any
from typing import NamedTuple

import jax

from shardopt._src import typed_layouts

__all__ = ["QuantizedLeaf", "QuantizedStateReport", "collecting_reports",
           "describe_quantized_state", "fallbacks", "record"]

# While ``collecting_reports`` is open: each quantizer whose ``init`` is
# traced adds ``(bits, rows)`` of its report.
_REPORT: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "quantized_state_report", default=None)


class QuantizedLeaf(NamedTuple):
  """How one float state leaf is stored, and why."""

  path: str  # within the wrapped transformation's state
  shape: tuple[int, ...]
  stored: str  # the code book's name, or the float dtype kept
  tile: tuple[int, ...] | None  # block shape; None when not quantized
  nbytes: int  # bytes of the stored leaf (codes + scales, or the float)
  reason: str  # why it is kept in float or stored wider than asked, or ""
  no_block_fits: bool = False  # a moment kept in float: no tile fits its shard


class QuantizedStateReport(NamedTuple):
  """``describe_quantized_state``'s answer: one line per float state leaf."""

  bits: int  # of the (first) quantized_state found
  leaves: tuple[QuantizedLeaf, ...]

  @property
  def kept(self) -> tuple[QuantizedLeaf, ...]:
    """Every float leaf stored as it was, each with its reason."""
    return tuple(l for l in self.leaves if l.tile is None)

  @property
  def widened(self) -> tuple[QuantizedLeaf, ...]:
    """Moments stored with more bits than asked: their state class
    declares a floor (``declare_moments(min_bits=...)``)."""
    return tuple(l for l in self.leaves if l.tile is not None and l.reason)

  @property
  def fallbacks(self) -> tuple[QuantizedLeaf, ...]:
    """Moments shaped like their param, of at least ``min_size`` elements,
    kept in float because no tile fits their shard."""
    return tuple(l for l in self.leaves if l.no_block_fits)

  def __str__(self) -> str:
    stored = sum(l.nbytes for l in self.leaves)
    lines = [f"quantized state ({self.bits}-bit): {stored:,} bytes stored"]
    width = max([len(l.path) for l in self.leaves] + [4])
    for l in self.leaves:
      how = f"kept: {l.reason}" if l.tile is None else (
          f"tile {l.tile}" + (f", {l.reason}" if l.reason else ""))
      lines.append(f"  {l.path:<{width}}  {l.shape!s:<14} {l.stored:<20} {how}")
    return "\n".join(lines)


def _rows(state, decisions, stored) -> list[QuantizedLeaf]:
  """A row per float leaf of ``state``: its ``decisions`` and, where
  quantized, the ``QuantizedArray`` it is ``stored`` as."""
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(state)[0]]
  rows = []
  for path, leaf, d, kept in zip(paths, jax.tree.leaves(state), decisions,
                                 stored):
    if d is None:
      continue
    if d.tile is None:
      rows.append(QuantizedLeaf(path, tuple(leaf.shape), str(leaf.dtype),
                                None, leaf.size * leaf.dtype.itemsize,
                                d.reason, d.no_block_fits))
    else:
      rows.append(QuantizedLeaf(
          path, tuple(leaf.shape), kept.book.name, d.tile,
          kept.codes.size + kept.scales.size * kept.scales.dtype.itemsize,
          d.reason))
  return rows


def record(bits: int, state, decisions, stored) -> None:
  """Adds ``(bits, rows)`` of an inner ``state`` (its ``decisions``, its
  leaves as ``stored``) to the reports being collected, if any."""
  reports = _REPORT.get()
  if reports is not None:
    reports.append((bits, _rows(state, decisions, stored)))


@contextlib.contextmanager
def collecting_reports():
  """A list that every ``quantized_state`` whose ``init`` is traced inside
  this context adds ``(bits, rows)`` of its report to (a cached trace adds
  nothing: trace a new function)."""
  reports: list[tuple[int, list[QuantizedLeaf]]] = []
  token = _REPORT.set(reports)
  try:
    yield reports
  finally:
    _REPORT.reset(token)


def fallbacks(reports) -> tuple[QuantizedLeaf, ...]:
  """The moments that ``collecting_reports``' ``reports`` keep in float
  because no block fits their shard."""
  return tuple(row for _, rows in reports for row in rows if row.no_block_fits)


def describe_quantized_state(tx, params, param_shardings: Any = None
                             ) -> QuantizedStateReport:
  """How every ``quantized_state`` inside ``tx`` stores each float leaf.

  Args:
    tx: a transformation that is, or contains, ``quantized_state``
      (``adam(..., state_bits=8)``, ``masked(quantized_state(...))``, ...).
    params: the params (arrays or ``jax.ShapeDtypeStruct``).
    param_shardings: the layout the state is fitted to, a ``NamedSharding``
      per param (for a sharded optimizer, its ``plan.update_shardings``:
      the params' layout with ZeRO's axis added); None: unsharded.

  Returns:
    A ``QuantizedStateReport``: per float leaf of each quantized inner
    state, its code book and tile, or why it stays in float.
  """
  init = lambda p: tx.init(p)  # a new function: never a cached trace
  with collecting_reports() as reports:
    if param_shardings is None:
      jax.eval_shape(init, params)
    else:
      leaves = jax.tree.leaves(param_shardings)
      if not leaves:
        raise ValueError("describe_quantized_state: param_shardings has no "
                         "leaves.")
      typed_layouts.eval_shape_typed(
          init, params, jax.tree.map(lambda s: s.spec, param_shardings),
          leaves[0].mesh)
  if not reports:
    raise TypeError("describe_quantized_state: tx holds no "
                    "shardopt.quantized_state.")
  return QuantizedStateReport(
      reports[0][0], tuple(row for _, rows in reports for row in rows))
