"""Plain-text tables for the rule table and the memory plan."""

from typing import Sequence

__all__ = ["format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], right_from: int | None = None) -> str:
  """Columns padded to width, a dashed rule under the header.

  Columns from index ``right_from`` on are right-aligned (numbers).
  """
  widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

  def line(row):
    cells = [
        c.rjust(w) if right_from is not None and i >= right_from else c.ljust(w)
        for i, (c, w) in enumerate(zip(row, widths))
    ]
    return "  ".join(cells).rstrip()

  return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
