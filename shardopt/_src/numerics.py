"""Numerically safe scalar helpers shared by the transforms."""

import jax
import jax.numpy as jnp

__all__ = [
    "abs_sq",
    "safe_increment",
    "safe_int32_increment",
    "safe_norm",
    "safe_root_mean_squares",
]


def abs_sq(x: jax.Array) -> jax.Array:
  """``|x|**2`` elementwise, for real or complex arrays.

  Args:
    x: an array.

  Returns:
    ``x * conj(x)`` as a real array (``x**2`` for real ``x``).
  """
  x = jnp.asarray(x)
  return (x.conj() * x).real


def safe_increment(count: jax.Array) -> jax.Array:
  """``count + 1``, saturating at the dtype's maximum instead of overflowing.

  Args:
    count: an integer (or float) array, e.g. a step count.

  Returns:
    ``count + 1`` in ``count``'s dtype, or ``count`` if it is at the
    maximum.
  """
  count = jnp.asarray(count)
  if jnp.issubdtype(count.dtype, jnp.integer):
    max_value = jnp.iinfo(count.dtype).max
  elif jnp.issubdtype(count.dtype, jnp.floating):
    max_value = jnp.finfo(count.dtype).max
  else:
    raise ValueError(
        f"cannot increment a counter of dtype {count.dtype}: use an integer"
        " or floating dtype"
    )
  # The maximum as an array of the count's dtype: as a Python int, uint32's
  # or uint64's would not fit the int32/int64 it is parsed as.
  max_value = jnp.asarray(max_value, count.dtype)
  return jnp.where(count < max_value, count + jnp.ones_like(count), max_value)


safe_int32_increment = safe_increment


def safe_norm(x, min_norm, ord=None, axis=None, keepdims=False):  # pylint: disable=redefined-builtin
  """``max(norm(x), min_norm)`` whose gradient is finite (zero) below ``min_norm``.

  Args:
    x: an array.
    min_norm: the floor of the norm.
    ord: the norm's order, as in ``jnp.linalg.norm`` (default None: L2).
    axis: the axes reduced, as in ``jnp.linalg.norm`` (default None: all).
    keepdims: whether reduced axes are kept with size 1 (default False).

  Returns:
    The floored norm.
  """
  norm = jnp.linalg.norm(x, ord=ord, axis=axis, keepdims=True)
  safe_x = jnp.where(norm <= min_norm, jnp.ones_like(x), x)
  norm = norm if keepdims else jnp.squeeze(norm, axis=axis)
  masked_norm = jnp.linalg.norm(safe_x, ord=ord, axis=axis, keepdims=keepdims)
  return jnp.where(norm <= min_norm, min_norm, masked_norm)


def safe_root_mean_squares(x, min_rms):
  """``max(rms(x), min_rms)`` whose gradient is finite (zero) below ``min_rms``.

  Args:
    x: an array.
    min_rms: the floor of the root mean square.

  Returns:
    The floored root mean square, a scalar.
  """
  rms = jnp.sqrt(jnp.mean(abs_sq(x)))
  safe_x = jnp.where(rms <= min_rms, jnp.ones_like(x), x)
  return jnp.where(rms <= min_rms, min_rms, jnp.sqrt(jnp.mean(abs_sq(safe_x))))
