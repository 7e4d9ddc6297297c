"""ACProp: AdaBelief's centred second moment, applied asynchronously."""

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms import adam_variants
from shardopt._src.aliases.gradient_descent import descend

__all__ = ["acprop", "scale_by_acprop"]


# optax keeps ACProp's state in AdaBelief's class, and so does this module:
# its state is a subclass of that class with the same name and fields, so
# ``isinstance``, the class name a checkpoint records and what
# ``tree_utils.tree_get`` matches are AdaBelief's, as in optax. The subclass
# declares only ``mu`` a moment and ``nu`` kept: ``quantized_state`` keeps
# ``nu`` in float and says why.
# A centred second moment approaches 0 where a gradient matches its average,
# and the next step's gradient is divided by its root. On the LM-shaped test
# params some elements fell below the 8-bit code's smallest entry (2**-31 of
# their block's largest), where the float update reached 3.4e4 against a
# median of 2.4: the updates moved 12.9% off float state's at 8 and 4 bits
# with nu quantized, 1.5% / 2.4% with nu in float
# (tests/test_quantized_state.py).
@moments.declare_moments(mu=moments.SIGNED, kept={
    "nu": "kept in float: a centred second moment the step divides by, below"
          " the codes' range where a gradient matches its average"})
class ScaleByBeliefState(adam_variants.ScaleByBeliefState):
  """AdaBelief's state as ACProp keeps it: step count, first moment ``mu``
  and the centred second moment ``nu`` (kept in float under
  ``quantized_state``)."""

  __slots__ = ()


def scale_by_acprop(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-16,
    eps_root: jax.typing.ArrayLike = 1e-16,
) -> base.GradientTransformation:
  """Divides the gradient by the root of the previous step's centred second
  moment (the variance of the prediction error ``g - m``).

  The denominator uses moments up to step ``t - 1`` and the numerator the
  gradient of step ``t`` (at the first step the denominator is 1).

  Args:
    b1: decay of the first moment ``m``.
    b2: decay of the second moment of the prediction error ``s``.
    eps: added to the denominator's root.
    eps_root: added to ``s`` at every step (keep it non-zero to
      differentiate through the update).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByBeliefState``
    (``nu`` holds ``s``), every moment shaped and sharded like its param.

  References:
    Zhuang et al., "Momentum Centering and Asynchronous Update for Adaptive
    Gradient Methods", NeurIPS 2021 (https://arxiv.org/abs/2110.05454).
  """

  def init_fn(params):
    return ScaleByBeliefState(count=jnp.zeros([], jnp.int32),
                              mu=tree_math.tree_zeros_like(params),
                              nu=tree_math.tree_zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    mu = tree_math.update_moment(updates, state.mu, b1, 1)
    error = tree_math.tree_sub(updates, state.mu)
    nu = tree_math.update_moment_per_elem_norm(error, state.nu, b2, 2)
    nu = jax.tree.map(lambda v: v + eps_root, nu)
    count = numerics.safe_increment(state.count)
    first = state.count == 0
    previous_nu = tree_math.bias_correction(
        state.nu, b2, jnp.where(first, count, state.count))
    previous_nu = jax.tree.map(lambda v: jnp.where(first, 1, v), previous_nu)
    updates = jax.tree.map(lambda g, v: g / (jnp.sqrt(v) + eps), updates,
                           previous_nu)
    return updates, ScaleByBeliefState(count=count, mu=mu, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)


def acprop(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-16,
    eps_root: jax.typing.ArrayLike = 1e-16,
    weight_decay: jax.typing.ArrayLike = 0.0,
    mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """The ACProp optimizer: ``scale_by_acprop``, weight decay, learning rate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment.
    b2: decay of the centred second moment.
    eps: added to the denominator's root.
    eps_root: added to the centred second moment at every step.
    weight_decay: rate of ``weight_decay * params`` added before the learning
      rate scales the step (so decay is multiplied by the learning rate).
    mask: which params decay (a tree of bools or a function of the params).

  Returns:
    A ``GradientTransformationExtraArgs``.

  References:
    Zhuang et al., "Momentum Centering and Asynchronous Update for Adaptive
    Gradient Methods", NeurIPS 2021 (https://arxiv.org/abs/2110.05454).
  """
  return descend(scale_by_acprop(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
                 learning_rate, weight_decay, mask)
