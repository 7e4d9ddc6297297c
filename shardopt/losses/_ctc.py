"""Connectionist temporal classification (CTC) loss.

The forward (alpha) recursion in log space, split into two tables per time
step: ``phi[n]``, the log-probability of having emitted the first ``n``
labels and being in a blank, and ``emit[n]``, that of having just emitted
label ``n`` (0-based). A repeated label must pass through a blank.
"""

import jax
import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = ["ctc_loss", "ctc_loss_with_forward_probs"]


def _check_inputs(logits, logit_paddings, labels, label_paddings) -> None:
  name = "ctc_loss"
  _checks.require_rank(logits, 3, name, "logits")
  _checks.require_rank(labels, 2, name, "labels")
  _checks.require_same_shape(labels, label_paddings, name,
                             "labels and label_paddings")
  _checks.require_same_shape(logits[..., 0], logit_paddings, name,
                             "logits[..., 0] and logit_paddings")
  if labels.shape[0] != logits.shape[0]:
    raise ValueError(f"{name}: labels must have batch size {logits.shape[0]}"
                     f" (that of logits), got {labels.shape[0]}")


def ctc_loss_with_forward_probs(logits, logit_paddings, labels, label_paddings,
                                *, blank_id: int = 0, log_epsilon=-1e5):
  """The CTC loss and the forward log-probabilities behind it.

  Args:
    logits: ``[batch, time, num_classes]`` unnormalised log-probabilities.
    logit_paddings: ``[batch, time]``, 1.0 at padded frames.
    labels: ``[batch, max_label_length]`` integer labels.
    label_paddings: ``[batch, max_label_length]``, 1.0 at padded labels.
    blank_id: the class of the blank.
    log_epsilon: the log-probability standing for "impossible".

  Returns:
    ``(loss, log_alpha_phi, log_alpha_emit)``: the negative log-likelihood
    per sequence ``[batch]``, and the forward tables
    ``[time, batch, max_label_length + 1]`` (in a blank after ``n`` labels)
    and ``[time, batch, max_label_length]`` (just emitted label ``n``).

  References:
    Graves et al., "Connectionist Temporal Classification: Labelling
    Unsegmented Sequence Data with Recurrent Neural Networks", ICML 2006
    (https://dl.acm.org/doi/abs/10.1145/1143844.1143891).
  """
  _check_inputs(logits, logit_paddings, labels, label_paddings)
  batch, _, num_classes = logits.shape
  max_len = labels.shape[1]
  log_probs = jax.nn.log_softmax(logits)
  label_lengths = max_len - jnp.sum(label_paddings, axis=1).astype(jnp.int32)
  repeat = jnp.pad((labels[:, :-1] == labels[:, 1:]).astype(jnp.float32),
                   ((0, 0), (0, 1)))
  blank = jnp.transpose(log_probs[:, :, blank_id:blank_id + 1], (1, 0, 2))
  emit = jnp.transpose(
      jnp.einsum("btk,bnk->btn", log_probs,
                 jax.nn.one_hot(labels, num_classes=num_classes)), (1, 0, 2))

  def close_emissions(phi, score):
    """phi[n + 1] += exp(score[n]): finishing label n into a blank."""
    return jnp.concatenate([phi[:, :1], jnp.logaddexp(phi[:, 1:], score)],
                           axis=-1)

  def step(carry, frame):
    prev_phi, prev_emit = carry
    emit_t, blank_t, pad = frame
    phi = close_emissions(prev_phi, prev_emit + log_epsilon * repeat)
    next_emit = jnp.logaddexp(phi[:, :-1] + emit_t, prev_emit + emit_t)
    next_phi = close_emissions(phi + blank_t,
                               prev_emit + blank_t + log_epsilon * (1.0 - repeat))
    pad = pad.reshape((batch, 1))
    next_emit = pad * prev_emit + (1.0 - pad) * next_emit
    next_phi = pad * prev_phi + (1.0 - pad) * next_phi
    return (next_phi, next_emit), (next_phi, next_emit)

  phi0 = (jnp.ones((batch, max_len + 1)) * log_epsilon).at[:, 0].set(0.0)
  emit0 = jnp.ones((batch, max_len)) * log_epsilon
  _, (log_alpha_phi, log_alpha_emit) = jax.lax.scan(
      step, (phi0, emit0), (emit, blank, logit_paddings.transpose((1, 0))))
  last_phi = close_emissions(log_alpha_phi[-1], log_alpha_emit[-1])
  log_alpha_phi = log_alpha_phi.at[-1].set(last_phi)
  at_length = jax.nn.one_hot(label_lengths, num_classes=max_len + 1)
  loss = -jnp.einsum("bn,bn->b", last_phi, at_length)
  return loss, log_alpha_phi, log_alpha_emit


def ctc_loss(logits, logit_paddings, labels, label_paddings, *,
             blank_id: int = 0, log_epsilon=-1e5):
  """The CTC loss: the negative log-likelihood of each label sequence
  summed over its alignments to the frames.

  Args:
    logits: ``[batch, time, num_classes]`` unnormalised log-probabilities.
    logit_paddings: ``[batch, time]``, 1.0 at padded frames.
    labels: ``[batch, max_label_length]`` integer labels.
    label_paddings: ``[batch, max_label_length]``, 1.0 at padded labels.
    blank_id: the class of the blank.
    log_epsilon: the log-probability standing for "impossible".

  Returns:
    The loss per sequence, ``[batch]``.

  References:
    Graves et al., "Connectionist Temporal Classification: Labelling
    Unsegmented Sequence Data with Recurrent Neural Networks", ICML 2006
    (https://dl.acm.org/doi/abs/10.1145/1143844.1143891).
  """
  loss, _, _ = ctc_loss_with_forward_probs(
      logits, logit_paddings, labels, label_paddings, blank_id=blank_id,
      log_epsilon=log_epsilon)
  return loss
