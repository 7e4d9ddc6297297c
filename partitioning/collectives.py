"""What a compiled SPMD program communicates: its collectives, from HLO text.

``collectives(compiled.as_text())`` lists every collective instruction of the
partitioned program with its kind, the bytes of its per-device result and the
size of its device groups. ``wire_bytes`` estimates what one device sends for
it with the usual ring/direct algorithms: an all-reduce of S bytes over k
devices 2 (k - 1) / k S, an all-gather or all-to-all with result S
(k - 1) / k S, a reduce-scatter with result S (k - 1) S, a collective-permute
S (pairs that send to themselves excluded). XLA:CPU emits all-reduce plus
dynamic-slice where GPU/TPU emit reduce-scatter (JAX-NOTES), so compare two
programs compiled for the same backend.
"""

import math
import re
from typing import NamedTuple

__all__ = ["Collective", "collectives", "summarize_collectives"]

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
          "collective-permute")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
             "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
             "f64": 8, "c64": 8, "c128": 16}
_INSTRUCTION = re.compile(
    r"=\s*(?P<shape>\([^=]*?\)|\w+\[[\d,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<kind>" + "|".join(_KINDS) + r")(?:-start)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


class Collective(NamedTuple):
  """One collective instruction of a partitioned program."""

  kind: str
  result_bytes: int  # of the per-device result (a tuple's arrays summed)
  group_size: int  # devices that take part together

  @property
  def wire_bytes(self) -> float:
    """Bytes one device sends for it (ring all-reduce/all-gather)."""
    k, size = self.group_size, self.result_bytes
    if k <= 1:
      return 0.0
    if self.kind == "all-reduce":
      return 2 * (k - 1) / k * size
    if self.kind == "reduce-scatter":
      return (k - 1) * size
    if self.kind == "collective-permute":
      return float(size)
    return (k - 1) / k * size


def _array_bytes(shape_text: str) -> int:
  return sum(_ITEMSIZE.get(dtype, 0) * math.prod(
      int(d) for d in dims.split(",") if d) for dtype, dims in
             _ARRAY.findall(shape_text))


def _group_size(attributes: str, kind: str) -> int:
  """Devices per group, from replica_groups (any of XLA's spellings)."""
  if kind == "collective-permute":
    pairs = re.findall(r"\{(\d+),(\d+)\}", attributes)
    return 2 if any(a != b for a, b in pairs) else 1
  found = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
  if found:
    return int(found.group(2))
  found = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}",
                    attributes)
  if found:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", found.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'",
                                                       found.group(2)))
  found = re.search(r"replica_groups=\{\{([\d,]*)\}", attributes)
  if found:
    return len(found.group(1).split(","))
  return 1


def collectives(hlo_text: str) -> list[Collective]:
  """Every collective of a compiled program (``compiled.as_text()``)."""
  found = []
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.search(line)
    if match and "-done" not in match.group("kind"):
      kind = match.group("kind")
      found.append(Collective(kind, _array_bytes(match.group("shape")),
                              _group_size(match.group("rest"), kind)))
  return found


def summarize_collectives(found: list[Collective]) -> dict[str, dict]:
  """kind -> {'count', 'result_bytes', 'wire_bytes'} (kinds present only)."""
  summary: dict[str, dict] = {}
  for c in found:
    entry = summary.setdefault(c.kind, {"count": 0, "result_bytes": 0,
                                        "wire_bytes": 0.0})
    entry["count"] += 1
    entry["result_bytes"] += c.result_bytes
    entry["wire_bytes"] += c.wire_bytes
  return summary
