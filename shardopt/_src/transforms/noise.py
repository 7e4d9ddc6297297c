"""Adding annealed Gaussian noise to the updates."""

from typing import NamedTuple
import warnings

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics

__all__ = [
    "AddNoiseState",
    "add_noise",
]


class AddNoiseState(NamedTuple):
  """The step count (for annealing) and the random key of the next step."""

  count: jax.Array  # int32 scalar
  rng_key: jax.Array


def _as_key(key_or_seed: jax.Array | int) -> jax.Array:
  """A typed PRNG key (a typed key is kept, an int seed goes to random.key)."""
  if isinstance(key_or_seed, jax.Array) and jnp.issubdtype(
      key_or_seed.dtype, jax.dtypes.prng_key
  ):
    return key_or_seed
  return jax.random.key(key_or_seed)


def _normal_like(key: jax.Array, updates: base.Updates) -> base.Updates:
  """Standard normal noise per leaf, one split key per leaf, leaf's sharding."""
  treedef = jax.tree.structure(updates)
  keys = jax.tree.unflatten(treedef, jax.random.split(key, treedef.num_leaves))
  return jax.tree.map(
      lambda u, k: jax.random.normal(
          k, u.shape, u.dtype, out_sharding=jax.typeof(u).sharding
      ),
      updates,
      keys,
  )


def add_noise(
    eta: jax.typing.ArrayLike,
    gamma: jax.typing.ArrayLike,
    key: jax.Array | int | None = None,
    *,
    seed: int | None = None,
) -> base.GradientTransformation:
  """Adds annealed Gaussian noise to the updates.

  At step ``t`` (from 1) each element gets noise of variance
  ``eta / t**gamma``; each leaf draws from its own split of the key and the
  noise has the update's sharding.

  Args:
    eta: the noise's initial variance.
    gamma: the variance's decay exponent.
    key: a ``jax.random`` key or an int seed; ``None`` (with no ``seed``)
      uses key 0 and warns.
    seed: optax's deprecated integer spelling of ``key`` (keyword only);
      passing both raises ValueError.

  Returns:
    A ``GradientTransformation`` whose state is an ``AddNoiseState`` (step
    count and the next key).

  References:
    Neelakantan et al., "Adding Gradient Noise Improves Learning for Very
    Deep Networks", 2015 (https://arxiv.org/abs/1511.06807).
  """
  if seed is not None:
    warnings.warn(
        'add_noise: "seed" is deprecated, pass key= instead.',
        DeprecationWarning,
    )
    if key is not None:
      raise ValueError("add_noise: pass either key or seed, not both.")
    key = seed
  if key is None:
    warnings.warn("add_noise: no key given, using key 0; pass key= explicitly.")
    key = 0

  def init_fn(params):
    del params
    return AddNoiseState(count=jnp.zeros([], jnp.int32), rng_key=_as_key(key))

  def update_fn(updates, state, params=None):
    del params
    count = numerics.safe_increment(state.count)
    std = jnp.sqrt(eta / count**gamma)
    next_key, sample_key = jax.random.split(state.rng_key)
    noise = _normal_like(sample_key, updates)
    updates = jax.tree.map(lambda u, n: u + std * n, updates, noise)
    return updates, AddNoiseState(count=count, rng_key=next_key)

  return base.GradientTransformation(init_fn, update_fn)
