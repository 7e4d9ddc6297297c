"""Low-precision optimizer state for any transformation.

``low_precision_state(tx, jnp.bfloat16)`` stores every floating state leaf of
``tx`` (moments, accumulators, factored statistics, covers) in ``dtype`` and
computes each update in the dtype ``tx`` would have used, so bfloat16 halves
optimizer memory. Integer leaves (counters) and PRNG keys are untouched.

Accuracy: bfloat16 keeps 8 significant bits, so an average that moves by less
than 1/256 of its value per step (a second moment with ``b2 = 0.999``) can
stall; first moments (``b1 = 0.9``) are well represented. Measured on an MLP
regression trained to a loss near 1e-3 (``python -m benchmarks.low_precision``,
``benchmarks/results/low_precision.md``), final loss against float32 state:
SGD momentum, RMSProp, Adafactor and Lion within 0.5%; Adam +10% with a
bfloat16 first moment only, +34% to +55% with both moments in bfloat16; SM3
-9%. Keep Adam's second moment in float32 when the last digits matter.
"""

import jax
import jax.numpy as jnp

from shardopt._src import base

__all__ = [
    "low_precision_state",
]


def _is_float_array(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _cast_floats(state, dtype):
  return jax.tree.map(lambda x: x.astype(dtype) if _is_float_array(x) else x, state)


def _cast_like(state, template):
  return jax.tree.map(
      lambda x, t: x.astype(t.dtype) if _is_float_array(x) else x, state, template
  )


def low_precision_state(
    inner: base.GradientTransformation, dtype=jnp.bfloat16
) -> base.GradientTransformationExtraArgs:
  """Stores the floating state of ``inner`` in ``dtype`` between steps.

  Each update casts the state up to the dtype ``inner`` built it in, runs
  ``inner`` and rounds the new floating state leaves down to ``dtype``.

  Args:
    inner: any transformation (shardopt's or optax's).
    dtype: storage dtype of floating state leaves (default
      ``jnp.bfloat16``).

  Returns:
    A ``GradientTransformationExtraArgs`` with ``inner``'s updates (up to
    the rounding of its state) whose floating state leaves have dtype
    ``dtype``.

  References:
    Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", 2019
    (https://arxiv.org/abs/1905.12322).
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    return _cast_floats(inner.init(params), dtype)

  def update_fn(updates, state, params=None, **extra_args):
    full_precision = jax.eval_shape(inner.init, updates)
    state = _cast_like(state, full_precision)
    updates, state = inner.update(updates, state, params, **extra_args)
    return updates, _cast_floats(state, dtype)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
