"""Per-block work, one block at a time, where the blocks live, on any mesh.

``blockwise(fn, k, *operands)`` applies ``fn`` to every block: the operands'
``k`` leading dimensions index blocks (Shampoo's and SOAP's grids), ``fn``
takes one block of each operand (the other dimensions) and returns arrays
for that block. Each device runs ``fn`` over the blocks it holds, one after
another (``jax.lax.map``), each block whole: grid dimensions keep their mesh
axes, dimensions inside a block are gathered first where a layout split
them. So

- a block's numbers come from the same compiled code on any number of
  devices (a product batched over however many blocks a device holds, or
  over a dimension split across devices, would add in another order; SOAP's
  eigenbases turn such rounding into visible drift): the optimizer's steps
  are equal on 1, 4 and 8 devices, bit for bit in tests/test_blocked_any_mesh.py;
- where the blocks tile the shards, the step adds no collective;
- ``eigh`` runs one block at a time: a batched ``eigh`` inside a program
  sharded over several simulated CPU devices can deadlock (LAPACK's batched
  loop waits on the thread pool that the other devices' threads hold).

On Explicit mesh axes the layout is in the operands' types and the map runs
under ``jax.shard_map``; on Auto axes (and unsharded) it is a
``custom_partitioning`` call, which the partitioner hands the operands'
shardings.
"""

from collections.abc import Callable
import functools
import itertools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["blockwise"]


def blockwise(fn: Callable, k: int, *operands: jax.Array):
  """``fn`` applied to every block, on the devices holding the blocks.

  Args:
    fn: a function of one block of each operand, returning an array or a
      tuple of arrays for that block; a hashable callable (a module-level
      function or a ``functools.partial`` of one).
    k: the number of grid dimensions, the same in every operand.
    *operands: arrays of rank ``>= k`` with equal grid dimensions.

  Returns:
    ``fn``'s results stacked over the grid (grid dimensions first), laid out
    on the grid as the first operand.
  """
  fn = functools.partial(_map, fn, k)
  sharding = getattr(jax.typeof(operands[0]), "sharding", None)
  mesh = None if sharding is None else sharding.mesh
  if mesh is not None and not mesh.empty and AxisType.Explicit in mesh.axis_types:
    spec = tuple(sharding.spec) + (None,) * (operands[0].ndim - len(sharding.spec))
    local = lambda x: P(*spec[:k], *([None] * (x.ndim - k)))
    out = jax.eval_shape(fn, *[jax.ShapeDtypeStruct(x.shape, x.dtype)
                               for x in operands])  # ranks only
    operands = [jax.sharding.reshard(x, NamedSharding(mesh, local(x))) for x in operands]
    return jax.shard_map(fn, mesh=mesh, in_specs=tuple(map(local, operands)),
                         out_specs=jax.tree.map(local, out))(*operands)
  return _partitioned(fn, k, *operands)


def _map(fn, k, *operands):
  """``fn`` over the blocks of ``operands`` (local ones), one at a time.

  The loop's trip count is hidden from XLA (an optimization barrier): a
  device holding one block would otherwise get the loop inlined and its body
  fused with its neighbours, compiled to other roundings than elsewhere."""
  grid = operands[0].shape[:k]
  flat = [x.reshape((-1,) + x.shape[k:]) for x in operands]
  block = lambda i: [jax.lax.dynamic_index_in_dim(x, i, keepdims=False) for x in flat]
  shapes = jax.eval_shape(fn, *block(0))
  init = jax.tree.map(  # like the operands: varying over manual mesh axes
      lambda s: jnp.zeros_like(flat[0], s.dtype, (flat[0].shape[0],) + s.shape),
      shapes)

  def body(i, out):
    return jax.tree.map(lambda o, y: jax.lax.dynamic_update_index_in_dim(o, y, i, 0),
                        out, fn(*block(i)))

  count = jax.lax.optimization_barrier(jnp.int32(flat[0].shape[0]))
  out = jax.lax.fori_loop(0, count, body, init)
  return jax.tree.map(lambda y: y.reshape(grid + y.shape[1:]), out)


def _call(fn, k, *operands):
  del k
  return fn(*operands)


_partitioned = custom_partitioning(_call, static_argnums=(0, 1))


def _rule(fn, k, mesh, operand_types, result_types):
  """Grid factors shared by all; each dimension inside a block its own factor,
  which must not be split."""
  del fn, mesh
  grid = [f"g{i}" for i in range(k)]
  inner = []

  def mapping(t):
    names = [f"b{len(inner) + j}" for j in range(len(t.shape) - k)]
    inner.extend(names)
    return " ".join(grid + names)

  operands = ", ".join(mapping(t) for t in operand_types)
  results = ", ".join(mapping(t) for t in result_types)
  return f"{operands} -> {results}", {"need_replication_factors": tuple(inner)}


def _partition(fn, k, mesh, arg_shapes, result_shape):
  """Every operand and result on the grid layout the partitioner proposed for
  the first operand, blocks whole. A proposal that names no mesh axes (part
  of an axis over a dimension) gives a replicated grid: correct, with a
  gather. A program with no mesh (an unsharded ``jit`` under
  ``jax.sharding.set_mesh``) passes its one replicated layout through."""
  first = arg_shapes[0]
  if mesh.empty:
    if not first.sharding.is_fully_replicated:
      raise ValueError(f"blockwise: operands laid out as {first.sharding} on no mesh.")
    return (mesh, fn, jax.tree.map(lambda _: first.sharding, result_shape),
            tuple(first.sharding for _ in arg_shapes))
  spec = _named_spec(first.sharding, first.shape, mesh) or (None,) * k
  whole = lambda s: NamedSharding(mesh, P(*spec[:k], *([None] * (len(s.shape) - k))))
  return (mesh, fn, jax.tree.map(whole, result_shape), tuple(map(whole, arg_shapes)))


def _named_spec(sharding, shape, mesh) -> tuple | None:
  """The spec on ``mesh``'s axes of a proposed layout, or None where no
  ``NamedSharding`` on them is equivalent to it."""
  shape = tuple(shape)
  shard = sharding.shard_shape(shape)
  options = [_entries(-(-d // max(s, 1)), mesh) for d, s in zip(shape, shard)]
  for spec in itertools.product(*options):
    used = [n for entry in spec if entry for n in entry]
    if len(used) == len(set(used)) and NamedSharding(mesh, P(*spec)).is_equivalent_to(
        sharding, len(shape)):
      return spec
  return None


def _entries(split: int, mesh) -> list:
  """Spec entries (None, or a tuple of distinct mesh axes) splitting ``split`` ways."""
  if split == 1:
    return [None]
  names = tuple(mesh.axis_names)
  return [axes for r in range(1, len(names) + 1)
          for axes in itertools.permutations(names, r)
          if math.prod(mesh.shape[n] for n in axes) == split]


_partitioned.def_partition(_partition, sharding_rule=_rule, decode_shardings=False)
