"""Label smoothing."""

import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = ["smooth_labels"]


def smooth_labels(labels, alpha, *, axis: int | tuple[int, ...] | None = -1,
                  where=None):
  """Mixes one-hot ``labels`` with the uniform distribution:
  ``(1 - alpha) * labels + alpha / num_classes``.

  Args:
    labels: one-hot (or soft) labels (floating).
    alpha: the smoothing weight.
    axis: the class axis or axes.
    where: a boolean mask of the classes that count; the uniform part is
      spread over those only.

  Returns:
    The smoothed labels, shaped as ``labels``.

  References:
    Szegedy et al., "Rethinking the Inception Architecture for Computer
    Vision", CVPR 2016 (https://arxiv.org/abs/1512.00567), Sec. 7; Müller et
    al., "When Does Label Smoothing Help?", NeurIPS 2019
    (https://arxiv.org/abs/1906.02629).
  """
  _checks.require_floating(labels, "smooth_labels", "labels")
  if where is None:
    num_classes = jnp.size(labels, axis)
  else:
    num_classes = jnp.sum(where, axis, keepdims=True)
  return (1.0 - alpha) * labels + alpha / num_classes
