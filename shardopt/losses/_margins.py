"""Margin losses: hinge, perceptron, sparsemax (binary and multiclass)."""

import jax
import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = [
    "hinge_loss",
    "multiclass_hinge_loss",
    "multiclass_perceptron_loss",
    "multiclass_sparsemax_loss",
    "perceptron_loss",
    "sparsemax_loss",
]

_dot_last_axis = jnp.vectorize(jnp.dot, signature="(n),(n)->()")


def hinge_loss(predictor_outputs, targets):
  """Binary hinge loss ``max(0, 1 - outputs * targets)``, elementwise.

  Args:
    predictor_outputs: the scores.
    targets: the labels in {-1, 1}.

  Returns:
    The elementwise loss.

  References:
    "Hinge loss", Wikipedia (https://en.wikipedia.org/wiki/Hinge_loss).
  """
  return jnp.maximum(0, 1 - predictor_outputs * targets)


def perceptron_loss(predictor_outputs, targets):
  """Binary perceptron loss ``max(0, -outputs * targets)``, elementwise.

  Args:
    predictor_outputs: the scores.
    targets: the labels in {-1, 1}, same shape.

  Returns:
    The elementwise loss.

  References:
    Rosenblatt, "The perceptron: a probabilistic model for information
    storage and organization in the brain", Psychological Review 1958
    (https://en.wikipedia.org/wiki/Perceptron).
  """
  _checks.require_same_shape(predictor_outputs, targets, "perceptron_loss",
                             "predictor_outputs and targets")
  return jnp.maximum(0, -predictor_outputs * targets)


def sparsemax_loss(logits, labels):
  """Binary sparsemax loss: ``sparse_plus(-logits)`` for positive labels,
  ``sparse_plus(logits)`` for negative ones.

  Args:
    logits: the scores.
    labels: the labels in {0, 1}.

  Returns:
    The elementwise loss.

  References:
    Blondel et al., "Learning with Fenchel-Young Losses", JMLR 2020
    (https://arxiv.org/abs/1901.02324), Sec. 4.4.
  """
  return jax.nn.sparse_plus(jnp.where(labels, -logits, logits))


def multiclass_hinge_loss(scores, labels):
  """Multiclass hinge loss: ``max_k (scores_k + 1 - [k = y]) - scores_y``.

  Args:
    scores: ``[..., num_classes]``.
    labels: integer classes, ``[...]``.

  Returns:
    The loss, ``[...]``.

  References:
    Crammer & Singer, "On the Algorithmic Implementation of Multiclass
    Kernel-based Vector Machines", JMLR 2001
    (https://en.wikipedia.org/wiki/Hinge_loss).
  """
  one_hot = jax.nn.one_hot(labels, scores.shape[-1])
  return (jnp.max(scores + 1.0 - one_hot, axis=-1)
          - _dot_last_axis(scores, one_hot))


def multiclass_perceptron_loss(scores, labels):
  """Multiclass perceptron loss: ``max_k scores_k - scores_y``.

  Args:
    scores: ``[..., num_classes]``.
    labels: integer classes, ``[...]``.

  Returns:
    The loss, ``[...]``.

  References:
    Collins, "Discriminative Training Methods for Hidden Markov Models:
    Theory and Experiments with Perceptron Algorithms", EMNLP 2002.
  """
  one_hot = jax.nn.one_hot(labels, scores.shape[-1])
  return jnp.max(scores, axis=-1) - _dot_last_axis(scores, one_hot)


@jax.custom_jvp
def _unit_simplex_projection(values):
  """The Euclidean projection of a vector onto the unit simplex (sort-based,
  Held et al. 1974)."""
  descending = jnp.sort(values)[::-1]
  cumulative = jnp.cumsum(descending)
  ranks = jnp.arange(values.shape[0]) + 1
  support = jnp.count_nonzero(1 / ranks + (descending - cumulative / ranks) > 0)
  return jax.nn.relu(1 / support + (values - cumulative[support - 1] / support))


@_unit_simplex_projection.defjvp
def _unit_simplex_projection_jvp(primals, tangents):
  """The projection's Jacobian on its support: the tangent there, centred
  (Martins & Astudillo 2016), as optax defines it."""
  (values,), (values_dot,) = primals, tangents
  projected = _unit_simplex_projection(values)
  support = projected > 0
  size = jnp.count_nonzero(support)
  return projected, (support * values_dot
                     - (jnp.dot(support, values_dot) / size) * support)


def _simplex_projection(values, scale=1.0):
  """The projection onto the simplex of sum ``scale``, as optax computes it
  (through the unit simplex, so gradients accumulate in optax's order)."""
  return scale * _unit_simplex_projection(values / scale)


def _one_sparsemax_loss(scores, label):
  scores = jnp.asarray(scores)
  proba = _simplex_projection(scores)
  centred = (scores - scores[label]).at[label].set(0.0)
  return (jnp.dot(proba, jnp.where(proba, centred, 0.0))
          + 0.5 * (1.0 - jnp.dot(proba, proba)))


def multiclass_sparsemax_loss(scores, labels):
  """Multiclass sparsemax loss of each row of ``scores``.

  Args:
    scores: ``[batch, num_classes]``.
    labels: integer classes, ``[batch]``.

  Returns:
    The loss, ``[batch]``.

  References:
    Martins & Astudillo, "From Softmax to Sparsemax: A Sparse Model of
    Attention and Multi-Label Classification", ICML 2016
    (https://arxiv.org/abs/1602.02068).
  """
  return jax.vmap(_one_sparsemax_loss)(scores, labels)
