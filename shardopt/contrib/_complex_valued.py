"""Optimising complex params as pairs of real ones.

Same names, signature, state and numbers as ``optax.contrib``'s
``split_real_and_imaginary`` (0.2.8). The real and imaginary parts of a
sharded complex leaf keep its sharding, so the inner state derived from them
does too.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base

__all__ = ["SplitRealAndImaginaryState", "split_real_and_imaginary"]


class SplitRealAndImaginaryArrays(NamedTuple):
  """The two real halves of a complex array."""

  real: jax.Array
  imaginary: jax.Array


class SplitRealAndImaginaryState(NamedTuple):
  """The inner transformation's state, over the split params."""

  inner_state: base.OptState


def _split(x):
  if jnp.iscomplexobj(x):
    return SplitRealAndImaginaryArrays(x.real, x.imag)
  return x


def _merge(x):
  if isinstance(x, SplitRealAndImaginaryArrays):
    return x.real + x.imaginary * 1j
  return x


def _is_pair(x) -> bool:
  return isinstance(x, SplitRealAndImaginaryArrays)


def split_real_and_imaginary(
    inner: base.GradientTransformation,
) -> base.GradientTransformation:
  """Runs ``inner`` on the real and imaginary parts of complex leaves as two
  real leaves, and merges its updates back into complex ones.

  Real leaves pass through unchanged. (JAX's gradient of a real loss in a
  complex param is the conjugate of PyTorch's: conjugate it before
  ``update`` to descend.)

  Args:
    inner: the transformation to run on real leaves.

  Returns:
    A ``GradientTransformation`` whose state is a
    ``SplitRealAndImaginaryState``.

  References:
    optax issue #196, "Complex-valued optimization"
    (https://github.com/google-deepmind/optax/issues/196).
  """

  def init_fn(params):
    return SplitRealAndImaginaryState(inner.init(jax.tree.map(_split, params)))

  def update_fn(updates, state, params=None):
    updates, inner_state = inner.update(
        jax.tree.map(_split, updates), state.inner_state,
        jax.tree.map(_split, params))
    return (jax.tree.map(_merge, updates, is_leaf=_is_pair),
            SplitRealAndImaginaryState(inner_state))

  return base.GradientTransformation(init_fn, update_fn)
