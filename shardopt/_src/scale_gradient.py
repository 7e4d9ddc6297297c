"""Scaling a value's gradient in the backward pass, leaving the forward pass
alone (to slow down or stop the learning of one part of a model).
"""

import jax

__all__ = [
    "scale_gradient",
]


@jax.custom_vjp
def _with_scaled_cotangent(inputs, scale):
  del scale  # read by the backward pass only
  return inputs


def _forward(inputs, scale):
  return inputs, scale


def _backward(scale, cotangents):
  return jax.tree.map(lambda c: c * scale, cotangents), None


_with_scaled_cotangent.defvjp(_forward, _backward)


def scale_gradient(inputs, scale: float):
  """``inputs`` unchanged, with the gradients flowing back through them scaled.

  A scale of 1 returns ``inputs`` as they are, a scale of 0 stops the
  gradient (``jax.lax.stop_gradient``).

  Args:
    inputs: a tree of arrays.
    scale: the factor applied to the gradient with respect to ``inputs``.

  Returns:
    ``inputs`` (same values), whose backward pass multiplies by ``scale``.
  """
  if scale == 1.0:
    return inputs
  if scale == 0.0:
    return jax.lax.stop_gradient(inputs)
  return _with_scaled_cotangent(inputs, scale)
