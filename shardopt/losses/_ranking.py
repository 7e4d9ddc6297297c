"""Ranking losses."""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = ["ranking_softmax_loss"]


def _reduce(loss, where, reduce_fn):
  """``reduce_fn(loss, where=where)``; a mean over nothing valid is 0, and
  unreduced losses are 0 where masked."""
  out = reduce_fn(loss, where=where) if reduce_fn is not None else loss
  if reduce_fn is jnp.mean:
    valid_input = jnp.logical_not(jnp.any(jnp.isnan(loss)))
    out = jnp.where(jnp.isnan(out) & valid_input, 0.0, out)
  if reduce_fn is None and where is not None:
    out = jnp.where(where, out, 0.0)
  return out


def ranking_softmax_loss(logits, labels, *, where=None, weights=None,
                         reduce_fn: Callable[..., jax.Array] | None = jnp.mean):
  """The listwise softmax cross-entropy of ranking scores against graded
  relevance labels (over the last axis, one list per row).

  Args:
    logits: scores, ``[..., list_size]`` (floating).
    labels: relevance, same shape (cast to the logits' dtype).
    where: a boolean mask of the valid items.
    weights: per-item weights multiplying the labels.
    reduce_fn: reduces the per-list losses (None: keep them).

  Returns:
    The reduced loss (or one per list).

  References:
    Cao et al., "Learning to Rank: From Pairwise Approach to Listwise
    Approach", ICML 2007; Bruch et al., "An Analysis of the Softmax Cross
    Entropy Loss for Learning-to-Rank with Binary Relevance", ICTIR 2019.
  """
  _checks.require_floating(logits, "ranking_softmax_loss", "logits")
  labels = labels.astype(logits.dtype)
  if where is not None:
    labels = jnp.where(where, labels, jnp.zeros_like(labels))
    logits = jnp.where(where, logits, -jnp.ones_like(logits) * jnp.inf)
  if weights is not None:
    labels *= weights
  loss = -jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1,
                  where=where)
  if where is not None:
    where = jnp.any(where, axis=-1)
  return _reduce(loss, where, reduce_fn)
