"""What ``quantized_state`` stores, leaf by leaf (``describe_quantized_state``)."""

from typing import NamedTuple

__all__ = ["QuantizedLeaf", "QuantizedStateReport"]


class QuantizedLeaf(NamedTuple):
  """How one float state leaf is stored, and why."""

  path: str  # within the wrapped transformation's state
  shape: tuple[int, ...]
  stored: str  # the code book's name, or the float dtype kept
  tile: tuple[int, ...] | None  # block shape; None when not quantized
  nbytes: int  # bytes of the stored leaf (codes + scales, or the float)
  reason: str  # why it is kept in float or stored wider than asked, or ""


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
    return tuple(l for l in self.leaves if l.reason.startswith("no tile"))

  def __str__(self) -> str:
    stored = sum(l.nbytes for l in self.leaves)
    lines = [f"quantized state ({self.bits}-bit): {stored:,} bytes stored"]
    width = max([len(l.path) for l in self.leaves] + [4])
    for l in self.leaves:
      how = f"kept: {l.reason}" if l.tile is None else (
          f"tile {l.tile}" + (f", {l.reason}" if l.reason else ""))
      lines.append(f"  {l.path:<{width}}  {l.shape!s:<14} {l.stored:<20} {how}")
    return "\n".join(lines)
