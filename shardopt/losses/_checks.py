"""Input checks shared by the losses: each error names the loss, the
argument and what to pass instead."""

import jax
import jax.numpy as jnp
import numpy as np


def _shape(x) -> tuple[int, ...]:
  return x.shape if hasattr(x, "shape") else np.asarray(x).shape


def require_floating(x, loss: str, arg: str) -> None:
  """Raises TypeError unless ``x`` has a floating dtype."""
  dtype = jax.dtypes.result_type(x)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{loss}: {arg} must have a floating dtype, got {dtype};"
                    f" cast it, e.g. {arg}.astype(jnp.float32)")


def require_integer(x, loss: str, arg: str) -> None:
  """Raises TypeError unless ``x`` has an integer dtype."""
  dtype = jax.dtypes.result_type(x)
  if not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"{loss}: {arg} must hold integer class indices, got"
                    f" {dtype}; for one-hot or soft labels use the loss"
                    " without _with_integer_labels")


def require_same_shape(a, b, loss: str, args: str) -> None:
  """Raises ValueError unless ``a`` and ``b`` have one shape."""
  if _shape(a) != _shape(b):
    raise ValueError(f"{loss}: {args} must have the same shape, got"
                     f" {_shape(a)} and {_shape(b)}")


def require_rank(x, rank: int, loss: str, arg: str) -> None:
  """Raises ValueError unless ``x`` has ``rank`` dimensions."""
  if len(_shape(x)) != rank:
    raise ValueError(f"{loss}: {arg} must have rank {rank}, got shape"
                     f" {_shape(x)}")


def canonical_axis(axis: int, ndim: int) -> int:
  """``axis`` in ``[0, ndim)``; ValueError when out of range."""
  if -ndim <= axis < ndim:
    return axis % ndim
  raise ValueError(f"axis {axis} is out of bounds for an array of rank {ndim}")
