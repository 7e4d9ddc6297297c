"""Dice losses for segmentation."""

import jax
import jax.numpy as jnp

from shardopt.losses import _checks

__all__ = ["binary_dice_loss", "dice_loss", "multiclass_generalized_dice_loss"]

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss, reduction: str, axis=None):
  if reduction == "mean":
    return jnp.mean(loss, axis=axis)
  if reduction == "sum":
    return jnp.sum(loss, axis=axis)
  if reduction == "none":
    return loss
  raise ValueError(f"dice_loss: reduction={reduction!r}; use one of"
                   f" {_REDUCTIONS}")


def _check_probabilities(predictions) -> None:
  sums = jnp.sum(predictions, axis=-1)
  if not jnp.allclose(sums, 1.0, rtol=1e-5):
    raise ValueError(
        "dice_loss: with apply_softmax=False, predictions must be valid"
        " probability distributions summing to 1 over the class axis; their sums range"
        f" over [{jnp.min(sums):.6f}, {jnp.max(sums):.6f}]. Pass logits with"
        " apply_softmax=True instead")


def dice_loss(predictions, targets, *, class_weights=None, smooth=1.0,
              alpha=0.5, beta=0.5, apply_softmax: bool = True,
              reduction: str = "mean", ignore_background: bool = False,
              axis=None):
  """The (Tversky-generalised) Dice loss per example and class:
  ``1 - (I + smooth) / (I + alpha * FP + beta * FN + smooth)``.

  Args:
    predictions: logits (or probabilities) ``[batch, ..., num_classes]``;
      a missing class axis means one (binary) class.
    targets: one-hot (or soft) targets of the same shape.
    class_weights: ``[num_classes]`` weights of the per-class losses.
    smooth: added to numerator and denominator.
    alpha: weight of false positives (0.5: Dice).
    beta: weight of false negatives (0.5: Dice).
    apply_softmax: turn logits into probabilities (a sigmoid for one class).
    reduction: ``"mean"``, ``"sum"`` or ``"none"`` over the classes.
    ignore_background: drop class 0 (when there are several).
    axis: the spatial axes to sum over (default: all but the first and
      last).

  Returns:
    The loss per example (classes reduced as ``reduction`` says).

  References:
    Milletari et al., "V-Net: Fully Convolutional Neural Networks for
    Volumetric Medical Image Segmentation", 3DV 2016
    (https://arxiv.org/abs/1606.04797); Salehi et al., "Tversky loss
    function for image segmentation", 2017 (https://arxiv.org/abs/1706.05721).
  """
  if predictions.ndim == targets.ndim - 1:
    predictions = predictions[..., None]
  if targets.ndim == predictions.ndim - 1:
    targets = targets[..., None]
  _checks.require_same_shape(predictions, targets, "dice_loss",
                             "predictions and targets")
  if not apply_softmax:
    _check_probabilities(predictions)
  probs = predictions
  if apply_softmax:
    probs = (jax.nn.sigmoid(predictions) if predictions.shape[-1] == 1
             else jax.nn.softmax(predictions, axis=-1))
  axis = tuple(range(1, probs.ndim - 1)) if axis is None else axis
  intersection = jnp.sum(probs * targets, axis=axis)
  pred_sum = jnp.sum(probs, axis=axis)
  target_sum = jnp.sum(targets, axis=axis)
  # optax's expression order, so that gradients accumulate as optax's do.
  numerator = intersection + smooth
  denominator = (intersection + alpha * (pred_sum - intersection)
                 + beta * (target_sum - intersection) + smooth)
  loss = 1.0 - numerator / denominator
  if class_weights is not None:
    _checks.require_rank(class_weights, 1, "dice_loss", "class_weights")
    loss = loss * class_weights
  if ignore_background and probs.shape[-1] > 1:
    loss = loss[..., 1:]
  return _reduce(loss, reduction, axis=-1)


def multiclass_generalized_dice_loss(predictions, targets, *, smooth=1.0,
                                     apply_softmax: bool = True,
                                     ignore_background: bool = False):
  """The generalised Dice loss: per-class Dice weighted by the inverse
  squared class frequency (weights normalised to average 1), averaged.

  Args:
    predictions: logits (or probabilities) ``[batch, ..., num_classes]``.
    targets: one-hot targets of the same shape.
    smooth: added to numerator and denominator.
    apply_softmax: turn logits into probabilities.
    ignore_background: drop class 0.

  Returns:
    A scalar.

  References:
    Sudre et al., "Generalised Dice overlap as a deep learning loss function
    for highly unbalanced segmentations", DLMIA 2017
    (https://arxiv.org/abs/1707.03237).
  """
  _checks.require_same_shape(predictions, targets,
                             "multiclass_generalized_dice_loss",
                             "predictions and targets")
  frequencies = jnp.sum(targets, axis=tuple(range(targets.ndim - 1)))
  weights = 1.0 / (frequencies**2 + 1e-7)
  weights = weights / jnp.sum(weights) * len(weights)
  return jnp.mean(dice_loss(predictions, targets, class_weights=weights,
                            smooth=smooth, apply_softmax=apply_softmax,
                            reduction="none",
                            ignore_background=ignore_background))


def binary_dice_loss(predictions, targets, *, smooth=1.0,
                     apply_sigmoid: bool = True):
  """The Dice loss of one foreground class.

  Args:
    predictions: logits (or probabilities) ``[batch, ...]`` (a trailing
      class axis of size 1 is accepted).
    targets: binary targets of the same shape.
    smooth: added to numerator and denominator.
    apply_sigmoid: turn logits into probabilities.

  Returns:
    The loss per example.

  References:
    Milletari et al., "V-Net: Fully Convolutional Neural Networks for
    Volumetric Medical Image Segmentation", 3DV 2016
    (https://arxiv.org/abs/1606.04797).
  """
  if predictions.ndim == targets.ndim and predictions.shape[-1] != 1:
    predictions, targets = predictions[..., None], targets[..., None]
  return dice_loss(predictions, targets, smooth=smooth,
                   apply_softmax=apply_sigmoid, reduction="mean")
