"""COCOB-Backprop: learning-rate-free steps from coin betting."""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import tree_math
from shardopt._src.transforms.constraints import require_params
from shardopt._src.transforms.scaling import scale_by_learning_rate
from shardopt._src.transforms.weight_decay import add_decayed_weights
from shardopt._src.wrappers.combine import chain

__all__ = ["COCOBState", "cocob", "scale_by_cocob"]


class COCOBState(NamedTuple):
  """Per coordinate: the starting params, the negated gradient sum, the
  largest gradient magnitude seen (``scale``), the sum of gradient
  magnitudes (``subgradients``) and the bettor's reward."""

  init_particles: base.Updates
  cumulative_gradients: base.Updates
  scale: base.Updates
  subgradients: base.Updates
  reward: base.Updates


def scale_by_cocob(alpha: jax.typing.ArrayLike = 100.0,
                   eps: jax.typing.ArrayLike = 1e-8
                   ) -> base.GradientTransformation:
  """Moves each param to ``p0 + C / (L * max(G + L, alpha * L)) * (L + R)``.

  ``C`` is the negated sum of gradients, ``L`` the largest gradient
  magnitude, ``G`` the sum of magnitudes and ``R`` the reward, all per
  coordinate (Algorithm 2 of the paper). The update is that point minus the
  current params, so ``update`` needs the params.

  Args:
    alpha: bounds the bet fraction early on (the paper's ``alpha``).
    eps: the initial ``L`` (avoids dividing by zero).

  Returns:
    A ``GradientTransformation`` whose state is a ``COCOBState``, every field
    shaped and sharded like its param.

  References:
    Orabona & Tommasi, "Training Deep Networks without Learning Rates Through
    Coin Betting", NeurIPS 2017 (https://arxiv.org/abs/1705.07795).
  """

  def init_fn(params):
    zeros = tree_math.tree_zeros_like(params)
    return COCOBState(
        init_particles=params, cumulative_gradients=zeros,
        scale=tree_math.tree_scale(eps, tree_math.tree_ones_like(params)),
        subgradients=zeros, reward=zeros)

  def update_fn(updates, state, params=None):
    require_params(params, "scale_by_cocob")
    scale = jax.tree.map(lambda m, g: jnp.maximum(m, jnp.abs(g)), state.scale,
                         updates)
    subgradients = jax.tree.map(lambda s, g: s + jnp.abs(g),
                                state.subgradients, updates)
    reward = jax.tree.map(lambda r, g, p, p0: jnp.maximum(r - g * (p - p0), 0),
                          state.reward, updates, params, state.init_particles)
    cumulative = tree_math.tree_sub(state.cumulative_gradients, updates)

    def step(p, p0, c, m, s, r):
      return -p + (p0 + c / (m * jnp.maximum(s + m, alpha * m)) * (m + r))

    new_updates = jax.tree.map(step, params, state.init_particles, cumulative,
                               scale, subgradients, reward)
    return new_updates, COCOBState(
        init_particles=state.init_particles, cumulative_gradients=cumulative,
        scale=scale, subgradients=subgradients, reward=reward)

  return base.GradientTransformation(init_fn, update_fn)


def cocob(
    learning_rate: base.ScalarOrSchedule = 1.0,
    alpha: jax.typing.ArrayLike = 100.0,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """COCOB: weight decay, the gradient scaled by ``+learning_rate``, then
  ``scale_by_cocob``.

  Args:
    learning_rate: scales the gradients fed to the bettor (1.0: none).
    alpha: bounds the bet fraction early on.
    eps: the initial largest-gradient estimate.
    weight_decay: rate of ``weight_decay * params`` added to the gradient.
    mask: which params decay (a tree of bools or a function of the params).

  Returns:
    A ``GradientTransformationExtraArgs``.

  References:
    Orabona & Tommasi, "Training Deep Networks without Learning Rates Through
    Coin Betting", NeurIPS 2017 (https://arxiv.org/abs/1705.07795).
  """
  return chain(add_decayed_weights(weight_decay, mask),
               scale_by_learning_rate(learning_rate, flip_sign=False),
               scale_by_cocob(alpha, eps))
