"""Regression losses: squared error, L2, Huber, log-cosh, cosine."""

import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = [
    "cosine_distance",
    "cosine_similarity",
    "huber_loss",
    "l2_loss",
    "log_cosh",
    "squared_error",
]

Axis = int | tuple[int, ...] | None


def _errors(predictions, targets):
  return predictions - targets if targets is not None else predictions


def squared_error(predictions, targets=None):
  """Elementwise ``(predictions - targets) ** 2``.

  Args:
    predictions: the predictions (floating).
    targets: the targets, same shape (None: zero).

  Returns:
    The squared errors, shaped as ``predictions``.

  References:
    "Mean squared error", Wikipedia
    (https://en.wikipedia.org/wiki/Mean_squared_error).
  """
  _checks.require_floating(predictions, "squared_error", "predictions")
  if targets is not None:
    _checks.require_same_shape(predictions, targets, "squared_error",
                               "predictions and targets")
  return _errors(predictions, targets) ** 2


def l2_loss(predictions, targets=None):
  """Half the squared error, elementwise.

  Args:
    predictions: the predictions (floating).
    targets: the targets, same shape (None: zero).

  Returns:
    ``0.5 * (predictions - targets) ** 2``.

  References:
    Bishop, "Pattern Recognition and Machine Learning", Springer 2006,
    Sec. 1.1 (the sum-of-squares error with the factor 1/2).
  """
  return 0.5 * squared_error(jnp.asarray(predictions), targets)


def huber_loss(predictions, targets=None, *, delta=1.0):
  """Quadratic for errors up to ``delta``, linear beyond, elementwise.

  Args:
    predictions: the predictions (floating).
    targets: the targets (None: zero).
    delta: where the loss turns from quadratic to linear.

  Returns:
    ``0.5 * min(|e|, delta)**2 + delta * (|e| - min(|e|, delta))``.

  References:
    Huber, "Robust Estimation of a Location Parameter", Ann. Math. Statist.
    1964 (https://en.wikipedia.org/wiki/Huber_loss).
  """
  _checks.require_floating(predictions, "huber_loss", "predictions")
  abs_errors = jnp.abs(_errors(predictions, targets))
  quadratic = jnp.minimum(abs_errors, delta)
  return 0.5 * quadratic**2 + delta * (abs_errors - quadratic)


def log_cosh(predictions, targets=None):
  """``log(cosh(predictions - targets))``, computed without overflow.

  Args:
    predictions: the predictions (floating).
    targets: the targets (None: zero).

  Returns:
    The elementwise loss.

  References:
    Chen et al., "Log Hyperbolic Cosine Loss Improves Variational
    Auto-Encoder", 2019 (https://openreview.net/pdf?id=rkglvsC9Ym).
  """
  _checks.require_floating(predictions, "log_cosh", "predictions")
  errors = _errors(predictions, targets)
  return jnp.logaddexp(errors, -errors) - jnp.log(2.0).astype(errors.dtype)


def cosine_similarity(predictions, targets, *, epsilon=0.0, axis: Axis = -1,
                      where=None):
  """Cosine of the angle between ``predictions`` and ``targets`` along
  ``axis``.

  Args:
    predictions: the predictions (floating).
    targets: the targets, same shape (floating).
    epsilon: lower bound of each squared norm (avoids dividing by zero).
    axis: the vector axis or axes.
    where: a boolean mask of the elements to include.

  Returns:
    The cosine similarity with ``axis`` reduced.

  References:
    "Cosine similarity", Wikipedia
    (https://en.wikipedia.org/wiki/Cosine_similarity).
  """
  _checks.require_floating(predictions, "cosine_similarity", "predictions")
  _checks.require_floating(targets, "cosine_similarity", "targets")

  def unit(x):
    sq_norm = jnp.square(x).sum(axis=axis, where=where, keepdims=True)
    return x / jnp.sqrt(sq_norm.clip(epsilon))

  return (unit(predictions) * unit(targets)).sum(axis=axis, where=where)


def cosine_distance(predictions, targets, *, epsilon=0.0, axis: Axis = -1,
                    where=None):
  """One minus the cosine similarity along ``axis``.

  Args:
    predictions: the predictions (floating).
    targets: the targets, same shape (floating).
    epsilon: lower bound of each squared norm.
    axis: the vector axis or axes.
    where: a boolean mask of the elements to include.

  Returns:
    ``1 - cosine_similarity`` with ``axis`` reduced.

  References:
    "Cosine distance", Wikipedia
    (https://en.wikipedia.org/wiki/Cosine_similarity#Cosine_distance).
  """
  _checks.require_floating(predictions, "cosine_distance", "predictions")
  _checks.require_floating(targets, "cosine_distance", "targets")
  return 1.0 - cosine_similarity(predictions, targets, epsilon=epsilon,
                                 axis=axis, where=where)
