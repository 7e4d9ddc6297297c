"""Renders docs/catalogue.md from the entries of tests/catalogue.py.

Each row: the state a transformation keeps, how that state is sharded next to
one sharded param (derived by ``shardopt.sharding.plan_state_shardings``), and
the reference paragraph of its docstring. Run from the repository root:
``python tools/render_catalogue.py > docs/catalogue.md``.
"""

import inspect
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import shardopt  # noqa: E402
from tests import catalogue  # noqa: E402


_SAMPLE_SHAPE = (8, 16)
_SAMPLE_SPEC = P("data", "model")
_MESH_SHAPE = (("data", 2), ("model", 4))


def _is_state(x) -> bool:
  return isinstance(x, tuple) and hasattr(x, "_fields")


def _holds_states(x) -> bool:
  """Whether a state field holds inner states (not a tree of arrays)."""
  if _is_state(x):
    return True
  values = x.values() if isinstance(x, dict) else x
  return isinstance(x, (dict, tuple, list)) and any(
      _is_state(v) and v._fields for v in values)


def describe_state(state) -> str:
  """The state's NamedTuple types and field names; inner states nested."""
  if _is_state(state):
    if not state._fields:
      return ""
    fields = []
    for name in state._fields:
      value = getattr(state, name)
      inner = describe_state(value) if _holds_states(value) else ""
      fields.append(f"{name}={inner}" if inner else name)
    return f"{type(state).__name__}({', '.join(fields)})"
  if isinstance(state, dict):
    parts = [f"{k}: {describe_state(v) or '-'}" for k, v in state.items()]
    return "{" + ", ".join(parts) + "}"
  if isinstance(state, (tuple, list)):
    return " + ".join(d for d in map(describe_state, state) if d)
  return ""


def _leaf_name(state, path) -> str:
  """A state leaf's path by field names and labels; indices into a sequence
  of states (a chain's) are dropped, indices into a field's value kept."""
  parts, node = [], state
  for key in path:
    if isinstance(key, jax.tree_util.GetAttrKey):
      parts.append(f".{key.name}")
      node = getattr(node, key.name)
    elif isinstance(key, jax.tree_util.DictKey):
      parts.append(f"[{key.key!r}]")
      node = node[key.key]
    else:
      if not _holds_states(node):
        parts.append(f"[{key.idx}]")
      node = node[key.idx]
  return "".join(parts).lstrip(".") or "state"


def _spec_words(spec) -> str:
  if tuple(spec) == tuple(_SAMPLE_SPEC):
    return "as param"
  if all(entry is None for entry in spec):
    return "replicated"
  return str(tuple(spec))


def sample_mesh() -> jax.sharding.AbstractMesh:
  """The abstract (2, 4) ('data', 'model') mesh of the table."""
  names, sizes = zip(*[(n, s) for n, s in _MESH_SHAPE])
  return jax.sharding.AbstractMesh(sizes, names)


def describe_sharding(tx, state) -> str:
  """How ``tx``'s ``state`` (abstract) is laid out next to an (8, 16)
  P('data', 'model') param: leaves grouped by their derived spec."""
  param = jax.ShapeDtypeStruct(_SAMPLE_SHAPE, jnp.float32)
  plan = shardopt.sharding.plan_state_shardings(tx, param, NamedSharding(sample_mesh(),
                                                       _SAMPLE_SPEC))
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
  groups: dict[str, list[str]] = {}
  for path, leaf in zip(paths, plan.leaves):
    names = groups.setdefault(_spec_words(leaf.spec), [])
    if _leaf_name(state, path) not in names:
      names.append(_leaf_name(state, path))
  return "; ".join(f"{', '.join(names)}: {words}"
                   for words, names in groups.items()) or "-"


def reference(entry: catalogue.Entry, lib=None) -> str:
  """The paper/reference paragraph of the constructor's docstring, or ''."""
  doc = inspect.getdoc(catalogue.constructor(entry, lib)) or ""
  found = re.search(r"^\s*References?:?\s*(.*?)(?:\n\s*\n|\Z)", doc,
                    re.MULTILINE | re.DOTALL)
  return " ".join(found.group(1).split()) if found else ""


def _row(entry: catalogue.Entry) -> str:
  tx = catalogue.build(entry)
  state = jax.eval_shape(tx.init, jax.ShapeDtypeStruct(_SAMPLE_SHAPE,
                                                       jnp.float32))
  cells = [f"`{entry.label}`", describe_state(state) or "- (stateless)",
           describe_sharding(tx, state), "yes" if entry.oracle else "no",
           reference(entry) or "-"]
  return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


_HEADER = """\
# shardopt catalogue

Generated from the entries of `tests/catalogue.py` by
`python tools/render_catalogue.py > docs/catalogue.md`; a test fails when this
file differs from a fresh rendering. Every row is proven by
`tests/test_harness.py`: equal to optax's transformation of the same name
(column *optax*), state sharded like its param on a (2, 4) mesh, and the
sharded jitted step equal to the unsharded one.

*State* lists the NamedTuple types of `init`'s state and their fields.
*Sharding* gives the spec each state leaf derives, by tracing `init`, for one
(8, 16) float32 param laid out as `P('data', 'model')` on a (2, 4)
`('data', 'model')` mesh: "as param" means the param's own spec.

| name | state | sharding | optax | reference |
|---|---|---|---|---|
"""


def render() -> str:
  """The catalogue table as markdown."""
  return _HEADER + "\n".join(_row(e) for e in catalogue.ENTRIES) + "\n"


def main() -> None:
  sys.stdout.write(render())


if __name__ == "__main__":
  main()
