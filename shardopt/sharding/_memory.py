"""Optimizer state kept in another memory than the device's (host offloading).

``make_sharded_optimizer(..., state_memory_kind="pinned_host")`` lays every
state leaf out in that memory of its devices (``NamedSharding`` with that
``memory_kind``: same spec, same devices). The update and the training
step bring the state into device memory where they start and send the new
state back where they end, inside the one jitted program
(``jax.device_put`` to the sharding with the other memory kind, which JAX
lowers to transfers XLA schedules with the computation). State in device
memory (the default) is left alone: the programs are the same as without.
"""

import jax

__all__ = ["DEVICE", "in_memory", "is_offloaded", "to_device", "to_home"]

DEVICE = "device"


def _memory_kinds(mesh) -> tuple[str, ...]:
  """The memory kinds of the mesh's first device (all share them)."""
  devices = getattr(mesh, "devices", None)
  if devices is None:  # an AbstractMesh: nothing to ask
    return ()
  return tuple(m.kind for m in devices.flat[0].addressable_memories())


def in_memory(shardings, kind: str | None, param_shardings):
  """``shardings`` with memory kind ``kind`` (None: as they are); raises
  ValueError naming the kinds the devices have when ``kind`` is not one of
  the memories of the params' devices (checked from ``param_shardings``, so
  a state with no leaves is checked too)."""
  if kind is None:
    return shardings
  leaves = jax.tree.leaves(param_shardings)
  kinds = _memory_kinds(leaves[0].mesh) if leaves else ()
  if kinds and kind not in kinds:
    raise ValueError(f"state_memory_kind={kind!r}: the mesh's devices have the "
                     f"memories {kinds}; pass one of them (e.g. 'pinned_host') "
                     "or None for device memory.")
  return jax.tree.map(lambda s: s.with_memory_kind(kind), shardings)


def is_offloaded(shardings) -> bool:
  """Whether any sharding puts its leaf outside device memory."""
  return any(s.memory_kind not in (None, DEVICE) for s in jax.tree.leaves(shardings))


def to_device(tree, shardings):
  """Inside ``jit``: ``tree`` (laid out in ``shardings``) in device memory."""
  if not is_offloaded(shardings):
    return tree
  return jax.device_put(tree, jax.tree.map(lambda s: s.with_memory_kind(DEVICE),
                                           shardings))


def to_home(tree, shardings):
  """Inside ``jit``: ``tree`` back in the memory ``shardings`` name."""
  if not is_offloaded(shardings):
    return tree
  return jax.device_put(tree, shardings)
