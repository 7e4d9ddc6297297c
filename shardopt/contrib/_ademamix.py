"""AdEMAMix (a fast and a slow EMA of the gradient) and its simplified form."""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.aliases.gradient_descent import descend
from shardopt._src.transforms.momentum import canonical_dtype

__all__ = [
    "ScaleByAdemamixState",
    "ScaleBySimplifiedAdEMAMixState",
    "ademamix",
    "scale_by_ademamix",
    "scale_by_simplified_ademamix",
    "simplified_ademamix",
]


@moments.declare_moments(m1=moments.SIGNED, m2=moments.SIGNED, nu=moments.NONNEGATIVE)
class ScaleByAdemamixState(NamedTuple):
  """Step counts (``count_m2`` drives ``b3``/``alpha`` schedules), the fast
  EMA ``m1``, the slow EMA ``m2`` and the second moment ``nu``."""

  count: jax.typing.ArrayLike
  count_m2: jax.typing.ArrayLike
  m1: base.Updates
  m2: base.Updates
  nu: base.Updates


def scale_by_ademamix(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    b3: base.ScalarOrSchedule = 0.9999,
    alpha: base.ScalarOrSchedule = 6.0,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
) -> base.GradientTransformation:
  """``(m1_hat + alpha * m2) / (sqrt(nu_hat + eps_root) + eps)``.

  ``m1`` (decay ``b1``) and ``nu`` (decay ``b2``) are Adam's moments, bias
  corrected; ``m2`` is a slow EMA (decay ``b3``) left uncorrected.

  Args:
    b1: decay of the fast EMA.
    b2: decay of the second moment.
    b3: decay of the slow EMA, a scalar or a schedule of ``count_m2``.
    alpha: weight of the slow EMA, a scalar or a schedule of ``count_m2``.
    eps: added to the denominator's root.
    eps_root: added to the second moment inside the root.
    mu_dtype: dtype of the moments (default: the params').

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdemamixState``,
    each EMA shaped and sharded like its param.

  References:
    Pagliardini et al., "The AdEMAMix Optimizer: Better, Faster, Older",
    2024 (https://arxiv.org/abs/2409.03137).
  """
  mu_dtype = canonical_dtype(mu_dtype)

  def init_fn(params):
    zeros = lambda: tree_math.tree_zeros_like(params, dtype=mu_dtype)
    return ScaleByAdemamixState(count=jnp.zeros([], jnp.int32),
                                count_m2=jnp.zeros([], jnp.int32),
                                m1=zeros(), m2=zeros(), nu=zeros())

  def update_fn(updates, state, params=None):
    del params
    b3_now = base.value_at(b3, state.count_m2)
    alpha_now = base.value_at(alpha, state.count_m2)
    m1 = tree_math.update_moment(updates, state.m1, b1, order=1)
    m2 = tree_math.update_moment(updates, state.m2, b3_now, order=1)
    nu = tree_math.update_moment_per_elem_norm(updates, state.nu, b2, order=2)
    count = numerics.safe_increment(state.count)
    m1_hat = tree_math.bias_correction(m1, b1, count)
    nu_hat = tree_math.bias_correction(nu, b2, count)
    updates = jax.tree.map(
        lambda fast, slow, v: (fast + alpha_now * slow)
        / (jnp.sqrt(v + eps_root) + eps), m1_hat, m2, nu_hat)
    return updates, ScaleByAdemamixState(
        count=count, count_m2=numerics.safe_increment(state.count_m2), m1=m1,
        m2=m2, nu=nu)

  return base.GradientTransformation(init_fn, update_fn)


def ademamix(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    b3: base.ScalarOrSchedule = 0.9999,
    alpha: base.ScalarOrSchedule = 5.0,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: jax.typing.ArrayLike = 0.0,
    mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """The AdEMAMix optimizer: ``scale_by_ademamix``, weight decay, learning
  rate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the fast EMA.
    b2: decay of the second moment.
    b3: decay of the slow EMA (scalar or schedule).
    alpha: weight of the slow EMA (scalar or schedule).
    eps: added to the denominator's root.
    eps_root: added to the second moment inside the root.
    mu_dtype: dtype of the moments.
    weight_decay: rate of ``weight_decay * params`` added before the learning
      rate.
    mask: which params decay (a tree of bools or a function of the params).

  Returns:
    A ``GradientTransformationExtraArgs``.

  References:
    Pagliardini et al., "The AdEMAMix Optimizer: Better, Faster, Older",
    2024 (https://arxiv.org/abs/2409.03137).
  """
  return descend(scale_by_ademamix(b1=b1, b2=b2, b3=b3, alpha=alpha, eps=eps,
                                   eps_root=eps_root, mu_dtype=mu_dtype),
                 learning_rate, weight_decay, mask)


# At 4 bits the update moved 41% off float state's in 5 steps, 4% with m and
# n at 8 (benchmarks/results/quantized_floors.md): the undamped sum keeps each
# step's rounding, and its steps, ~1/(1 - b1) times Adam's, amplify it.
@moments.declare_moments(m=moments.SIGNED, n=moments.NONNEGATIVE,
                         min_bits={"m": 8, "n": 8})
class ScaleBySimplifiedAdEMAMixState(NamedTuple):
  """The step count ``t``, the momentum sum ``m`` and the second moment
  ``n`` (8 bits at least under ``quantized_state``)."""

  t: jax.typing.ArrayLike
  m: base.Updates
  n: base.Updates


def scale_by_simplified_ademamix(
    b1: jax.typing.ArrayLike = 0.99,
    b2: jax.typing.ArrayLike = 0.95,
    alpha: base.ScalarOrSchedule = 0.0,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
) -> base.GradientTransformation:
  """``(m + alpha * g) / (sqrt(n_hat + eps_root) + eps)`` with the
  undamped momentum ``m = b1 * m + g`` and Adam's second moment ``n``.

  Args:
    b1: decay of the momentum sum.
    b2: decay of the second moment (bias corrected).
    alpha: weight of the current gradient, a scalar or a schedule of ``t``.
    eps: added to the denominator's root.
    eps_root: added to the second moment inside the root.

  Returns:
    A ``GradientTransformation`` whose state is a
    ``ScaleBySimplifiedAdEMAMixState``.

  References:
    Morwani et al., "Connections between Schedule-Free Optimizers, AdEMAMix,
    and Accelerated SGD Variants", 2025 (https://arxiv.org/abs/2502.02431).
  """

  def init_fn(params):
    return ScaleBySimplifiedAdEMAMixState(
        t=jnp.array(0, jnp.int32), m=tree_math.tree_zeros_like(params),
        n=tree_math.tree_zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    alpha_now = base.value_at(alpha, state.t)
    m = tree_math.tree_add_scale(updates, b1, state.m)
    squares = tree_math.tree_mul(updates, updates)
    # n = squares + b2 * (n - squares): an EMA written as a lerp.
    n = tree_math.tree_add_scale(squares, b2,
                                 tree_math.tree_sub(state.n, squares))
    t = numerics.safe_increment(state.t)
    n_hat = tree_math.bias_correction(n, b2, t)
    numerator = tree_math.tree_add_scale(m, alpha_now, updates)
    denominator = jax.tree.map(lambda v: jnp.sqrt(v + eps_root) + eps, n_hat)
    return (tree_math.tree_div(numerator, denominator),
            ScaleBySimplifiedAdEMAMixState(t=t, m=m, n=n))

  return base.GradientTransformation(init_fn, update_fn)


def simplified_ademamix(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.99,
    b2: jax.typing.ArrayLike = 0.95,
    alpha: base.ScalarOrSchedule = 0.0,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    weight_decay: jax.typing.ArrayLike = 0.0,
    mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """Simplified AdEMAMix: ``scale_by_simplified_ademamix``, weight decay,
  learning rate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the momentum sum.
    b2: decay of the second moment.
    alpha: weight of the current gradient (scalar or schedule).
    eps: added to the denominator's root.
    eps_root: added to the second moment inside the root.
    weight_decay: rate of ``weight_decay * params`` added before the learning
      rate.
    mask: which params decay (a tree of bools or a function of the params).

  Returns:
    A ``GradientTransformationExtraArgs``.

  References:
    Morwani et al., "Connections between Schedule-Free Optimizers, AdEMAMix,
    and Accelerated SGD Variants", 2025 (https://arxiv.org/abs/2502.02431).
  """
  return descend(scale_by_simplified_ademamix(b1=b1, b2=b2, alpha=alpha,
                                              eps=eps, eps_root=eps_root),
                 learning_rate, weight_decay, mask)
