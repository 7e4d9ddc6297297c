"""Composing transformations: in sequence (chain) or by partition of the params.

Any object with ``init`` and ``update`` can be composed, optax's included; extra
keyword arguments of ``update`` reach the parts that accept them.
"""

import collections
from typing import Any
from typing import Callable
from typing import Hashable
from typing import Mapping
from typing import NamedTuple

import jax
from jax.tree_util import keystr
from jax.tree_util import tree_flatten_with_path

from shardopt._src import base
from shardopt._src.wrappers import masking

__all__ = [
    "MultiTransformState",
    "PartitionState",
    "chain",
    "multi_transform",
    "named_chain",
    "partition",
    "selective_transform",
]


def chain(
    *args: base.GradientTransformation,
) -> base.GradientTransformationExtraArgs:
  """Applies the transformations one after the other; the state is a tuple.

  ``update`` passes each transformation's output updates to the next, with
  the same params and extra arguments (transformations without extra-args
  support ignore them).

  Args:
    *args: the transformations, in order.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is the tuple of the
    parts' states; ``update`` raises ValueError for a state with another
    number of parts.

  References:
    optax's ``chain``.
  """
  parts = [base.with_extra_args_support(tx) for tx in args]

  def init_fn(params):
    return tuple(tx.init(params) for tx in parts)

  def update_fn(updates, state, params=None, **extra_args):
    if len(state) != len(parts):
      raise ValueError(
          f"chain of {len(parts)} transformations got a state of"
          f" {len(state)} parts: build the state with this chain's init")
    new_state = []
    for tx, part_state in zip(parts, state):
      updates, part_state = tx.update(updates, part_state, params, **extra_args)
      new_state.append(part_state)
    return updates, tuple(new_state)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


def named_chain(
    *args: tuple[str, base.GradientTransformation],
) -> base.GradientTransformationExtraArgs:
  """Like ``chain``, with the state an ordered dict keyed by the given names.

  Args:
    *args: ``(name, transformation)`` pairs, in order.

  Returns:
    A ``GradientTransformationExtraArgs`` whose state maps each name to its
    transformation's state.

  References:
    optax's ``named_chain``.
  """
  names = [name for name, _ in args]
  if len(set(names)) != len(names):
    raise ValueError(f"named_chain needs unique names, got {names}")
  parts = [(name, base.with_extra_args_support(tx)) for name, tx in args]

  def init_fn(params):
    return collections.OrderedDict(
        (name, tx.init(params)) for name, tx in parts)

  def update_fn(updates, state, params=None, **extra_args):
    new_state = collections.OrderedDict()
    for name, tx in parts:
      updates, new_state[name] = tx.update(
          updates, state[name], params, **extra_args)
    return updates, new_state

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


class PartitionState(NamedTuple):
  """One masked inner state per label."""

  inner_states: Mapping[Hashable, base.OptState]


MultiTransformState = PartitionState


def _check_labels(labels: Any, known: Mapping) -> None:
  unknown = [
      (keystr(path), label)
      for path, label in tree_flatten_with_path(labels)[0]
      if label not in known
  ]
  if unknown:
    shown = ", ".join(
        f"{path or '<root>'}: {label!r}" for path, label in unknown[:5])
    raise ValueError(
        f"some params have labels with no transformation ({shown}); the"
        f" transformations are keyed {sorted(map(repr, known))}: add one for"
        " each label or relabel those params")


def partition(
    transforms: Mapping[Hashable, base.GradientTransformation],
    param_labels: Any | Callable[[base.Params], Any],
    *,
    mask_compatible_extra_args: bool = False,
) -> base.GradientTransformationExtraArgs:
  """Applies ``transforms[label]`` to the params labelled ``label``.

  Each transformation runs ``masked`` to its params, so its state holds only
  their leaves (with their shardings). Also exported as ``multi_transform``.

  Args:
    transforms: a mapping from label to transformation.
    param_labels: a tree of labels with the structure of the params (or a
      prefix of it), or a function of the params returning one; a label
      missing from ``transforms`` raises ValueError naming its path.
    mask_compatible_extra_args: whether extra arguments with the updates'
      tree structure are masked too, for each transformation (default
      False; keyword only).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``PartitionState`` (the inner states by label).

  References:
    optax's ``partition`` (``multi_transform``).
  """
  transforms = {
      label: base.with_extra_args_support(tx)
      for label, tx in transforms.items()
  }

  def labels_of(tree):
    return param_labels(tree) if callable(param_labels) else param_labels

  def masked_for(labels, label):
    mask = jax.tree.map(lambda x: x == label, labels)
    return masking.masked(
        transforms[label], mask,
        mask_compatible_extra_args=mask_compatible_extra_args)

  def init_fn(params):
    labels = labels_of(params)
    _check_labels(labels, transforms)
    return PartitionState({
        label: masked_for(labels, label).init(params) for label in transforms
    })

  def update_fn(updates, state, params=None, **extra_args):
    labels = labels_of(updates)
    inner_states = {}
    for label in transforms:
      updates, inner_states[label] = masked_for(labels, label).update(
          updates, state.inner_states[label], params, **extra_args)
    return updates, PartitionState(inner_states)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)


multi_transform = partition


def selective_transform(
    optimizer: base.GradientTransformation,
    *,
    freeze_mask: Any,
) -> base.GradientTransformationExtraArgs:
  """Runs ``optimizer`` on the params not frozen and zeros the updates of the others.

  A ``partition`` with labels ``"train"`` (``optimizer``) and ``"freeze"``
  (``set_to_zero``).

  Args:
    optimizer: the transformation of the trained params.
    freeze_mask: a tree of bools with the params' structure, True where the
      param is frozen (keyword only).

  Returns:
    A ``GradientTransformationExtraArgs`` whose state is a
    ``PartitionState``.

  References:
    optax's ``selective_transform``.
  """
  labels = jax.tree.map(lambda frozen: "freeze" if frozen else "train",
                        freeze_mask)
  return partition(
      {"train": optimizer, "freeze": base.set_to_zero()},
      lambda params: labels)
