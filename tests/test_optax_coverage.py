"""What ``import shardopt as optax`` covers, checked against optax's own lists.

The README section "What `import shardopt as optax` covers" states these sets;
a test below checks that it names every one of them.
"""

import pathlib
import types
import warnings

import optax
import pytest

import shardopt

COVERED_NAMESPACES = ("assignment", "contrib", "losses", "microbatching", "perturbations",
                      "projections", "schedules", "second_order", "transforms", "tree",
                      "tree_utils")
NOT_COVERED_NAMESPACES = ("experimental",)
_README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _public_names(module) -> set[str]:
  with warnings.catch_warnings():  # optax's deprecated re-exports warn on access
    warnings.simplefilter("ignore", DeprecationWarning)
    return {n for n in dir(module) if not n.startswith("_")
            and not isinstance(getattr(module, n), types.ModuleType)}


def test_top_level_covers_all_of_optax_all():
  assert set(optax.__all__) - set(dir(shardopt)) == set()


@pytest.mark.parametrize("namespace", COVERED_NAMESPACES)
def test_namespace_covers_every_public_name(namespace):
  missing = _public_names(getattr(optax, namespace)) - set(dir(getattr(shardopt, namespace)))
  assert not missing, f"shardopt.{namespace} lacks {sorted(missing)}"


@pytest.mark.parametrize("namespace", NOT_COVERED_NAMESPACES)
def test_uncovered_namespace_is_absent_rather_than_partial(namespace):
  assert hasattr(optax, namespace)
  assert not hasattr(shardopt, namespace)


def test_readme_states_exactly_these_sets():
  text = _README.read_text()
  section = text[text.index("## What `import shardopt as optax` covers"):]
  section = section[:section.index("\n## ", 1)]
  for name in (*COVERED_NAMESPACES, *NOT_COVERED_NAMESPACES):
    assert f"`{name}`" in section or f"`optax.{name}`" in section, name
