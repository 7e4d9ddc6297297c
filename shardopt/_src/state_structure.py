"""Reading an optimizer state back in the structure its ``init`` gave it.

flax's ``nnx.Optimizer`` keeps the optimizer state in its object graph, and
after each update writes the new state back into it: every container that
sits inside the params' mapping (an ``nnx.State``) comes back as an
``nnx.State`` keyed like the container's children (flax 0.12.8: SM3's list
of covers per param, Shampoo's tuple of factors, a ``QuantizedArray``'s
codes and scales), and a registered dataclass loses its static fields.
The leaves and their paths survive; only the containers change.
``conform`` puts such a state's leaves back into the structure ``init``
gives, so an update that reads its state by structure (``covers[1]``,
``zip(*factors)``, a ``QuantizedArray``'s fields) works on both.
"""

import functools

import jax

__all__ = ["conform", "conforming", "leaves_by_path", "path_names"]


def path_names(path) -> tuple:
  """A key path as plain names: a list index, a dict key and an attribute
  name of the same value are the same step."""
  return tuple(
      getattr(entry, "idx", getattr(entry, "key", getattr(entry, "name", entry)))
      for entry in path)


def leaves_by_path(tree, is_leaf=None) -> dict:
  """``tree``'s leaves keyed by ``path_names`` of their paths."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {path_names(path): leaf for path, leaf in flat}


def conform(state, like):
  """``state``'s leaves in the structure of ``like`` (e.g.
  ``jax.eval_shape(init, updates)``); ``state`` itself when its structure
  already is that.

  Raises:
    ValueError: a leaf of ``like`` has no leaf at its path in ``state``, or
      ``state`` has leaves ``like`` lacks: a state of another optimizer.
  """
  treedef = jax.tree.structure(like)
  if jax.tree.structure(state) == treedef:
    return state
  want = [path_names(path) for path, _ in
          jax.tree_util.tree_flatten_with_path(like)[0]]
  got = leaves_by_path(state)
  missing = [path for path in want if path not in got]
  if missing or len(got) != len(want):
    raise ValueError(
        f"the optimizer state has {len(got)} leaves and {len(want)} where"
        f" this transformation's init puts them; first missing path:"
        f" {missing[:1]}. Pass the state this transformation's init built.")
  return jax.tree.unflatten(treedef, [got[path] for path in want])


def conforming(init_fn):
  """Decorates an ``update_fn`` so that it reads its state in the structure
  ``init_fn`` gives (``conform``; for a state that holds containers inside
  the params' tree)."""
  def decorate(update_fn):
    @functools.wraps(update_fn)
    def update(updates, state, *args, **kwargs):
      like = jax.eval_shape(init_fn, updates)
      return update_fn(updates, conform(state, like), *args, **kwargs)
    return update
  return decorate
