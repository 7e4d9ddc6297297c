"""Naming a few of many things in an error message."""

__all__ = ["first_few"]


def first_few(names, shown: int) -> str:
  """The first ``shown`` of ``names`` joined by commas, and how many more
  (``a, b and 3 more``): a message names a few leaves, however many there
  are."""
  names = list(names)
  more = f" and {len(names) - shown} more" if len(names) > shown else ""
  return ", ".join(names[:shown]) + more
