"""Fenchel-Young losses from a regularised max function."""

from collections.abc import Callable

import jax.numpy as jnp

__all__ = ["make_fenchel_young_loss"]


def make_fenchel_young_loss(max_fun: Callable[..., jnp.ndarray]):
  """The Fenchel-Young loss ``max_fun(scores) - <targets, scores>`` of a
  convex regularised max (e.g. ``jax.nn.logsumexp`` gives the softmax
  cross-entropy up to a constant).

  Args:
    max_fun: ``max_fun(scores, *args, **kwargs)`` of a vector of scores.

  Returns:
    ``loss(scores, targets, *args, **kwargs)``, applied along the last axis
    (leading axes are batch axes).

  References:
    Blondel et al., "Learning with Fenchel-Young Losses", JMLR 2020
    (https://arxiv.org/abs/1901.02324).
  """
  vdot_last_axis = jnp.vectorize(jnp.vdot, signature="(n),(n)->()")
  max_last_axis = jnp.vectorize(max_fun, signature="(n)->()")

  def fenchel_young_loss(scores, targets, *args, **kwargs):
    return (max_last_axis(scores, *args, **kwargs)
            - vdot_last_axis(targets, scores))

  return fenchel_young_loss
