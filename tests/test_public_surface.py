"""The public surface: explicit exports, modules that are modules, no name lost.

tests/public_names_0.1.txt lists the top-level public names of shardopt 0.1
(every non-module attribute of ``shardopt`` before the layout by concern);
each must still be reachable as ``shardopt.<name>``.
"""

import ast
import importlib
import inspect
import pathlib
import pkgutil
import types

import optax
import pytest

import shardopt

_PACKAGE = pathlib.Path(shardopt.__file__).parent
_NAMES_0_1 = (pathlib.Path(__file__).parent / "public_names_0.1.txt").read_text().split()
_NAMESPACES = ("assignment", "contrib", "losses", "microbatching", "perturbations",
               "projections", "schedules", "second_order", "sharding", "transforms", "tree",
               "tree_utils")


def _all_modules() -> list[str]:
  return sorted(m.name for m in pkgutil.walk_packages(shardopt.__path__, "shardopt."))


def test_every_folder_of_the_package_is_a_regular_package():
  folders = {path.parent for path in _PACKAGE.rglob("*.py")}
  implicit = [str(f.relative_to(_PACKAGE.parent)) for f in folders
              if not (f / "__init__.py").exists()]
  assert not implicit, f"add an __init__.py (setuptools skips these): {implicit}"


def test_no_star_imports_anywhere_in_the_package():
  starred = []
  for path in sorted(_PACKAGE.rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
        starred.append(f"{path.relative_to(_PACKAGE.parent)}:{node.lineno}")
  assert not starred, f"star imports: {starred}"


@pytest.mark.parametrize("name", _all_modules())
def test_every_module_path_resolves_to_that_module(name):
  module = importlib.import_module(name)
  node = shardopt
  for part in name.split(".")[1:]:
    node = getattr(node, part)
  assert node is module, f"{name} is shadowed by {node!r}"


def test_every_public_name_of_0_1_is_still_there():
  missing = [n for n in _NAMES_0_1 if not hasattr(shardopt, n)]
  assert not missing, f"public names lost: {missing}"


def test_all_lists_exactly_the_public_attributes():
  public = {n for n in dir(shardopt) if not n.startswith("_")}
  assert set(shardopt.__all__) == public
  modules = {n for n in public if isinstance(getattr(shardopt, n), types.ModuleType)}
  assert modules == set(_NAMESPACES), modules


@pytest.mark.parametrize("namespace", _NAMESPACES)
def test_namespaces_export_no_private_helpers(namespace):
  module = getattr(shardopt, namespace)
  assert all(not n.startswith("_") for n in module.__all__)
  assert set(module.__all__) == {n for n in dir(module) if not n.startswith("_")
                                 and not inspect.ismodule(getattr(module, n))}
  foreign = [n for n in dir(module) if not n.startswith("_") and inspect.ismodule(
      getattr(module, n)) and not getattr(module, n).__name__.startswith("shardopt.")]
  assert not foreign, foreign  # e.g. an ``import functools`` left public


@pytest.mark.parametrize("package", ["checkpoints", "partitioning"])
def test_the_other_packages_export_no_foreign_module(package):
  """Every public attribute of ``checkpoints`` and ``partitioning`` is their own: a name or a
  module of the package, never a module it imports (``checkpoints.importlib`` was one)."""
  module = importlib.import_module(package)
  foreign = [n for n in dir(module) if not n.startswith("_") and inspect.ismodule(
      getattr(module, n)) and not getattr(module, n).__name__.startswith(package + ".")]
  assert not foreign, foreign


@pytest.mark.parametrize("name", ["dpsgd", "differentially_private_aggregate",
                                  "DifferentiallyPrivateAggregateState"])
def test_top_level_privacy_names_warn_as_optaxs_do(name):
  # optax 0.2.8 serves these at its top level after a DeprecationWarning
  # naming optax.contrib; shardopt serves contrib's after the same warning.
  with pytest.warns(DeprecationWarning, match=f"optax.contrib.{name}"):
    getattr(optax, name)
  with pytest.warns(DeprecationWarning, match=f"use shardopt.contrib.{name}"):
    served = getattr(shardopt, name)
  assert served is getattr(shardopt.contrib, name)
  assert name in shardopt.__all__ and name in dir(shardopt)
  with pytest.raises(AttributeError, match="no attribute 'dpsgd_typo'"):
    getattr(shardopt, "dpsgd_typo")
