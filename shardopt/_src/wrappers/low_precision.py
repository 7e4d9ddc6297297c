"""Low-precision optimizer state for any transformation.

``low_precision_state(tx, jnp.bfloat16)`` stores the moments of ``tx``'s
state in ``dtype`` and computes each update in the dtype ``tx`` would have
used, so bfloat16 halves the memory of its moments. The moments are the
floating leaves that derive from a param (the owner each leaf has by
``shardopt._src.ownership``'s stand-in trace) below a field its state class
declares a moment (``shardopt._src.moments``: the declaration
``quantized_state`` reads; Adafactor's row and column statistics and SM3's
covers included). Every other leaf stays as ``tx`` builds it:
- iterates and copies of the params (schedule-free's ``z``, DoG's, Prodigy's
  and Mechanic's initial params, COCOB's particles), distances, quasi-Newton
  memory and preconditioner statistics, whose rounding the update amplifies
  (DoG's distance from its initial params, rounded at the params' own scale,
  set its step size; schedule-free's params, which average ``z``, moved at a
  learning rate of 0);
- gradient accumulators and previous gradients, and the fields a class
  declares kept (centred RMSProp's averages, SOAP's first moment);
- integer counters, PRNG keys, and floating hyperparameters and scalar
  statistics (``inject_hyperparams``' hyperparameters, schedule-free's ``b1``
  and weight sum), which bfloat16 would change (``b2 = 0.999`` is 1.0 there:
  Adam's bias correction then divides 0 by 0).

Accuracy: bfloat16 keeps 8 significant bits, so an average that moves by less
than 1/256 of its value per step (a second moment with ``b2 = 0.999``) can
stall; first moments (``b1 = 0.9``) are well represented. Measured on an MLP
regression trained to a loss near 1e-3 (``python -m benchmarks.low_precision``,
``benchmarks/results/low_precision.md``), final loss against float32 state:
SGD momentum, RMSProp, Adafactor and Lion within 0.6%; Adam +10% with a
bfloat16 first moment only, +34% to +55% with both moments in bfloat16; SM3
-9%. Keep Adam's second moment in float32 when the last digits matter.
"""

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import ownership

__all__ = [
    "low_precision_state",
]


def _is_float_array(x) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _stored_low(init, params, state) -> list[bool]:
  """Per leaf of ``state`` (``init``'s, from ``params``): whether it is stored in the low
  dtype, a floating leaf of a param below a field declared a moment."""
  owners = ownership.state_owners(init, params, state)
  kinds = moments.leaf_kinds(state, params)
  return [_is_float_array(x) and owner is not None and kind.kind is not None
          for x, owner, kind in zip(jax.tree.leaves(state), owners, kinds)]


def _cast_where(state, low: list[bool], dtype):
  leaves, treedef = jax.tree.flatten(state)
  return jax.tree.unflatten(treedef, [x.astype(dtype) if cast else x
                                      for x, cast in zip(leaves, low)])


def _cast_like(state, template):
  return jax.tree.map(
      lambda x, t: x.astype(t.dtype) if _is_float_array(x) else x, state, template
  )


def low_precision_state(
    inner: base.GradientTransformation, dtype=jnp.bfloat16
) -> base.GradientTransformationExtraArgs:
  """Stores the moments of ``inner``'s state in ``dtype`` between steps.

  Each update casts the state up to the dtype ``inner`` built it in, runs
  ``inner`` and rounds the new moments down to ``dtype`` (the other leaves stay
  as ``inner`` built them: see the module docstring).

  Args:
    inner: any transformation (shardopt's or optax's).
    dtype: storage dtype of floating state leaves (default
      ``jnp.bfloat16``).

  Returns:
    A ``GradientTransformationExtraArgs`` with ``inner``'s updates (up to
    the rounding of its moments) whose moments have dtype ``dtype``.

  References:
    Kalamkar et al., "A Study of BFLOAT16 for Deep Learning Training", 2019
    (https://arxiv.org/abs/1905.12322).
  """
  inner = base.with_extra_args_support(inner)

  def init_fn(params):
    state = inner.init(params)
    return _cast_where(state, _stored_low(inner.init, params, state), dtype)

  def update_fn(updates, state, params=None, **extra_args):
    full_precision = jax.eval_shape(inner.init, updates)
    low = _stored_low(inner.init, updates, full_precision)
    state = _cast_like(state, full_precision)
    updates, state = inner.update(updates, state, params, **extra_args)
    return updates, _cast_where(state, low, dtype)

  return base.GradientTransformationExtraArgs(init_fn, update_fn)
