"""Evaluating a function over a batch in sequential microbatches (optax's
``microbatch``, ``micro_vmap`` and ``micro_grad``).

The batch axis of each batch argument is split column-major into
``(num_microbatches, microbatch_size)`` (``batch_axis``), so a batch axis
split over a mesh axis stays split within every microbatch. A
``lax.fori_loop`` evaluates the function on one microbatch at a time and an
``Accumulator`` (``microbatch_accumulators``) combines the results (sum,
mean, running mean or concatenation, per output subtree), so only one
microbatch's intermediates are live at once.
"""

import collections
from typing import Any
from typing import Callable
from typing import Sequence

import jax
import jax.numpy as jnp

from shardopt._src import typed_layouts
from shardopt._src.batch_axis import reshape_batch_axis
from shardopt._src.microbatch_accumulators import AccumulationType
from shardopt._src.microbatch_accumulators import resolve

__all__ = [
    "micro_grad",
    "micro_vmap",
    "microbatch",
]

# What ``micro_grad`` returns beside the gradients, per example.
IndividualOutputs = collections.namedtuple("Aux", ["values", "metrics", "aux"])


def microbatch(
    fun: Callable[..., Any],
    argnums: int | Sequence[int],
    microbatch_size: int | None,
    accumulator: Any = AccumulationType.SUM,
    *,
    argnames: str | Sequence[str] = (),
    in_axes: int | Sequence[int] = 0,
    num_real_microbatches: int | jax.Array | None = None,
) -> Callable[..., Any]:
  """``fun`` evaluated on sequential microbatches of its batch arguments,
  the results combined by ``accumulator``.

  Args:
    fun: any function.
    argnums: positions of the arguments with a batch axis.
    microbatch_size: rows per microbatch; must divide the batch size (None:
      ``fun`` itself is returned).
    accumulator: an ``Accumulator`` or ``AccumulationType`` (default SUM), or
      a tree of them matching a prefix of ``fun``'s output.
    argnames: names of keyword arguments with a batch axis.
    in_axes: the batch axis of each of ``argnums + argnames`` (one int: all).
    num_real_microbatches: run only this many microbatches (e.g. for a
      padded batch, without recompiling).

  Returns:
    A function with ``fun``'s arguments.

  Raises:
    ValueError (when called): for batch arguments of different batch sizes
    or a batch size that ``microbatch_size`` does not divide.

  References:
    Huang et al., "GPipe: Efficient Training of Giant Neural Networks using
    Pipeline Parallelism", NeurIPS 2019 (https://arxiv.org/abs/1811.06965):
    micro-batches evaluated in sequence to bound activation memory.
  """
  if microbatch_size is None:
    return fun
  argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
  argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames)
  if isinstance(in_axes, int):
    in_axes = (in_axes,) * (len(argnums) + len(argnames))
  positions = list(zip(argnums, in_axes)) + list(zip(argnames, in_axes[len(argnums):]))

  def get(args, kwargs, where):
    return args[where] if isinstance(where, int) else kwargs[where]

  def with_batches(args, kwargs, batch_fn):
    args, kwargs = list(args), dict(kwargs)
    for where, axis in positions:
      value = batch_fn(get(args, kwargs, where), axis)
      if isinstance(where, int):
        args[where] = value
      else:
        kwargs[where] = value
    return args, kwargs

  def microbatched(*args, **kwargs):
    sizes = [x.shape[axis] for where, axis in positions
             for x in jax.tree.leaves(get(args, kwargs, where))]
    if len(set(sizes)) > 1:
      raise ValueError(f"microbatch: the batch arguments must have equal batch sizes, found"
                       f" {sizes}")
    if sizes[0] % microbatch_size:
      raise ValueError(f"microbatch: batch size {sizes[0]} is not divisible by"
                       f" microbatch_size={microbatch_size}")
    num_microbatches = sizes[0] // microbatch_size
    combine = resolve(accumulator, num_microbatches)
    split_args, split_kwargs = with_batches(
        args, kwargs, lambda x, axis: reshape_batch_axis(x, microbatch_size, axis))

    def on_microbatch(i):
      take = lambda x, axis: jax.tree.map(  # noqa: E731
          lambda leaf: jnp.take(leaf, i, axis=axis), x)
      one_args, one_kwargs = with_batches(split_args, split_kwargs, take)
      return fun(*one_args, **one_kwargs)

    steps = num_microbatches if num_real_microbatches is None else num_real_microbatches
    carry = combine.init(typed_layouts.eval_shape_with_shardings(on_microbatch, 0))
    carry = jax.lax.fori_loop(
        0, steps, lambda i, c: combine.update(c, on_microbatch(i), i), carry)
    return combine.finalize(carry)

  return microbatched


def micro_vmap(
    fun: Callable[..., Any],
    in_axes: int | Sequence[int | None] = 0,
    out_axes: Any = 0,
    *,
    microbatch_size: int | None = None,
    vmap_fn: Callable[..., Any] = jax.vmap,
    accumulator: Any = AccumulationType.CONCAT,
    num_real_microbatches: int | jax.Array | None = None,
) -> Callable[..., Any]:
  """``jax.vmap`` over microbatches in sequence: each microbatch vmapped, the
  per-example outputs reduced by ``accumulator`` (CONCAT: as ``vmap``).

  Args:
    fun: the function mapped over examples.
    in_axes: the mapped axis of each positional argument (None: not mapped).
    out_axes: must be 0.
    microbatch_size: examples per microbatch (None: one batch).
    vmap_fn: a function with ``jax.vmap``'s signature.
    accumulator: how outputs combine, as for ``microbatch`` (MEAN and SUM
      reduce over examples).
    num_real_microbatches: as for ``microbatch``.

  Returns:
    A function with ``fun``'s arguments plus the mapped axes; keyword
    arguments are mapped over their leading axis.

  Raises:
    NotImplementedError: for ``out_axes`` other than 0.

  References:
    optax's ``microbatching.micro_vmap``.
  """
  if out_axes != 0:
    raise NotImplementedError("micro_vmap: only out_axes=0 is supported")
  in_axes = (in_axes,) if isinstance(in_axes, int) else tuple(in_axes)

  def vmapped_and_reduced(*args, kwargs):
    outputs = vmap_fn(fun, in_axes, out_axes)(*args, **kwargs)
    examples = jax.tree.leaves(outputs)[0].shape[0]
    return resolve(accumulator, examples).aggregate(outputs)

  mapped = microbatch(
      vmapped_and_reduced,
      argnums=tuple(i for i, axis in enumerate(in_axes) if axis is not None),
      argnames="kwargs", microbatch_size=microbatch_size, accumulator=accumulator,
      in_axes=tuple(axis for axis in in_axes if axis is not None) + (0,),
      num_real_microbatches=num_real_microbatches)
  return lambda *args, **kwargs: mapped(*args, kwargs=kwargs)


def micro_grad(
    fun: Callable[..., Any],
    has_aux: bool = False,
    argnums: int | Sequence[int] = 0,
    *,
    batch_argnums: int | Sequence[int] = 1,
    keep_batch_dim: bool = True,
    microbatch_size: int | None = None,
    accumulator: Any = AccumulationType.SUM,
    transform_fn: Callable[[Any], Any] = lambda x: x,
    metrics_fn: Callable[[Any], Any] = lambda x: None,
    num_real_microbatches: int | jax.Array | None = None,
) -> Callable[..., tuple[Any, IndividualOutputs]]:
  """Per-example gradients of ``fun``, transformed (``transform_fn``, e.g.
  clipped) and combined over the batch by ``accumulator``, in microbatches.

  Args:
    fun: the loss, ``fun(params, batch, ...)`` by default.
    has_aux: whether ``fun`` returns ``(value, aux)``.
    argnums: the arguments differentiated.
    batch_argnums: the arguments with a batch axis (axis 0).
    keep_batch_dim: whether ``fun`` sees each example with a batch axis of
      size 1.
    microbatch_size: examples per microbatch (None: one batch).
    accumulator: how the transformed gradients combine (default SUM).
    transform_fn: applied to each example's gradient before combining.
    metrics_fn: applied to each example's gradient; returned per example.
    num_real_microbatches: as for ``microbatch``.

  Returns:
    A function returning ``(combined gradients, Aux(values, metrics, aux))``,
    the ``Aux`` fields per example.

  References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016
    (https://arxiv.org/abs/1607.00133): per-example gradients, transformed
    (clipped) before they are summed.
  """
  batch_argnums = (batch_argnums,) if isinstance(batch_argnums, int) else tuple(batch_argnums)
  with_aux = fun if has_aux else (lambda *a, **k: (fun(*a, **k), None))
  value_and_grad = jax.value_and_grad(with_aux, argnums, has_aux=True)

  def per_example(*args, **kwargs):
    (value, aux), grad = value_and_grad(*args, **kwargs)
    return transform_fn(grad), IndividualOutputs(value, metrics_fn(grad), aux)

  in_axes = [None] * (max(batch_argnums) + 1)
  for i in batch_argnums:
    in_axes[i] = 0
  mapped = micro_vmap(per_example, in_axes=in_axes,
                      accumulator=(accumulator, AccumulationType.CONCAT),
                      microbatch_size=microbatch_size,
                      num_real_microbatches=num_real_microbatches)
  if not keep_batch_dim:
    return mapped

  def with_example_axis(*args, **kwargs):
    args = list(args)
    for i in batch_argnums:
      args[i] = jax.tree.map(lambda x: jnp.expand_dims(x, 1), args[i])
    return mapped(*args, **kwargs)

  return with_example_axis
