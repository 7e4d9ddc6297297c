"""How microbatch results combine: ``Accumulator``, the built-in
``AccumulationType``s (sum, mean, running mean, concatenation) and
``resolve``, one accumulator for a tree of them (per output subtree).
"""

import dataclasses
import enum
import functools
from typing import Any
from typing import Callable

import jax
import jax.numpy as jnp

from shardopt._src.batch_axis import merge_batch_axis

__all__ = ["AccumulationType", "Accumulator", "resolve"]


@dataclasses.dataclass(frozen=True)
class Accumulator:
  """How microbatch results combine: ``carry = init(shape of one result)``,
  ``carry = update(carry, result_i, i)`` for each microbatch ``i``, then
  ``finalize(carry)``; ``aggregate`` reduces a stack of results over axis 0
  (``micro_vmap`` uses it within a microbatch)."""

  init: Callable[[Any], Any]
  update: Callable[[Any, Any, Any], Any]
  finalize: Callable[[Any], Any]
  aggregate: Callable[[Any], Any]


class AccumulationType(enum.Enum):
  """The built-in ways to combine microbatch results."""

  MEAN = enum.auto()
  """The mean over microbatches."""
  SUM = enum.auto()
  """The sum over microbatches."""
  RUNNING_MEAN = enum.auto()
  """The mean over the microbatches run (``num_real_microbatches``)."""
  CONCAT = enum.auto()
  """The results concatenated along axis 0, in the batch's row order."""


def _leafwise(accumulator: Accumulator) -> Accumulator:
  """An accumulator of arrays applied leaf by leaf to trees."""
  return Accumulator(
      lambda value: jax.tree.map(accumulator.init, value),
      lambda carry, value, i: jax.tree.map(
          lambda c, v: accumulator.update(c, v, i), carry, value),
      lambda carry: jax.tree.map(accumulator.finalize, carry),
      lambda values: jax.tree.map(accumulator.aggregate, values),
  )


def _floating_zeros(value):
  if not jnp.issubdtype(value.dtype, jnp.floating):
    raise ValueError("MEAN and RUNNING_MEAN Accumulators require floating-point values; got"
                     f" {value.dtype}")
  return jnp.zeros_like(value)


def _sum() -> Accumulator:
  return _leafwise(Accumulator(jnp.zeros_like, lambda c, v, _: c + v, lambda c: c,
                               functools.partial(jnp.sum, axis=0)))


def _check_positive(num_microbatches: int) -> None:
  if num_microbatches <= 0:
    raise ValueError(f"microbatch: num_microbatches={num_microbatches} must be positive")


def _mean(num_microbatches: int) -> Accumulator:
  _check_positive(num_microbatches)
  return _leafwise(Accumulator(_floating_zeros, lambda c, v, _: c + v,
                               lambda c: c / num_microbatches,
                               functools.partial(jnp.mean, axis=0)))


def _running_mean() -> Accumulator:
  def update(carry, value, i):
    kept = i / (i + 1)
    return carry * kept + value * (1 - kept)

  return _leafwise(Accumulator(_floating_zeros, update, lambda c: c,
                               functools.partial(jnp.mean, axis=0)))


def _concat(num_microbatches: int) -> Accumulator:
  _check_positive(num_microbatches)

  return _leafwise(Accumulator(
      lambda value: jnp.broadcast_to(jnp.zeros_like(value), (num_microbatches, *value.shape)),
      lambda carry, value, i: carry.at[i].set(value), merge_batch_axis, lambda values: values))


def resolve(accumulator: Any, num_microbatches: int) -> Accumulator:
  """One ``Accumulator`` for a tree (a prefix of the results' structure) of
  ``Accumulator``s and ``AccumulationType``s."""
  def one(acc):
    if isinstance(acc, Accumulator):
      return acc
    if acc == AccumulationType.SUM:
      return _sum()
    if acc == AccumulationType.MEAN:
      return _mean(num_microbatches)
    if acc == AccumulationType.RUNNING_MEAN:
      return _running_mean()
    if acc == AccumulationType.CONCAT:
      return _concat(num_microbatches)
    raise ValueError(f"microbatch: unknown accumulator {acc!r}; use an Accumulator or an"
                     " AccumulationType")

  tree = jax.tree.map(one, accumulator)

  def init(values):
    return jax.tree.map(lambda acc, v: acc.init(v), tree, values)

  def update(carry, values, i):
    return jax.tree.map(lambda acc, c, v: acc.update(c, v, i), tree, carry, values)

  def finalize(carry):
    return jax.tree.map(lambda acc, c: acc.finalize(c), tree, carry)

  def aggregate(values):
    return jax.tree.map(lambda acc, v: acc.aggregate(v), tree, values)

  return Accumulator(init, update, finalize, aggregate)
