"""Layers' layouts on Explicit mesh axes, where each array's layout is part of
its type and an operation whose result's layout is ambiguous must be told
it (``out_sharding``) or fed operands that agree. On Auto axes (and without a
mesh) every function here leaves the computation as it is: XLA's partitioner
lays it out.
"""

import jax

__all__ = ["dot_general", "explicit_spec", "gathered_for", "laid_out_as", "typed_as"]


def laid_out_as(x, spec: tuple) -> jax.sharding.NamedSharding:
  """A sharding on ``x``'s mesh (as its type has it, with or without
  ``jax.set_mesh``) with ``spec``."""
  return jax.typeof(x).sharding.update(spec=jax.sharding.PartitionSpec(*spec))


def explicit_spec(x) -> tuple | None:
  """``x``'s spec, one entry per dimension, where its type is laid out on
  Explicit mesh axes; None on Auto axes and without a mesh."""
  sharding = jax.typeof(x).sharding
  if not sharding.mesh.explicit_axes:
    return None
  return tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))


def dot_general(lhs, rhs, dimension_numbers, *args, **kwargs):
  """``jax.lax.dot_general`` for the layers' (activations, kernel) products,
  typed on Explicit mesh axes too: a sum over split dimensions (tensor
  parallelism's second matmul) is laid out as its free dimensions are. On
  Auto axes XLA's partitioner decides."""
  lhs_spec, rhs_spec = explicit_spec(lhs), explicit_spec(rhs)
  (lhs_sum, rhs_sum), (lhs_batch, rhs_batch) = dimension_numbers
  out = None
  if lhs_spec is not None and any(lhs_spec[d] is not None for d in lhs_sum):
    free = lambda spec, skip: [e for d, e in enumerate(spec) if d not in skip]
    out = laid_out_as(lhs, (*[lhs_spec[d] for d in lhs_batch],
                             *free(lhs_spec, (*lhs_sum, *lhs_batch)),
                             *free(rhs_spec, (*rhs_sum, *rhs_batch))))
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, *args, out_sharding=out, **kwargs)


def gathered_for(params, tokens):
  """On Explicit mesh axes, ``params`` with the mesh axes that split the
  batch of ``tokens`` taken out of their layouts (FSDP's gather before
  use: a param split over the batch's axis cannot meet the activations
  elementwise); on Auto axes ``params`` themselves."""
  batch_axes = {a for e in (explicit_spec(tokens) or ()) if e is not None
                for a in (e if isinstance(e, tuple) else (e,))}

  def gather(p):
    spec = explicit_spec(p)
    if spec is None or not batch_axes:
      return p
    kept = tuple(_without(e, batch_axes) for e in spec)
    return p if kept == spec else jax.sharding.reshard(p, laid_out_as(p, kept))

  return jax.tree.map(gather, params)


def _without(entry, axes):
  """A spec entry (None, an axis or a tuple of them) without ``axes``."""
  names = tuple(a for a in (entry if isinstance(entry, tuple) else (entry,))
                if a is not None and a not in axes)
  return None if not names else names[0] if len(names) == 1 else names


def typed_as(x, like):
  """``x`` in ``like``'s layout on Explicit axes (a loop's carry must keep its
  type); ``x`` itself on Auto axes."""
  if explicit_spec(like) is None:
    return x
  return jax.sharding.reshard(x, jax.typeof(like).sharding)
