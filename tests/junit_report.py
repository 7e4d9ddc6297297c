"""Outcomes of the test cases in a pytest JUnit XML report (``--junitxml``)."""

import pathlib
import xml.etree.ElementTree as ElementTree

# A test case's elements that are not an outcome (failure, error, skipped).
_OUTPUT = {"system-out", "system-err", "properties"}


def _outcome(element) -> str:
  """An outcome element's tag; an expected failure (``skipped`` of type
  ``pytest.xfail``) is ``xfailed``."""
  xfailed = element.tag == "skipped" and element.get("type") == "pytest.xfail"
  return "xfailed" if xfailed else element.tag


def outcomes(report: pathlib.Path) -> dict[str, set[str]]:
  """Per test case name, its outcomes (failure, error, skipped, xfailed):
  empty for a pass; {} when the report was not written."""
  if not report.exists():
    return {}
  return {case.get("name"): {_outcome(element) for element in case
                             if element.tag not in _OUTPUT}
          for case in ElementTree.parse(report).getroot().iter("testcase")}
