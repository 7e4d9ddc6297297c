"""The record saved beside each step's arrays: their layout, their checksums and a digest.

The ``layout`` item is ``{"format", "leaves", "checksums", "digest"}``:
``leaves`` is each leaf's shape, dtype and key implementation,
``checksums`` each leaf's layout-independent checksum (checkpoints.integrity),
and ``digest`` a SHA-256 of the leaves, checksums and the user metadata, so
damage to these small JSON files is caught as well. Steps written before
checksums existed (format 1) restore without verification.
"""

import hashlib
import json
from typing import Any

from checkpoints import integrity
from checkpoints import layout

__all__ = ["FORMAT", "Record", "make", "parse"]

FORMAT = "shardopt.checkpoint/2"
_UNVERIFIED_FORMAT = "shardopt.checkpoint/1"


class Record:
  """A parsed, self-consistent record (``checksums`` is None for unverified format-1 steps)."""

  def __init__(self, leaves: dict[str, dict], checksums: dict[str, list[int]] | None):
    self.leaves = leaves
    self.checksums = checksums


def _digest(leaves: dict, checksums: dict, metadata: Any) -> str:
  text = json.dumps({"leaves": leaves, "checksums": checksums, "metadata": metadata}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def make(state: Any, saveable: dict[str, Any], metadata: Any) -> dict:
  """The record of ``state`` as written (``saveable = layout.to_saveable(state)``).

  A collective with several processes: every process calls it.
  """
  leaves = layout.describe(layout.named_leaves(state))
  sums = integrity.checksums(saveable)
  return {"format": FORMAT, "algorithm": integrity.ALGORITHM, "leaves": leaves, "checksums": sums,
          "digest": _digest(leaves, sums, metadata)}


def parse(saved: Any, metadata: Any) -> Record:
  """The record as read, or ValueError/TypeError saying what is wrong with it."""
  if not isinstance(saved, dict):
    raise TypeError("its layout item is not a JSON object")
  if saved.get("format") == _UNVERIFIED_FORMAT:
    return Record(saved["leaves"], None)
  if saved.get("format") != FORMAT or saved.get("algorithm") != integrity.ALGORITHM:
    raise ValueError(f"its layout item has format {saved.get('format')!r} / {saved.get('algorithm')!r}, "
                     f"not {FORMAT!r} / {integrity.ALGORITHM!r}")
  if _digest(saved.get("leaves"), saved.get("checksums"), metadata) != saved.get("digest"):
    raise ValueError("its layout or metadata file changed after it was written (digest mismatch)")
  return Record(saved["leaves"], saved["checksums"])
