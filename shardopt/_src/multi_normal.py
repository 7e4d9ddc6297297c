"""A diagonal multivariate normal parametrized by its mean and log standard
deviation (optax's ``multi_normal``, the search distribution of evolution
strategies and perturbation-based gradient estimates)."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import jax.scipy.stats.norm

__all__ = [
    "MultiNormalDiagFromLogScale",
    "multi_normal",
]


class MultiNormalDiagFromLogScale:
  """``N(loc, diag(exp(log_scale))**2)`` over arrays shaped as
  ``broadcast(loc, log_scale)``."""

  def __init__(self, loc, log_scale):
    self._mean = jnp.asarray(loc)
    self._log_scale = jnp.asarray(log_scale)
    self._scale = jnp.exp(log_scale)
    self._param_shape = jax.lax.broadcast_shapes(self._mean.shape, self._scale.shape)

  def sample(self, shape: Sequence[int], key: jax.Array) -> jax.Array:
    """``shape`` independent draws, shaped ``(*shape, *param_shape)``."""
    draws = jax.random.normal(key, shape=tuple(shape) + self._param_shape)
    return draws * self._scale + self._mean

  def log_prob(self, x) -> jax.Array:
    """The log density of each draw in ``x`` (the parameter axes summed)."""
    log_densities = jax.scipy.stats.norm.logpdf(x, loc=self._mean, scale=self._scale)
    return jnp.sum(log_densities, axis=tuple(range(-len(self._param_shape), 0)))

  @property
  def log_scale(self) -> jax.Array:
    return self._log_scale

  @property
  def params(self) -> list[jax.Array]:
    """``[loc, log_scale]``."""
    return [self._mean, self._log_scale]


def multi_normal(loc, log_scale) -> MultiNormalDiagFromLogScale:
  """The diagonal normal distribution with mean ``loc`` and standard
  deviation ``exp(log_scale)``, elementwise.

  Args:
    loc: the mean (any shape).
    log_scale: the log of the standard deviation, broadcastable with ``loc``.

  Returns:
    A ``MultiNormalDiagFromLogScale`` with ``sample(shape, key)``,
    ``log_prob(x)``, ``log_scale`` and ``params`` (``[loc, log_scale]``).

  References:
    Wierstra et al., "Natural Evolution Strategies", JMLR 2014
    (https://jmlr.org/papers/v15/wierstra14a.html), Sec. 2 (a search
    distribution with a log-parametrized scale).
  """
  return MultiNormalDiagFromLogScale(loc=loc, log_scale=log_scale)
