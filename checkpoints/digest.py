"""The digest a step's record keeps of its leaves, checksums, seed, state classes and the
user metadata (checkpoints.record), and its check. Imports neither jax nor orbax, so a
launcher can tell, before jax starts, whether a step's metadata is the one written."""

import hashlib
import json
from typing import Any

__all__ = ["FORMAT", "FORMAT_2", "UNVERIFIED_FORMAT", "check", "digest"]

FORMAT = "shardopt.checkpoint/3"
FORMAT_2 = "shardopt.checkpoint/2"
UNVERIFIED_FORMAT = "shardopt.checkpoint/1"


def digest(leaves: dict, checksums: dict, metadata: Any, seed: int | None = None,
           classes: dict | None = None) -> str:
  """SHA-256 of the record's fields and the user metadata."""
  fields = {"leaves": leaves, "checksums": checksums, "metadata": metadata}
  if seed is not None:
    fields["seed"] = seed
  if classes is not None:
    fields["state_classes"] = classes
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def check(saved: Any, metadata: Any) -> None:
  """Raises ValueError unless the layout item ``saved`` vouches for ``metadata`` (its digest
  matches; a format-1 step has none and passes)."""
  if not isinstance(saved, dict):
    raise ValueError("its layout item is not a JSON object")
  if saved.get("format") == UNVERIFIED_FORMAT:
    return
  seed = None if saved.get("format") == FORMAT_2 else saved.get("seed")
  if digest(saved.get("leaves"), saved.get("checksums"), metadata, seed,
            saved.get("state_classes")) != saved.get("digest"):
    raise ValueError("its layout or metadata file changed after it was written (digest mismatch)")
