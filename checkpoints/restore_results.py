"""What the restores of ``CheckpointManager`` return: ``Restored``, and the ``SkippedStep``s
``restore_latest_valid`` passed over."""

from typing import Any
from typing import NamedTuple

__all__ = ["Restored", "SkippedStep"]


class SkippedStep(NamedTuple):
  """A step ``restore_latest_valid`` passed over, why (the CorruptCheckpointError's message), and
  whether its files were missing rather than damaged (a filesystem that lags may yet show them)."""

  step: int
  reason: str
  missing: bool = False


class Restored(NamedTuple):
  """What a restore returns: the state (target's types), its step, the user metadata.

  ``skipped`` lists the newer steps ``restore_latest_valid`` passed over
  because they were damaged, newest first (always empty from ``restore``).
  ``retiled`` names the optimizer-state leaves saved in another quantized
  form than the target's (on another mesh): codes in other blocks re-encoded
  in the target's, codes decoded where the target keeps float, float encoded
  where the target keeps codes.
  """

  state: Any
  step: int
  metadata: dict
  skipped: tuple[SkippedStep, ...] = ()
  retiled: tuple[str, ...] = ()
