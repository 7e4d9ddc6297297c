"""Smoothing by random perturbations (optax's ``optax.perturbations``).

``make_perturbed_fun(f)`` is a Monte-Carlo estimate of
``f_sigma(x) = E_z f(x + sigma z)``: its values and, through autodiff, its
derivatives of any order are unbiased estimates of ``f_sigma``'s, computed
from values of ``f`` alone (``f`` need not be differentiable). Derivatives
come from the score function, written as DiCE's "magic box" so that plain
``jax.grad`` finds them. Given the same key, the samples are optax's.
"""

from collections.abc import Callable
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp

from shardopt._src.tree_dtypes_random import tree_random_like
from shardopt._src.tree_math import tree_add_scale
from shardopt._src.tree_math import tree_scale
from shardopt._src.tree_reductions import tree_sum

__all__ = ["Gumbel", "make_perturbed_fun", "Normal"]


class _Noise:
  """A noise distribution for ``make_perturbed_fun``: ``_draw`` samples it
  (a ``jax.random`` sampler), ``log_prob`` is its log-density."""

  _draw = None

  def sample(self, key: jax.typing.ArrayLike, sample_shape: tuple[int, ...] = (),
             dtype: jax.typing.DTypeLike = float) -> jax.Array:
    """Draws samples.

    Args:
      key: a PRNG key.
      sample_shape: the samples' shape.
      dtype: their dtype.

    Returns:
      An array of ``sample_shape`` and ``dtype``.
    """
    return self._draw(key, sample_shape, dtype)


class Normal(_Noise):
  """The standard normal distribution, as a noise for
  ``make_perturbed_fun``."""

  _draw = staticmethod(jax.random.normal)

  def log_prob(self, inputs: jax.Array) -> jax.Array:
    """The log-density up to a constant, ``-x**2 / 2``.

    Args:
      inputs: the points.

    Returns:
      An array of ``inputs``' shape.
    """
    return -0.5 * inputs**2


class Gumbel(_Noise):
  """The standard Gumbel distribution, as a noise for
  ``make_perturbed_fun`` (its default)."""

  _draw = staticmethod(jax.random.gumbel)

  def log_prob(self, inputs: jax.Array) -> jax.Array:
    """The log-density, ``-x - exp(-x)``.

    Args:
      inputs: the points.

    Returns:
      An array of ``inputs``' shape.
    """
    return -inputs - jnp.exp(-inputs)


def _magic_box(log_prob: jax.Array) -> jax.Array:
  """1 in value; its derivative is the derivative of ``log_prob`` (times 1),
  to any order (Foerster et al., 2018)."""
  return jnp.exp(log_prob - lax.stop_gradient(log_prob))


def _one_sample(fun, sigma, noise, key, x, baseline):
  """``f(x + sigma z)`` for one draw ``z``, weighted by the magic box of
  ``log p(z)``, with ``z`` written as a function of ``x`` so that the
  weight's derivative is the score; less the baseline's share."""
  z = tree_random_like(key, x, sampler=noise.sample)
  perturbed = lax.stop_gradient(jax.tree.map(lambda xi, zi: xi + sigma * zi, x, z))
  z_of_x = jax.tree.map(lambda xi, yi: (yi - xi) / sigma, x, perturbed)
  weight = _magic_box(tree_sum(jax.tree.map(noise.log_prob, z_of_x)))
  out = tree_scale(weight, fun(perturbed))
  if baseline is not None:
    out = tree_add_scale(out, 1 - weight, baseline)
  return out


def make_perturbed_fun(
    fun: Callable[[Any], Any],
    num_samples: int = 1000,
    sigma: jax.typing.ArrayLike = 0.1,
    noise=Gumbel(),
    use_baseline=True,
) -> Callable[[jax.Array, Any], Any]:
  r"""A stochastic, differentiable smoothing of ``fun``:
  ``f_sigma(x) = E_{z ~ noise} fun(x + sigma z)``, estimated from
  ``num_samples`` draws.

  The returned function's values and autodiff derivatives (any order) are
  unbiased estimates of ``f_sigma``'s; only values of ``fun`` are used.

  Args:
    fun: a function from a pytree of arrays to a pytree of arrays.
    num_samples: the number of perturbations averaged over.
    sigma: the perturbations' scale.
    noise: the perturbations' distribution: an object with ``sample(key,
      sample_shape, dtype)`` and ``log_prob(inputs)``, e.g. ``Gumbel()``
      (the default) or ``Normal()``.
    use_baseline: subtract ``fun`` at the unperturbed input inside the
      derivative estimates (variance reduction; the values are unchanged).

  Returns:
    ``perturbed(key, x)``: ``fun``'s signature with a leading PRNG key.

  References:
    Berthet et al., `Learning with Differentiable Perturbed Optimizers
    <https://arxiv.org/abs/2002.08676>`_, NeurIPS 2020

    Foerster et al., `DiCE: The Infinitely Differentiable Monte Carlo
    Estimator <https://arxiv.org/abs/1802.05098>`_, ICML 2018
  """

  def perturbed(key: jax.Array, x: Any) -> Any:
    baseline = fun(lax.stop_gradient(x)) if use_baseline else None
    keys = jax.random.split(key, num_samples)
    samples = jax.vmap(lambda k: _one_sample(fun, sigma, noise, k, x, baseline))(keys)
    return jax.tree.map(lambda s: jnp.mean(s, axis=0), samples)

  return perturbed
