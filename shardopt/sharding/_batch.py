"""How the training step lays out each leaf of a batch.

A rule maps every batch leaf to a ``PartitionSpec``. The default splits a
leaf's leading dimension over the data axes and replicates scalars; a user
states another rule as a ``PartitionSpec`` tree (a prefix of the batch: one
spec may cover a whole subtree) or as a function ``rule(path, shape) ->
PartitionSpec``. Every split dimension must divide evenly (with
microbatches, the leading dimension by the microbatch count times the data
axes' size): a leaf that does not is an error naming the leaf, its shape and
the axis sizes.
"""

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardopt.sharding._specs import entry_size

__all__ = ["BatchLayout", "batch_layout"]


def _data_axes(mesh, data_axes, zero_axis) -> tuple[str, ...]:
  """The mesh axes the batch's leading dimension is split over."""
  if data_axes is None:
    data_axes = zero_axis or ("data" if "data" in mesh.shape else None)
  if data_axes is None:
    raise ValueError(
        f"train_step: the mesh {dict(mesh.shape)} has no 'data' axis and no "
        "ZeRO axis was given; pass data_axes=<the mesh axes the batch is "
        "split over> or batch_spec=<a rule>.")
  axes = (data_axes,) if isinstance(data_axes, str) else tuple(data_axes)
  unknown = [a for a in axes if a not in mesh.shape]
  if unknown:
    raise ValueError(f"train_step: data_axes {unknown} are not axes of the "
                     f"mesh {dict(mesh.shape)}.")
  return axes


class BatchLayout:
  """The shardings of a batch under one rule, checked leaf by leaf."""

  def __init__(self, mesh, rule: Callable[[str, tuple], P],
               microbatches: int):
    self.mesh, self.rule, self.microbatches = mesh, rule, microbatches
    self._cache: dict[Any, Any] = {}

  def shardings(self, batch):
    """A ``NamedSharding`` per batch leaf (a tree like ``batch``)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(batch)
    key = (treedef, tuple(tuple(jax.numpy.shape(x)) for _, x in leaves))
    if key not in self._cache:
      self._cache[key] = jax.tree.unflatten(treedef, [
          self._sharding(jax.tree_util.keystr(path), tuple(jax.numpy.shape(x)))
          for path, x in leaves])
    return self._cache[key]

  def _sharding(self, path: str, shape: tuple) -> NamedSharding:
    spec = self.rule(path, shape)
    if not isinstance(spec, P):
      raise TypeError(f"train_step: batch_spec gave {spec!r} for batch{path}; "
                      "expected a PartitionSpec.")
    names = [n for e in spec for n in (e if isinstance(e, tuple) else (e,))]
    unknown = sorted({n for n in names if n is not None} - set(self.mesh.shape))
    if unknown:
      raise ValueError(
          f"train_step: the batch spec {spec} of batch{path} names {unknown},"
          f" not axes of the mesh {dict(self.mesh.shape)}.")
    if len(spec) > len(shape):
      raise ValueError(f"train_step: batch{path} has shape {shape}, but its "
                       f"batch spec {spec} names {len(spec)} dimensions.")
    for dim, entry in enumerate(spec):
      split = entry_size(self.mesh, entry)
      if dim == 0 and shape and self.microbatches > 1:
        split *= self.microbatches
      if shape[dim] % split:
        raise ValueError(
            f"train_step: batch{path} has shape {shape}; dimension {dim} "
            f"({shape[dim]}) must be a multiple of {split} "
            f"({entry!r}: {entry_size(self.mesh, entry)} devices"
            + (f" x {self.microbatches} microbatches" if dim == 0 and
               self.microbatches > 1 else "") + "). Resize the batch or "
            "state another batch_spec.")
    if self.microbatches > 1 and shape and (not spec or spec[0] is None) \
        and shape[0] % self.microbatches:
      raise ValueError(
          f"train_step: batch{path} has shape {shape}; its leading dimension "
          f"must be a multiple of microbatches={self.microbatches}.")
    return NamedSharding(self.mesh, spec)


def _spec_tree_rule(specs) -> Callable:
  """A rule reading a ``PartitionSpec`` tree that is a prefix of the batch."""
  def rule_for(batch):
    return jax.tree.map(
        lambda spec, sub: jax.tree.map(lambda _: spec, sub), specs, batch,
        is_leaf=lambda x: isinstance(x, P))
  return rule_for


def batch_layout(mesh, batch_spec, data_axes, zero_axis,
                 microbatches: int) -> BatchLayout:
  """The ``BatchLayout`` of a train step (see the module docstring)."""
  if batch_spec is None:
    axes = _data_axes(mesh, data_axes, zero_axis)
    entry = axes[0] if len(axes) == 1 else axes
    rule = lambda path, shape: P(entry) if shape else P()
  elif callable(batch_spec):
    rule = batch_spec
  else:
    return _TreeBatchLayout(mesh, batch_spec, microbatches)
  return BatchLayout(mesh, rule, microbatches)


class _TreeBatchLayout(BatchLayout):
  """A ``BatchLayout`` whose rule is a ``PartitionSpec`` tree."""

  def __init__(self, mesh, specs, microbatches: int):
    super().__init__(mesh, None, microbatches)
    self.specs = specs

  def shardings(self, batch):
    try:
      per_leaf = _spec_tree_rule(self.specs)(batch)
    except ValueError as err:
      raise ValueError(f"train_step: batch_spec is not a prefix of the "
                       f"batch's tree: {err}") from None
    specs = {jax.tree_util.keystr(path): spec for path, spec in
             jax.tree_util.tree_flatten_with_path(
                 per_leaf, is_leaf=lambda x: isinstance(x, P))[0]}
    self.rule = lambda path, shape: specs[path]
    return super().shardings(batch)
