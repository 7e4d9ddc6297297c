"""ADOPT: Adam that normalises by the previous second moment, then averages."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.transforms.adam import ScaleByAdamState
from shardopt._src.transforms.momentum import canonical_dtype
from shardopt._src.transforms.scaling import scale_by_learning_rate
from shardopt._src.wrappers.combine import chain

__all__ = ["adopt", "scale_by_adopt"]


def _quarter_power(count: jax.Array) -> jax.Array:
  return count**0.25


def scale_by_adopt(
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.9999,
    eps: jax.typing.ArrayLike = 1e-6,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[jax.Array], jax.Array] = _quarter_power,
) -> base.GradientTransformation:
  """Momentum of ``g / max(sqrt(nu_prev), eps)``: the gradient normalised by
  the second moment of the steps before it.

  At the first step only ``nu`` is initialised (``nu = g**2``) and the
  update is zero.

  Args:
    b1: decay of the momentum of normalised gradients.
    b2: decay of the second moment.
    eps: lower bound of the normalising root.
    mu_dtype: dtype of the momentum (default: the params').
    nesterov: use Nesterov momentum.
    use_clipping: clip the normalised gradient to
      ``[-clip_value_fn(count), clip_value_fn(count)]``.
    clip_value_fn: the clipping bound as a function of the step count
      (default ``count ** 0.25``, as in the paper).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByAdamState``, each
    moment shaped and sharded like its param.

  References:
    Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with
    the Optimal Rate", NeurIPS 2024 (https://arxiv.org/abs/2411.02853).
  """
  mu_dtype = canonical_dtype(mu_dtype)

  def init_fn(params):
    return ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                            mu=tree_math.tree_zeros_like(params, dtype=mu_dtype),
                            nu=tree_math.tree_zeros_like(params))

  def update_fn(updates, state, params=None):
    del params
    started = state.count > 0
    b1_now, b2_now = jnp.where(started, b1, 1), jnp.where(started, b2, 0)
    nu = tree_math.update_moment_per_elem_norm(updates, state.nu, b2_now, 2)
    normalised = jax.tree.map(
        lambda g, v: g / jnp.maximum(jnp.sqrt(v), eps), updates, state.nu)
    if use_clipping:
      bound = clip_value_fn(state.count)
      normalised = tree_math.tree_clip(normalised, -bound, bound)
    mu = tree_math.update_moment(normalised, state.mu, b1_now, 1)
    step = (tree_math.update_moment(normalised, mu, b1_now, 1) if nesterov
            else mu)
    return step, ScaleByAdamState(count=numerics.safe_increment(state.count),
                                  mu=tree_math.tree_cast(mu, mu_dtype), nu=nu)

  return base.GradientTransformation(init_fn, update_fn)


def adopt(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.9999,
    eps: jax.typing.ArrayLike = 1e-6,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
    use_clipping: bool = True,
    clip_value_fn: Callable[[jax.Array], jax.Array] = _quarter_power,
) -> base.GradientTransformationExtraArgs:
  """The ADOPT optimizer: ``scale_by_adopt`` then the learning rate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the momentum.
    b2: decay of the second moment.
    eps: lower bound of the normalising root.
    mu_dtype: dtype of the momentum.
    nesterov: use Nesterov momentum.
    use_clipping: clip the normalised gradient.
    clip_value_fn: the clipping bound as a function of the step count.

  Returns:
    A ``GradientTransformationExtraArgs``.

  References:
    Taniguchi et al., "ADOPT: Modified Adam Can Converge with Any beta2 with
    the Optimal Rate", NeurIPS 2024 (https://arxiv.org/abs/2411.02853).
  """
  return chain(scale_by_adopt(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype,
                              nesterov=nesterov, use_clipping=use_clipping,
                              clip_value_fn=clip_value_fn),
               scale_by_learning_rate(learning_rate))
