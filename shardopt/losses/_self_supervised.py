"""Self-supervised (metric learning) losses: NT-Xent and triplet margin."""

import jax
import jax.numpy as jnp

from shardopt.losses import _checks
from shardopt.losses._regression import cosine_similarity

__all__ = ["ntxent", "triplet_margin_loss"]


def ntxent(embeddings, labels, temperature=0.07):
  """The normalised temperature-scaled cross-entropy (NT-Xent) of a batch of
  embeddings: each pair with equal labels is a positive, every pair with
  different labels a negative.

  Args:
    embeddings: ``[batch, dim]`` (floating).
    labels: ``[batch]`` integer labels.
    temperature: divides the cosine similarities.

  Returns:
    The mean loss over positive pairs (a scalar).

  Raises:
    ValueError: when ``labels`` and ``embeddings`` differ in batch size.

  References:
    Chen et al., "A Simple Framework for Contrastive Learning of Visual
    Representations", ICML 2020 (https://arxiv.org/abs/2002.05709).
  """
  _checks.require_floating(embeddings, "ntxent", "embeddings")
  if labels.shape[0] != embeddings.shape[0]:
    raise ValueError(
        f"ntxent: labels and embeddings must have the same leading dimension,"
        f" got {labels.shape[0]} for labels and {embeddings.shape[0]} for"
        " embeddings")
  similarity = cosine_similarity(
      embeddings[None, :, :], embeddings[:, None, :],
      epsilon=jnp.finfo(embeddings.dtype).eps) / temperature
  same = jnp.expand_dims(labels, 1) == jnp.expand_dims(labels, 0)
  different = same ^ 1
  positive = jnp.bool_(same - jnp.eye(same.shape[0]))
  neg_sim = jnp.where(different == 1, similarity, -jnp.inf)
  pos_sim = jnp.where(positive == 1, similarity, -jnp.inf)
  shift = jax.lax.stop_gradient(
      jnp.max(jnp.concatenate((neg_sim, pos_sim), axis=-1), axis=1,
              keepdims=True))
  neg_sim, pos_sim = neg_sim - shift, pos_sim - shift
  denominator = jnp.sum(jnp.exp(neg_sim), axis=1, keepdims=True)
  denominator += jnp.exp(pos_sim)
  log_softmax = pos_sim - jnp.log(denominator)
  return -jnp.where(positive == 1, log_softmax, 0.0).sum() / positive.sum()


def triplet_margin_loss(anchors, positives, negatives, axis: int = -1,
                        norm_degree=2, margin=1.0, eps=1e-6):
  """``max(d(a, p) - d(a, n) + margin, 0)`` with the ``norm_degree``-norm
  distance along ``axis``.

  Args:
    anchors: anchor embeddings (floating).
    positives: embeddings of the same class, same shape.
    negatives: embeddings of other classes, same shape.
    axis: the embedding axis.
    norm_degree: the degree of the norm.
    margin: the margin.
    eps: added inside the root.

  Returns:
    The loss with ``axis`` reduced.

  References:
    Balntas et al., "Learning local feature descriptors with triplets and
    shallow convolutional neural networks", BMVC 2016
    (https://bmva-archive.org.uk/bmvc/2016/papers/paper119/).
  """
  for arg, value in (("anchors", anchors), ("positives", positives),
                     ("negatives", negatives)):
    _checks.require_floating(value, "triplet_margin_loss", arg)

  def distance(other):
    return jnp.power(jnp.power(anchors - other, norm_degree).sum(axis) + eps,
                     1 / norm_degree)

  return jnp.maximum(distance(positives) - distance(negatives) + margin, 0)
