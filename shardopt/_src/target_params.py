"""Slow copies of the params: a Polyak (moving) average and a periodic target.

Both are pure functions of two param trees, applied leaf by leaf, so the copy
keeps the shapes and shardings of the params it follows.
"""

import jax
import jax.numpy as jnp

from shardopt._src import base

__all__ = [
    "incremental_update",
    "periodic_update",
]


def incremental_update(new_tensors: base.Params, old_tensors: base.Params,
                       step_size: jax.typing.ArrayLike) -> base.Params:
  """The moving average ``step_size * new + (1 - step_size) * old``, leaf by leaf.

  ``None`` leaves of ``new_tensors`` stay ``None``.

  Args:
    new_tensors: the latest values (e.g. the online network's params).
    old_tensors: the running average (e.g. the target network's params).
    step_size: the weight of the new values, in [0, 1].

  Returns:
    A tree like ``new_tensors`` with the averaged values.

  References:
    Polyak and Juditsky, "Acceleration of Stochastic Approximation by
    Averaging", SIAM J. Control Optim. 1992
    (https://epubs.siam.org/doi/10.1137/0330046).
  """

  def average(new, old):
    if new is None:
      return None
    return step_size * new + (1.0 - step_size) * old

  return jax.tree.map(average, new_tensors, old_tensors,
                      is_leaf=lambda x: x is None)


def periodic_update(new_tensors: base.Params, old_tensors: base.Params,
                    steps: jax.typing.ArrayLike,
                    update_period: jax.typing.ArrayLike) -> base.Params:
  """``new_tensors`` when ``steps`` is a multiple of ``update_period``, else ``old_tensors``.

  A target network refreshed every ``update_period`` steps.

  Args:
    new_tensors: the latest values (e.g. the online network's params).
    old_tensors: the values kept between refreshes.
    steps: the current step count.
    update_period: steps between two refreshes.

  Returns:
    A tree like ``new_tensors``.

  References:
    Mnih et al., "Human-level control through deep reinforcement learning",
    Nature 2015 (https://doi.org/10.1038/nature14236); Grill et al.,
    "Bootstrap Your Own Latent", NeurIPS 2020
    (https://arxiv.org/abs/2006.07733).
  """
  return jax.lax.cond(jnp.mod(steps, update_period) == 0,
                      lambda: new_tensors, lambda: old_tensors)
