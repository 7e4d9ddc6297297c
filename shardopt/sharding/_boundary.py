"""Checks at the library boundary of the sharded step: clear errors, naming
the param, for inputs JAX would accept silently or report in its own terms.

``check_grads`` compares grads with params (tree structure, shapes, dtypes).
The step calls it while tracing, so it runs once per compiled signature and
costs nothing per step; a mismatch that ``jit`` rejects before tracing (a
different tree, an indivisible shape) is diagnosed by it on that error path.

``check_inputs`` names where the params or the state given to ``init``,
``update`` or a training step differ from the tree the optimizer was built
for (a state of another optimizer, a param added or renamed); ``jit``
rejects those before tracing, so it runs on that error path only:
``explained_rejection`` is the frame each jitted entry point (``init``,
``update``, a training step) is called in.

The check of donated arrays that runs on every call, ``check_live``, is in
``_liveness``.
"""

import contextlib

import jax
from jax.tree_util import keystr
from jax.tree_util import tree_flatten_with_path
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from shardopt.sharding._liveness import is_concrete_array
from shardopt.sharding._specs import entry_size
from shardopt.sharding._specs import full_spec

__all__ = ["check_grads", "check_inputs", "check_param_shardings", "check_placed",
           "explained_rejection", "first_structure_difference"]


def first_structure_difference(tree, params, name: str, per_param: str) -> str:
  """Names the first path that ``params`` has and ``tree`` (called ``name``,
  holding a ``per_param`` per param) lacks, or that ``tree`` has and the
  params lack; or the containers, where the two trees' outermost differ."""
  if type(tree) is not type(params) and not any(
      jax.tree_util.treedef_is_leaf(jax.tree.structure(t)) for t in (tree, params)):
    return (f"{name} is of type {type(tree).__name__} where the params are of type "
            f"{type(params).__name__}")
  paths = [keystr(p) for p, _ in tree_flatten_with_path(tree)[0]]
  param_paths = [keystr(p) for p, _ in tree_flatten_with_path(params)[0]]
  for path in param_paths:
    if path not in paths:
      return f"params{path} has no {per_param} ({name} lack {path})"
  for path in paths:
    if path not in param_paths:
      return f"{name}{path} matches no param"
  return ("the paths agree but the container types differ (e.g. a tuple "
          "where the params have a list)")


def check_grads(grads, params) -> None:
  """Raises ValueError/TypeError naming the first param whose gradient does
  not match it in tree position, shape or dtype."""
  if jax.tree.structure(grads) != jax.tree.structure(params):
    raise ValueError(
        "grads do not have the tree structure of params: "
        f"{first_structure_difference(grads, params, 'grads', 'gradient')}. "
        "Pass one gradient per param, in a tree of the params' structure.")
  flat = tree_flatten_with_path(params)[0]
  for (path, param), grad in zip(flat, jax.tree.leaves(grads)):
    where = keystr(path)
    if np.shape(grad) != np.shape(param):
      raise ValueError(
          f"grads{where} has shape {np.shape(grad)} but params{where} has "
          f"shape {np.shape(param)}: each gradient must have its param's "
          "shape.")
    if grad.dtype != param.dtype:
      raise TypeError(
          f"grads{where} is {grad.dtype} but params{where} is {param.dtype}: "
          f"gradients must have their param's dtype ({_why_same_dtype(grad, param)})."
          f" Cast it, e.g. g.astype({param.dtype}).")


def _why_same_dtype(grad, param) -> str:
  """Why a gradient of ``grad``'s dtype is refused for ``param``."""
  if not jnp.issubdtype(grad.dtype, jnp.inexact):
    return "an integer or boolean gradient is not a gradient"
  if not jnp.issubdtype(param.dtype, jnp.inexact):
    return "the step takes no gradient of another dtype for a param that is not floating"
  if (jnp.issubdtype(grad.dtype, jnp.complexfloating) !=
      jnp.issubdtype(param.dtype, jnp.complexfloating)):
    return "a complex gradient of a real param, or a real one of a complex param, is not its gradient"
  grad_bits, param_bits = jnp.finfo(grad.dtype).bits, jnp.finfo(param.dtype).bits
  if grad_bits < param_bits:
    return "a lower-precision one would silently lose precision in the update"
  if grad_bits == param_bits:
    return f"{grad.dtype} and {param.dtype} differ in range and precision"
  return ("the step keeps the params' dtypes in the state and the updates; "
          "low_precision_params computes bfloat16 params' updates in float32 itself")


def _node(tree):
  """``(type, [(key, child), ...])`` of the top of ``tree``; type None for a leaf."""
  if jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)):
    return None, []
  children = tree_flatten_with_path(tree, is_leaf=lambda x: x is not tree)[0]
  return type(tree), [(path[0], child) for path, child in children]


def _describe(kind, children) -> str:
  if kind is None:
    return "an array"
  keys = ", ".join(keystr((key,)) for key, _ in children)
  return f"a {kind.__name__} with entries {keys}" if children else f"an empty {kind.__name__}"


def _first_difference(tree, like, where: str) -> str:
  """Where ``tree``'s structure first departs from ``like``'s (trees whose
  structures differ), and how."""
  kind, children = _node(tree)
  like_kind, like_children = _node(like)
  if kind is not like_kind or [k for k, _ in children] != [k for k, _ in like_children]:
    return (f"{where} is {_describe(kind, children)} where the optimizer has "
            f"{_describe(like_kind, like_children)}")
  for (key, child), (_, like_child) in zip(children, like_children):
    if jax.tree.structure(child) != jax.tree.structure(like_child):
      return _first_difference(child, like_child, where + keystr((key,)))
  return f"{where} is a {kind.__name__} whose node data differs from the optimizer's"


def _check_structure(what: str, tree, like, fix: str) -> None:
  if jax.tree.structure(tree) != jax.tree.structure(like):
    raise ValueError(f"{what} does not have the structure this optimizer was built for: "
                     f"{_first_difference(tree, like, what)}. {fix}")


_STATE_FIX = ("Pass the state this optimizer's init returned (or one restored from its"
              " checkpoint, which lays it out for this optimizer)")


def check_inputs(param_shardings, params, state_shardings=None, state=None,
                 params_like=None) -> None:
  """Raises ValueError naming the first node where ``params`` (or
  ``state``) departs from the tree of shardings the optimizer was built
  with, a param of another shape than ``params_like``'s, or the first state
  leaf whose shape its planned sharding cannot split (a state built for
  another layout: ``tx.init`` of unsharded params fits quantized blocks to
  whole moments), and what to pass instead."""
  _check_structure("params", params, param_shardings,
                   "Pass params of the tree the optimizer was built for, or build one for these"
                   " (make_sharded_optimizer(tx, params, param_shardings)).")
  if params_like is not None:
    _check_shapes(params, params_like)
  if state_shardings is not None:
    _check_structure("state", state, state_shardings,
                     _STATE_FIX + "; another optimizer's state needs that optimizer.")
    _check_divisible(state, state_shardings)


def check_placed(param_shardings, params, state_shardings=None, state=None,
                 grads=None) -> None:
  """Raises ValueError naming the first array of ``params``, ``grads`` or
  ``state`` (trees of the optimizer's structure) placed in another sharding
  or memory than the optimizer takes it (``jit`` refuses it unnamed)."""
  for what, tree, shardings, attribute in (
      ("params", params, param_shardings, "param_shardings"),
      ("grads", grads, param_shardings, "param_shardings"),
      ("state", state, state_shardings, "state_shardings")):
    if tree is not None and shardings is not None:
      _check_placed(what, tree, shardings, attribute)


def _check_shapes(params, params_like) -> None:
  for (path, leaf), like in zip(tree_flatten_with_path(params)[0],
                                jax.tree.leaves(params_like)):
    if np.shape(leaf) != np.shape(like):
      raise ValueError(
          f"params{keystr(path)} has shape {np.shape(leaf)}; this optimizer was built for "
          f"{np.shape(like)}. Pass params of the shapes it was built for, or build one for "
          "these (make_sharded_optimizer(tx, params, param_shardings)).")


def _placement(sharding) -> str:
  layout = getattr(sharding, "spec", sharding)  # a NamedSharding's spec, else itself
  return f"{layout} in {sharding.memory_kind or 'device'} memory"


def _placements(placed, sharding) -> tuple[str, str]:
  """How ``placed`` and ``sharding`` lay an array out, in words; with their
  meshes where the specs and memories read the same (another mesh)."""
  words = _placement(placed), _placement(sharding)
  if words[0] != words[1]:
    return words
  return tuple(f"{w} on {_mesh_words(s)}" for w, s in zip(words, (placed, sharding)))


def _mesh_words(sharding) -> str:
  mesh = getattr(sharding, "mesh", None)
  if mesh is None or not hasattr(mesh, "device_ids"):
    return str(sharding)
  axes = ", ".join(f"{name}={size}" for name, size in mesh.shape.items())
  return f"the mesh ({axes}) of devices {np.asarray(mesh.device_ids).ravel().tolist()}"


def _check_placed(what, tree, shardings, attribute) -> None:
  for (path, leaf), sharding in zip(tree_flatten_with_path(tree)[0],
                                    jax.tree.leaves(shardings)):
    committed = is_concrete_array(leaf) and leaf.committed  # jit moves the others
    placed = leaf.sharding if committed else None
    if placed is not None and not (placed.is_equivalent_to(sharding, leaf.ndim)
                                   and placed.memory_kind == sharding.memory_kind):
      is_placed, takes = _placements(placed, sharding)
      raise ValueError(
          f"{what}{keystr(path)} is placed as {is_placed}, but this optimizer "
          f"takes it as {takes}: place it so first "
          f"(jax.device_put({what}, opt.{attribute})).")


def _indivisible(tree, shardings):
  """``(path, shape, dim, parts, spec)`` of the first leaf of ``tree`` whose
  dimension its sharding splits into parts that do not divide it; None."""
  for (path, leaf), sharding in zip(tree_flatten_with_path(tree)[0],
                                    jax.tree.leaves(shardings)):
    shape = np.shape(leaf)
    for dim, (length, entry) in enumerate(zip(shape, full_spec(sharding.spec, len(shape)))):
      parts = entry_size(sharding.mesh, entry)
      if length % parts:
        return keystr(path), shape, dim, parts, sharding.spec
  return None


def _check_divisible(state, state_shardings) -> None:
  found = _indivisible(state, state_shardings)
  if found:
    path, shape, dim, parts, spec = found
    raise ValueError(
        f"state{path} has shape {shape}, whose dimension {dim} ({shape[dim]}) this "
        f"optimizer's layout splits into {parts} ({spec}): it was built for "
        f"another layout (e.g. by tx.init of unsharded params). {_STATE_FIX}.")


def _too_long(tree, shardings):
  """``(path, shape, spec)`` of the first leaf of ``tree`` whose sharding's
  spec has more entries than the leaf has dimensions; None."""
  for (path, leaf), sharding in zip(tree_flatten_with_path(tree)[0],
                                    jax.tree.leaves(shardings)):
    if len(sharding.spec) > len(np.shape(leaf)):
      return keystr(path), np.shape(leaf), sharding.spec
  return None


def _rank_fix(shape, spec) -> str:
  """What to give a param of ``shape`` instead of the too long ``spec``."""
  kept, extra = tuple(spec)[:len(shape)], tuple(spec)[len(shape):]
  if all(entry is None for entry in extra):
    return f"drop the extra entries ({P(*kept)} lays it out the same)"
  return (f"its entries past dimension {len(shape) - 1} ({', '.join(map(repr, extra))}) "
          "split no dimension of it: give it one entry per dimension at most, e.g. "
          f"{P(*kept)}")


def check_param_shardings(params, param_shardings) -> None:
  """Raises ValueError naming the first param whose sharding has more spec
  entries than the param has dimensions (jax cannot lay it out, so its state
  could not be derived), or splits a dimension into parts that do not
  divide it (the state would be derived for a layout the param cannot
  have)."""
  found = _too_long(params, param_shardings)
  if found:
    path, shape, spec = found
    raise ValueError(
        f"params{path} has shape {shape} (rank {len(shape)}), but its sharding {spec} has "
        f"{len(spec)} entries (a spec has at most one per dimension): {_rank_fix(shape, spec)} "
        "(partitioning.validate_specs checks every param's).")
  found = _indivisible(params, param_shardings)
  if found:
    path, shape, dim, parts, spec = found
    raise ValueError(
        f"params{path} has shape {shape}, whose dimension {dim} ({shape[dim]}) its sharding "
        f"{spec} splits into {parts} parts: give it a spec whose mesh axes divide its "
        "dimensions (partitioning.validate_specs checks every param's).")


@contextlib.contextmanager
def explained_rejection(param_shardings, params, state_shardings=None,
                        state=None, grads=None, params_like=None):
  """Runs its body (a call of a jitted entry point); inputs ``jit`` rejects
  (``ValueError`` / ``TypeError``, before or while tracing) are explained by
  ``check_inputs`` (and ``check_grads`` when ``grads`` are given), which
  raise naming where they differ; otherwise ``jit``'s error propagates."""
  try:
    yield
  except (ValueError, TypeError):  # rejected: say why where the inputs do
    check_inputs(param_shardings, params, state_shardings, state, params_like)
    if grads is not None:
      check_grads(grads, params)
    check_placed(param_shardings, params, state_shardings, state, grads)
    raise
