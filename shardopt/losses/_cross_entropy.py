"""Cross-entropy losses: softmax (soft and integer labels), sigmoid, focal
and polynomial.

Each computes optax's formula in optax's order, so values and gradients are
bit-equal to optax's under ``jax.jit`` (tests/test_losses.py). With the class
(vocabulary) axis sharded over an Auto mesh axis the compiled loss
all-reduces per-example values and never gathers the logits: the reductions
are ``jnp`` reductions, and XLA partitions the label's ``take_along_axis``
by masking each shard's indices. Over Explicit mesh axes (``jax.make_mesh``'s
default), where a gather along a sharded axis has no sharding rule and
optax's loss raises ``ShardingTypeError``, the label's logit is that mask
written out: a sum over the class axis of the logits where the class is the
label (the same value: one term and zeros).
"""

import jax
import jax.numpy as jnp
import jax.scipy.special

from shardopt._src import typed_layouts
from shardopt.losses import _checks

__all__ = [
    "poly_loss_cross_entropy",
    "safe_softmax_cross_entropy",
    "sigmoid_binary_cross_entropy",
    "sigmoid_focal_loss",
    "softmax_cross_entropy",
    "softmax_cross_entropy_with_integer_labels",
]

Axis = int | tuple[int, ...] | None


def sigmoid_binary_cross_entropy(logits, labels):
  """Binary cross-entropy of independent sigmoid outputs, elementwise.

  Args:
    logits: the logits (any shape, floating).
    labels: targets in [0, 1] broadcastable to ``logits`` (cast to their
      dtype).

  Returns:
    ``-labels * log(sigmoid(logits)) - (1 - labels) * log(1 - sigmoid)``,
    shaped as ``logits``.

  References:
    Goodfellow et al., "Deep Learning", MIT Press 2016, Sec. 6.2.2.2
    (http://www.deeplearningbook.org/contents/prob.html).
  """
  _checks.require_floating(logits, "sigmoid_binary_cross_entropy", "logits")
  labels = jnp.astype(labels, logits.dtype)
  return (-labels * jax.nn.log_sigmoid(logits)
          - (1.0 - labels) * jax.nn.log_sigmoid(-logits))


@jax.custom_jvp
def _weighted_log_softmax(x, weights):
  """``weights * log_softmax(x)``, zero (with a finite gradient) where a
  weight is zero, even when the logit is ``-inf``."""
  log_probs = jax.nn.log_softmax(x, axis=-1)
  return jnp.where(weights != 0.0, weights * log_probs,
                   jnp.zeros_like(log_probs))


@_weighted_log_softmax.defjvp
def _weighted_log_softmax_jvp(primals, tangents):
  x, weights = primals
  x_dot, weights_dot = tangents
  log_probs = jax.nn.log_softmax(x, axis=-1)
  value = jnp.where(weights != 0.0, weights * log_probs,
                    jnp.zeros_like(log_probs))
  expected_dot = jnp.sum(x_dot * jax.nn.softmax(x, axis=-1), axis=-1,
                         keepdims=True)
  return value, (weights * x_dot - weights * expected_dot
                 + weights_dot * log_probs)


def safe_softmax_cross_entropy(logits, labels):
  """Softmax cross-entropy over the last axis that stays finite where a
  logit is ``-inf`` and its label zero.

  Args:
    logits: unnormalised log-probabilities, ``[..., num_classes]``.
    labels: class probabilities of the same shape.

  Returns:
    The cross-entropy, shaped ``[...]``.

  References:
    "Cross entropy", Wikipedia (https://en.wikipedia.org/wiki/Cross-entropy).
  """
  _checks.require_floating(logits, "safe_softmax_cross_entropy", "logits")
  return -jnp.sum(_weighted_log_softmax(logits, labels), axis=-1)


def _expand_where(where, logits, axis):
  if where is not None and where.ndim != logits.ndim:
    return jnp.expand_dims(where, axis)
  return where


def softmax_cross_entropy(logits, labels, axis: Axis = -1, where=None):
  """Cross-entropy between ``labels`` and ``softmax(logits)`` over ``axis``.

  Args:
    logits: unnormalised log-probabilities.
    labels: class probabilities (one-hot, smoothed or soft), same shape.
    axis: the class axis or axes.
    where: a boolean mask of the classes to include (shaped as ``logits``,
      or as the result, expanded along ``axis``).

  Returns:
    The cross-entropy with ``axis`` reduced.

  References:
    "Cross entropy", Wikipedia (https://en.wikipedia.org/wiki/Cross-entropy);
    "Multinomial logistic regression", Wikipedia
    (https://en.wikipedia.org/wiki/Multinomial_logistic_regression).
  """
  _checks.require_floating(logits, "softmax_cross_entropy", "logits")
  where = _expand_where(where, logits, axis)
  log_probs = jax.nn.log_softmax(logits, axis, where)
  return -(labels * log_probs).sum(axis, where=where)


def _merge_class_axes(logits, where, axes: tuple[int, ...]):
  """Moves the class axes last and merges them into one."""
  class_axes = tuple(_checks.canonical_axis(a, logits.ndim) for a in axes)
  batch_axes = tuple(a for a in range(logits.ndim) if a not in class_axes)
  order = batch_axes + class_axes

  def merge(x):
    x = x.transpose(order)
    return x.reshape(x.shape[:len(batch_axes)] + (-1,))

  return merge(logits), None if where is None else merge(where), len(batch_axes)


def _label_logit(logits, labels, axis: int):
  """``logits`` at ``labels`` along ``axis`` (the axis dropped)."""
  if typed_layouts.split_along(logits, axis):
    classes = jax.lax.broadcasted_iota(labels.dtype, logits.shape, axis)
    return jnp.sum(jnp.where(classes == jnp.expand_dims(labels, axis), logits, 0), axis=axis)
  picked = jnp.take_along_axis(logits, jnp.expand_dims(labels, axis), axis=axis)
  return picked.take(0, axis=axis)


def softmax_cross_entropy_with_integer_labels(logits, labels, axis: int | tuple[int, ...] = -1,
                                              where=None):
  """Softmax cross-entropy with integer class labels:
  ``logsumexp(logits) - logits[label]`` over ``axis``.

  Args:
    logits: unnormalised log-probabilities.
    labels: integer class indices, shaped as ``logits`` without ``axis``
      (with several class axes, indices into their flattening).
    axis: the class axis or axes.
    where: a boolean mask of the classes to include; rows with no class
      included give 0.

  Returns:
    The cross-entropy, shaped as ``labels``.

  Raises:
    TypeError: for floating labels (use ``softmax_cross_entropy``) or
      integer logits.
    ValueError: for an ``axis`` that is neither an int nor a tuple.

  References:
    "Cross entropy", Wikipedia (https://en.wikipedia.org/wiki/Cross-entropy);
    "Multinomial logistic regression", Wikipedia
    (https://en.wikipedia.org/wiki/Multinomial_logistic_regression).
  """
  name = "softmax_cross_entropy_with_integer_labels"
  _checks.require_floating(logits, name, "logits")
  _checks.require_integer(labels, name, "labels")
  where = _expand_where(where, logits, axis)
  if isinstance(axis, int):
    axis = _checks.canonical_axis(axis, logits.ndim)
  elif isinstance(axis, tuple):
    logits, where, axis = _merge_class_axes(logits, where, axis)
  else:
    raise ValueError(f"{name}: axis must be an int or a tuple of ints, got"  # noqa: TRY004 (optax raises ValueError)
                     f" {type(axis).__name__}")
  label_logits = _label_logit(logits, labels, axis)
  loss = jax.nn.logsumexp(logits, axis=axis, where=where) - label_logits
  if where is not None:
    loss = jnp.where(jnp.any(where, axis), loss, 0.0)
  return loss


def poly_loss_cross_entropy(logits, labels, *, epsilon=2.0, axis: Axis = -1,
                            where=None):
  """Poly-1 loss: cross-entropy plus ``epsilon * (1 - p_t)``.

  Args:
    logits: unnormalised log-probabilities.
    labels: class probabilities, same shape (floating).
    epsilon: weight of the first polynomial term.
    axis: the class axis or axes.
    where: a boolean mask of the classes to include.

  Returns:
    The loss with ``axis`` reduced.

  References:
    Leng et al., "PolyLoss: A Polynomial Expansion Perspective of
    Classification Loss Functions", ICLR 2022
    (https://arxiv.org/abs/2204.12511).
  """
  _checks.require_floating(logits, "poly_loss_cross_entropy", "logits")
  _checks.require_floating(labels, "poly_loss_cross_entropy", "labels")
  probs = jax.nn.softmax(logits, axis=axis, where=where)
  one_minus_pt = jnp.sum(labels * (1 - probs), axis=axis, where=where)
  return (softmax_cross_entropy(logits, labels, axis=axis, where=where)
          + epsilon * one_minus_pt)


def sigmoid_focal_loss(logits, labels, *, alpha=None, gamma=2.0):
  """Sigmoid cross-entropy down-weighted on well-classified examples by
  ``(1 - p_t) ** gamma`` (computed in log space).

  Args:
    logits: the logits (floating).
    labels: targets in [0, 1] (hard or soft), broadcastable to ``logits``.
    alpha: weight of the positive class in [0, 1] (None: unweighted).
    gamma: the focusing exponent.

  Returns:
    The elementwise loss, shaped as ``logits``.

  References:
    Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017
    (https://arxiv.org/abs/1708.02002).
  """
  _checks.require_floating(logits, "sigmoid_focal_loss", "logits")
  labels = jnp.astype(labels, logits.dtype)
  cross_entropy = sigmoid_binary_cross_entropy(logits, labels)
  log_p, log_q = jax.nn.log_sigmoid(logits), jax.nn.log_sigmoid(-logits)
  # log(1 - p_t) = log((1 - y) * p + y * (1 - p)).
  log_one_minus_pt = jax.scipy.special.logsumexp(
      jnp.stack([log_p, log_q], axis=-1), axis=-1,
      b=jnp.stack([1 - labels, labels], axis=-1))
  loss = cross_entropy * jnp.exp(gamma * log_one_minus_pt)
  if alpha is None:
    return loss
  return (alpha * labels + (1.0 - alpha) * (1.0 - labels)) * loss
