"""Partition rules: ordered (regex, spec) pairs over '/'-joined parameter paths.

For each parameter the first rule whose pattern is found in its path
(``re.search``; anchor with ``^``/``$`` to match whole names) gives its
PartitionSpec. Rank-0 leaves (scalars) need no rule: they are always
replicated, ``P()``. A parameter that no rule matches is an error naming it,
so a new parameter is never silently replicated; end the rules with
``('.*', P())`` to replicate everything else on purpose. With
``strict=True`` a parameter that two rules with *different* layouts match is
an error too (an ambiguity that rule order alone resolves; specs that differ
only by trailing ``None`` entries are one layout); the last rule is exempt
where it matches every param (a catch-all, however written: ``'.*'``,
``'^.*$'``, ``''``).
"""

import re
from collections.abc import Mapping
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import PartitionSpec

from partitioning.specs import PartitionError, as_spec, leaf_dtype, leaves_with_paths, zip_specs
from partitioning.table import format_table

__all__ = ["Rules", "match_partition_rules", "matching_rule", "rule_table"]

Rules = Sequence[tuple[str, PartitionSpec | tuple | None]]

_SCALAR = -1  # Stands for "no rule needed" in matching_rule's answer.


def _compiled(rules: Rules) -> list[tuple[re.Pattern, PartitionSpec]]:
  if isinstance(rules, Mapping):
    raise PartitionError("Rules are a sequence of (regex, spec) pairs, tried in order (first match"
                         " wins), not a mapping: pass list(rules.items()) to keep its order.")
  out = []
  for i, rule in enumerate(rules):
    if not (isinstance(rule, (tuple, list)) and len(rule) == 2):
      raise PartitionError(f"Rule {i} is {rule!r}: each rule is a (regex, spec) pair.")
    pattern, spec = rule
    try:
      out.append((re.compile(pattern), as_spec(spec)))
    except re.error as e:
      raise PartitionError(f"Rule {i}: pattern {pattern!r} is not a valid regex: {e}.") from None
    except PartitionError as e:
      raise PartitionError(f"Rule {i} ({pattern!r}): {e}") from None
  return out


def _first_pattern(compiled, path: str) -> int | None:
  """Index of the first rule whose pattern is found in ``path``."""
  return next((i for i, (pattern, _) in enumerate(compiled) if pattern.search(path)), None)


def _first_match(compiled, path: str, shape: Sequence[int]) -> int | None:
  return _SCALAR if len(shape) == 0 else _first_pattern(compiled, path)


def matching_rule(rules: Rules, path: str, shape: Sequence[int]) -> int | None:
  """Index of the rule that partitions ``path``; -1 for a scalar; None if none."""
  return _first_match(_compiled(rules), path, shape)


def _list_rules(rules: Rules) -> str:
  return "\n".join(f"  {i}: {pattern!r} -> {as_spec(spec)}" for i, (pattern, spec) in enumerate(rules))


def _layout(spec: PartitionSpec) -> tuple:
  """``spec``'s entries without trailing ``None``s: ``P('model', None)`` and
  ``P('model')`` lay a param out alike."""
  entries = list(spec)
  while entries and entries[-1] is None:
    entries.pop()
  return tuple(entries)


def _catch_all(compiled, paths: list[str]) -> int | None:
  """The last rule's index where its pattern is found in every path."""
  last = len(compiled) - 1
  if last >= 0 and all(compiled[last][0].search(path) for path in paths):
    return last
  return None


def _conflicting_rules(compiled, path: str, exempt: int | None) -> list[int]:
  """Indices of the rules (``exempt`` aside) matching ``path``, when they
  disagree on the layout."""
  hits = [i for i, (pattern, _) in enumerate(compiled)
          if i != exempt and pattern.search(path)]
  return hits if len({_layout(compiled[i][1]) for i in hits}) > 1 else []


def match_partition_rules(rules: Rules, params: Any, *, strict: bool = False) -> Any:
  """A tree of PartitionSpec, one per leaf of ``params``, first match wins.

  ``params`` holds arrays or ``jax.ShapeDtypeStruct``s (anything with a shape).
  Raises PartitionError listing every unmatched path and the rules; with
  ``strict``, also every path that rules with different specs match.
  """
  compiled = _compiled(rules)
  leaves = leaves_with_paths(params)
  exempt = _catch_all(compiled, [path for path, leaf in leaves if np.shape(leaf)])
  specs, unmatched, ambiguous = [], [], []
  for path, leaf in leaves:
    index = _first_match(compiled, path, np.shape(leaf))
    if strict and index not in (None, _SCALAR):
      conflict = _conflicting_rules(compiled, path, exempt)
      if conflict:
        ambiguous.append(f"  {path}: rules {conflict} give "
                         + ", ".join(str(compiled[i][1]) for i in conflict))
    if index is None:
      unmatched.append(path)
      specs.append(None)
    else:
      specs.append(PartitionSpec() if index == _SCALAR else compiled[index][1])
  if unmatched:
    raise PartitionError(
        "No partition rule matches these params (add a rule, or end the rules"
        " with ('.*', P()) to replicate the rest):\n"
        + "\n".join(f"  {p}" for p in unmatched)
        + f"\nRules, in order (first match wins):\n{_list_rules(rules)}"
    )
  if ambiguous:
    raise PartitionError(
        "These params match several rules with different specs (tighten the"
        " patterns, e.g. anchor them with ^...$, or pass strict=False to let"
        " the first match win):\n" + "\n".join(ambiguous)
        + f"\nRules, in order:\n{_list_rules(rules)}"
    )
  return jax.tree.unflatten(jax.tree.structure(params), specs)


def rule_table(rules: Rules, params: Any, specs: Any = None) -> str:
  """A printable table: param path, shape, dtype, matched rule, spec.

  ``specs`` defaults to ``match_partition_rules(rules, params)``; pass your
  own (edited) specs to show them next to the rule each param matches. Rules
  that match no param are listed at the end: usually a typo in a pattern.
  """
  if specs is None:
    specs = match_partition_rules(rules, params)
  compiled, rows, used = _compiled(rules), [], set()
  for path, leaf, spec in zip_specs(params, specs):
    index = _first_match(compiled, path, np.shape(leaf))
    used.add(_first_pattern(compiled, path))  # a scalar's too: it is not a typo
    rule = {None: "(no rule)", _SCALAR: "(scalar)"}.get(index)
    rule = rule or f"{index}: {rules[index][0]}"
    dtype = str(leaf_dtype(leaf))
    rows.append([path, str(tuple(np.shape(leaf))), dtype, rule, str(spec)])
  table = format_table(["param", "shape", "dtype", "rule", "spec"], rows)
  unused = [f"  {i}: {rules[i][0]!r}" for i in range(len(rules)) if i not in used]
  if unused:
    table += "\nRules that match no param:\n" + "\n".join(unused)
  return table
