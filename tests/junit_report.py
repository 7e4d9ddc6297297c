"""Outcomes of the test cases in a pytest JUnit XML report (``--junitxml``)."""

import pathlib
import xml.etree.ElementTree as ElementTree

# A test case's elements that are not an outcome (failure, error, skipped).
_OUTPUT = {"system-out", "system-err", "properties"}


def outcomes(report: pathlib.Path) -> dict[str, set[str]]:
  """Per test case name, its outcome elements: empty for a pass; {} when
  the report was not written."""
  if not report.exists():
    return {}
  return {case.get("name"): {element.tag for element in case} - _OUTPUT
          for case in ElementTree.parse(report).getroot().iter("testcase")}
