"""Kullback-Leibler divergences between distributions along an axis."""

import warnings

import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = [
    "convex_kl_divergence",
    "generalized_kl_divergence",
    "kl_divergence",
    "kl_divergence_with_log_targets",
]

Axis = int | tuple[int, ...] | None


def kl_divergence(log_predictions, targets, axis: Axis = -1, where=None):
  """``KL(targets || predictions)`` along ``axis``, with ``0 log 0 = 0``.

  Args:
    log_predictions: log-probabilities of the prediction (floating).
    targets: probabilities of the target, same shape (floating).
    axis: the distribution axis or axes.
    where: a boolean mask of the elements to include.

  Returns:
    ``sum(targets * (log(targets) - log_predictions))`` with ``axis``
    reduced.

  References:
    Kullback & Leibler, "On Information and Sufficiency", Ann. Math. Statist.
    1951 (https://www.jstor.org/stable/2236703).
  """
  _checks.require_floating(log_predictions, "kl_divergence", "log_predictions")
  _checks.require_floating(targets, "kl_divergence", "targets")
  log_targets = jnp.where(targets == 0, 0, jnp.log(targets))
  return jnp.sum(targets * (log_targets - log_predictions), axis=axis,
                 where=where)


def kl_divergence_with_log_targets(log_predictions, log_targets,
                                   axis: Axis = -1, where=None):
  """``KL(targets || predictions)`` with the targets as log-probabilities.

  Args:
    log_predictions: log-probabilities of the prediction (floating).
    log_targets: log-probabilities of the target, same shape (floating).
    axis: the distribution axis or axes.
    where: a boolean mask of the elements to include.

  Returns:
    ``sum(exp(log_targets) * (log_targets - log_predictions))`` with
    ``axis`` reduced.

  References:
    Kullback & Leibler, "On Information and Sufficiency", Ann. Math. Statist.
    1951 (https://www.jstor.org/stable/2236703).
  """
  name = "kl_divergence_with_log_targets"
  _checks.require_floating(log_predictions, name, "log_predictions")
  _checks.require_floating(log_targets, name, "log_targets")
  return jnp.sum(jnp.exp(log_targets) * (log_targets - log_predictions),
                 axis=axis, where=where)


def generalized_kl_divergence(log_predictions, targets, axis: Axis = -1,
                              where=None):
  """The generalised KL divergence between non-negative measures:
  ``KL(targets || predictions) + sum(predictions - targets)``.

  Args:
    log_predictions: log of the predicted measure (floating).
    targets: the target measure, same shape (floating, non-negative).
    axis: the measure's axis or axes.
    where: a boolean mask of the elements to include.

  Returns:
    The divergence with ``axis`` reduced.

  References:
    Boyd & Vandenberghe, "Convex Optimization", Cambridge 2004, p. 90
    (https://stanford.edu/~boyd/cvxbook/bv_cvxbook.pdf).
  """
  divergence = kl_divergence(log_predictions, targets, axis=axis, where=where)
  return divergence + jnp.sum(jnp.exp(log_predictions) - targets, axis=axis,
                              where=where)


def convex_kl_divergence(log_predictions, targets, axis: Axis = -1,
                         where=None):
  """Deprecated name of ``generalized_kl_divergence`` (as in optax).

  Args:
    log_predictions: log of the predicted measure (floating).
    targets: the target measure, same shape.
    axis: the measure's axis or axes.
    where: a boolean mask of the elements to include.

  Returns:
    ``generalized_kl_divergence(log_predictions, targets, axis, where)``.

  References:
    Boyd & Vandenberghe, "Convex Optimization", Cambridge 2004, p. 90
    (https://stanford.edu/~boyd/cvxbook/bv_cvxbook.pdf).
  """
  warnings.warn("convex_kl_divergence is deprecated: use"
                " generalized_kl_divergence", DeprecationWarning, stacklevel=2)
  return generalized_kl_divergence(log_predictions, targets, axis=axis,
                                   where=where)
