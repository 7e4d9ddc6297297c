"""Differentially private aggregation of per-example gradients (DP-SGD).

Same names, signatures, defaults, state and numbers as ``optax.contrib``'s
``differentially_private_aggregate`` and ``dpsgd`` (0.2.8). The per-example
clipping (``per_example_global_norm_clip``) reduces the batch axis by a
contraction, so a batch sharded over a data axis costs one all-reduce.
"""

from typing import NamedTuple
import warnings

import jax

from shardopt._src import base
from shardopt._src.transforms import scaling
from shardopt._src.transforms.momentum import trace as _trace
from shardopt._src.transforms.noise import _as_key
from shardopt._src.transforms.per_example_clipping import per_example_global_norm_clip
from shardopt._src.wrappers import combine

__all__ = [
    "DifferentiallyPrivateAggregateState",
    "differentially_private_aggregate",
    "dpsgd",
]


class DifferentiallyPrivateAggregateState(NamedTuple):
  """The random key of the next step's noise."""

  rng_key: jax.Array


def _initial_key(key, seed) -> jax.Array:
  if seed is not None:
    warnings.warn('"seed" is deprecated and will be removed in optax 0.2.7, '
                  'use "key".', DeprecationWarning, stacklevel=3)
    if key is not None:
      raise ValueError("give key or seed (deprecated), not both")
    key = jax.random.key(seed)
  if key is None:
    warnings.warn("Specifying a key will be required in optax 0.2.7.",
                  stacklevel=3)
    key = jax.random.key(0)
  return _as_key(key)


def differentially_private_aggregate(
    l2_norm_clip: jax.typing.ArrayLike,
    noise_multiplier: jax.typing.ArrayLike,
    key: jax.Array | int | None = None,
    *,
    seed: int | None = None,
) -> base.GradientTransformation:
  """Clips each example's gradients to ``l2_norm_clip`` (global norm), sums
  them, adds Gaussian noise of std ``l2_norm_clip * noise_multiplier`` per
  leaf and divides by the batch size.

  The updates it receives are per-example gradients: every leaf has the
  batch on axis 0 (``jax.vmap(jax.grad(loss))``); it returns updates shaped
  like the params. Put it first in a chain; ``MultiSteps``/``apply_every``
  would aggregate differently.

  Args:
    l2_norm_clip: the largest global norm an example keeps.
    noise_multiplier: noise std over ``l2_norm_clip``.
    key: PRNG key or int seed of the noise.
    seed: deprecated, use ``key``.

  Returns:
    A ``GradientTransformation`` whose state is a
    ``DifferentiallyPrivateAggregateState``.

  References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016
    (https://arxiv.org/abs/1607.00133).
  """
  initial_key = _initial_key(key, seed)
  noise_std = l2_norm_clip * noise_multiplier

  def init_fn(params):
    del params
    return DifferentiallyPrivateAggregateState(rng_key=initial_key)

  def update_fn(updates, state, params=None):
    del params
    leaves, treedef = jax.tree.flatten(updates)
    clipped, _ = per_example_global_norm_clip(leaves, l2_norm_clip)
    batch = leaves[0].shape[0]
    new_key, *keys = jax.random.split(state.rng_key, len(leaves) + 1)
    noised = [(g + noise_std * jax.random.normal(k, g.shape, g.dtype)) / batch
              for g, k in zip(clipped, keys)]
    return (jax.tree.unflatten(treedef, noised),
            DifferentiallyPrivateAggregateState(rng_key=new_key))

  return base.GradientTransformation(init_fn, update_fn)


def dpsgd(
    learning_rate: base.ScalarOrSchedule,
    l2_norm_clip: jax.typing.ArrayLike,
    noise_multiplier: jax.typing.ArrayLike,
    seed: int,
    momentum: jax.typing.ArrayLike | None = None,
    nesterov: bool = False,
) -> base.GradientTransformation:
  """DP-SGD: ``differentially_private_aggregate``, optional momentum, and
  the learning rate. Its updates are per-example gradients (batch on axis
  0).

  Args:
    learning_rate: a scalar or a schedule of the step count.
    l2_norm_clip: the largest global norm an example keeps.
    noise_multiplier: noise std over ``l2_norm_clip``.
    seed: seed of the noise.
    momentum: momentum decay, or None for none.
    nesterov: Nesterov momentum.

  Returns:
    A ``GradientTransformation`` (a chain).

  References:
    Abadi et al., "Deep Learning with Differential Privacy", CCS 2016
    (https://arxiv.org/abs/1607.00133).
  """
  return combine.chain(
      differentially_private_aggregate(l2_norm_clip=l2_norm_clip,
                                       noise_multiplier=noise_multiplier,
                                       seed=seed),
      (base.identity() if momentum is None
       else _trace(decay=momentum, nesterov=nesterov)),
      scaling.scale_by_learning_rate(learning_rate))

