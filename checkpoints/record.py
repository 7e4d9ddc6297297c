"""The record saved beside each step's arrays: their layout, their checksums and a digest.

The ``layout`` item is ``{"format", "algorithm", "seed", "leaves", "checksums",
"state_classes", "digest"}``: ``leaves`` is each leaf's shape, dtype and key
implementation (and a quantized leaf's code, ``retile.code_notes``),
``checksums`` each leaf's layout-independent checksum (checkpoints.integrity,
at the points drawn from ``seed``), ``state_classes`` the class of each
NamedTuple node (checkpoints.state_classes), and ``digest`` a SHA-256 of the
leaves, checksums, seed, state classes and the user metadata, so damage to
these small JSON files is caught as well. Older steps stay readable: format 3
without state classes (written before they were recorded) restores without
comparing them, format 2 (checksums of checkpoints.integrity_v2) is verified
with its own checksum, format 1 (no checksums) restores unverified.
"""

from typing import Any

from checkpoints import digest
from checkpoints import integrity
from checkpoints import integrity_v2
from checkpoints import layout
from checkpoints import retile
from checkpoints import state_classes

__all__ = ["FORMAT", "Record", "make", "parse"]

FORMAT = digest.FORMAT
_FORMAT_2 = digest.FORMAT_2
_UNVERIFIED_FORMAT = digest.UNVERIFIED_FORMAT


class Record:
  """A parsed, self-consistent record; ``verify`` checks arrays as read against it."""

  def __init__(self, leaves: dict[str, dict], checksums: dict[str, list[int]] | None,
               recompute=None, classes: dict[str, dict] | None = None):
    self.leaves = leaves
    self.checksums = checksums  # None: a format-1 step, restored unverified
    self.classes = classes  # None: written before state classes were recorded
    self._recompute = recompute

  def damaged(self, values: dict[str, Any]) -> list[str]:
    """Names of the leaves of ``values`` (as read) whose checksum differs from the saved one
    (a collective with several processes)."""
    return integrity.mismatches(self.checksums, self._recompute(values))


def make(state: Any, saveable: dict[str, Any], metadata: Any) -> dict:
  """The record of ``state`` as written (``saveable = layout.to_saveable(state)``).

  A collective with several processes: every process calls it.
  """
  leaves = layout.describe(layout.named_leaves(state), retile.code_notes(state))
  classes = state_classes.of(state)
  seed = integrity.new_seed()
  sums = integrity.checksums(saveable, seed)
  return {"format": FORMAT, "algorithm": integrity.ALGORITHM, "seed": seed, "leaves": leaves,
          "checksums": sums, "state_classes": classes,
          "digest": digest.digest(leaves, sums, metadata, seed, classes)}


def parse(saved: Any, metadata: Any) -> Record:
  """The record as read, or ValueError/TypeError saying what is wrong with it."""
  if not isinstance(saved, dict):
    raise TypeError("its layout item is not a JSON object")
  form, algorithm = saved.get("format"), saved.get("algorithm")
  if form == _UNVERIFIED_FORMAT:
    return Record(saved["leaves"], None)
  if form == _FORMAT_2 and algorithm == integrity_v2.ALGORITHM:
    digest.check(saved, metadata)
    return Record(saved["leaves"], saved["checksums"], integrity_v2.checksums)
  if form != FORMAT or algorithm != integrity.ALGORITHM or not isinstance(saved.get("seed"), int):
    raise ValueError(f"its layout item has format {form!r} / {algorithm!r}, "
                     f"not {FORMAT!r} / {integrity.ALGORITHM!r} with a seed")
  digest.check(saved, metadata)
  seed = saved["seed"]
  return Record(saved["leaves"], saved["checksums"], lambda values: integrity.checksums(values, seed),
                saved.get("state_classes"))
