"""The public surface documents itself the way optax's does.

(a) The main aliases carry a runnable ``Example:`` whose printed output is
    checked by ``doctest`` (on CPU).
(b) Every public function returning a transformation, in ``shardopt``,
    ``shardopt.contrib`` and ``shardopt.schedules``, has a Google-style
    docstring with ``Args:`` (naming every parameter of its signature;
    functions without parameters need none), ``Returns:`` and
    ``References:`` sections.
(c) Every other public function implemented in ``shardopt._src`` or
    ``shardopt.schedules`` (building blocks, tree arithmetic, numerics,
    schedules) has ``Args:`` (every parameter) and ``Returns:``.
"""

import doctest
import inspect
import re

import pytest

import shardopt
from tests.test_harness import _returns_transformation

ALIASES_WITH_EXAMPLES = (
    "adafactor", "adagrad", "adam", "adamw", "lamb", "lion", "rmsprop", "sgd",
    "sm3",
)

_NAMESPACES = (
    ("shardopt", shardopt),
    ("shardopt.contrib", shardopt.contrib),
    ("shardopt.schedules", shardopt.schedules),
)

_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:")


def _transformation_constructors() -> list[tuple[str, object]]:
  found = []
  for prefix, namespace in _NAMESPACES:
    for name in namespace.__all__:
      obj = getattr(namespace, name)
      if _returns_transformation(obj):
        found.append((f"{prefix}.{name}", obj))
  return found


def sections(doc: str) -> dict[str, list[str]]:
  """Google-style sections of a cleaned docstring: header -> its lines.

  A header is an unindented line ``Name:``; its section is the indented
  lines that follow, up to the next unindented line.
  """
  found: dict[str, list[str]] = {}
  current = None
  for line in doc.splitlines():
    header = _SECTION.match(line)
    if header:
      current = found.setdefault(header.group(1), [])
    elif line and not line[0].isspace():
      current = None
    elif current is not None:
      current.append(line)
  return found


def documented_args(arg_lines: list[str]) -> set[str]:
  """The names an ``Args:`` section documents (``*args`` as ``args``)."""
  indents = [len(line) - len(line.lstrip()) for line in arg_lines if line.strip()]
  if not indents:
    return set()
  names = set()
  for line in arg_lines:
    if line.strip() and len(line) - len(line.lstrip()) == min(indents):
      entry = _ARG.match(line.strip())
      if entry:
        names.add(entry.group(1).lstrip("*"))
  return names


def _utilities() -> list[tuple[str, object]]:
  found = []
  for prefix, namespace in _NAMESPACES:
    for name in namespace.__all__:
      obj = getattr(namespace, name)
      module = getattr(obj, "__module__", "") or ""
      if (callable(obj) and not inspect.isclass(obj)
          and not _returns_transformation(obj)
          and module.startswith(("shardopt._src.", "shardopt.schedules."))):
        found.append((f"{prefix}.{name}", obj))
  return found


def docstring_problems(obj, references: bool = True) -> list[str]:
  """What the docstring of ``obj`` lacks, in words; empty when complete."""
  doc = inspect.getdoc(obj) or ""
  found = sections(doc)
  parameters = list(inspect.signature(obj).parameters)
  required = ((["Args"] if parameters else []) + ["Returns"]
              + (["References"] if references else []))
  problems = [f"no '{name}:' section" for name in required
              if not any(line.strip() for line in found.get(name, []))]
  if parameters and "Args" in found:
    missing = [p for p in parameters if p not in documented_args(found["Args"])]
    if missing:
      problems.append(f"'Args:' does not name {missing}")
  return problems


# --- (a) runnable examples ---------------------------------------------------

@pytest.mark.parametrize("name", ALIASES_WITH_EXAMPLES)
def test_alias_example_runs(name):
  alias = getattr(shardopt, name)
  assert "Example" in sections(inspect.getdoc(alias) or ""), (
      f"shardopt.{name} has no 'Example:' section")
  tests = doctest.DocTestFinder(recurse=False).find(alias, f"shardopt.{name}")
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  report = []
  for test in tests:
    runner.run(test, out=report.append)
  results = runner.summarize(verbose=False)
  assert results.attempted > 0, f"shardopt.{name}'s Example has no >>> lines"
  assert results.failed == 0, "".join(report)


# --- (b) sections of every public transformation ---------------------------

def test_every_public_transformation_is_documented():
  constructors = _transformation_constructors()
  assert len(constructors) > 100  # the catalogue is that large
  incomplete = {name: problems for name, obj in constructors
                if (problems := docstring_problems(obj))}
  assert not incomplete, "incomplete docstrings (Google style, like optax):\n" + (
      "\n".join(f"  {name}: {'; '.join(problems)}"
                for name, problems in sorted(incomplete.items())))


def test_every_public_utility_has_args_and_returns():
  utilities = _utilities()
  assert len(utilities) > 30  # schedules, tree arithmetic, numerics, base
  incomplete = {name: problems for name, obj in utilities
                if (problems := docstring_problems(obj, references=False))}
  assert not incomplete, "incomplete docstrings (Google style):\n" + (
      "\n".join(f"  {name}: {'; '.join(problems)}"
                 for name, problems in sorted(incomplete.items())))


def test_the_section_check_catches_what_it_should():
  def complete(learning_rate, *args, mask=None):
    """Summary.

    Args:
      learning_rate: a rate.
      *args: more.
      mask (tree): a mask.

    Returns:
      Something.

    References:
      A paper.
    """

  def lacking(learning_rate, momentum=None):
    """Summary.

    Args:
      learning_rate: a rate. momentum: mentioned in the text only.

    References: A paper.
    """

  assert docstring_problems(complete) == []
  assert docstring_problems(lacking) == [
      "no 'Returns:' section", "no 'References:' section",
      "'Args:' does not name ['momentum']"]
