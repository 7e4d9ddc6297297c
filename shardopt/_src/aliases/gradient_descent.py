"""Ready-made optimizers: optax's aliases as chains of shardopt transforms.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). ``adam`` and ``adamw``
also take ``nu_dtype``, the dtype of the second moment.
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.transforms import momentum as momentum_lib
from shardopt._src.transforms import noise
from shardopt._src.transforms import polyak
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine

__all__ = [
    "descend",
    "noisy_sgd",
    "polyak_sgd",
    "sgd",
]

MaskOrFn = base.MaskOrFn
_Extra = base.GradientTransformationExtraArgs


def sgd(
    learning_rate: base.ScalarOrSchedule,
    momentum: jax.typing.ArrayLike | None = None,
    nesterov: bool = False,
    accumulator_dtype: Any | None = None,
) -> _Extra:
  """Stochastic gradient descent, with optional (Nesterov) momentum.

  Without momentum the update is ``-learning_rate * g``. With ``momentum``
  (``beta``) a trace ``t = g + beta * t`` is kept and the update is
  ``-learning_rate * t`` (``-learning_rate * (g + beta * t)`` with
  ``nesterov``).

  Args:
    learning_rate: a scalar or a schedule of the step count.
    momentum: the trace's decay ``beta``; ``None`` (default) keeps no state.
    nesterov: whether to use Nesterov momentum (default False).
    accumulator_dtype: dtype of the momentum trace; ``None`` (default) uses
      the params' dtype.

  Returns:
    A ``GradientTransformationExtraArgs``: a ``chain`` of the optional
    ``trace`` and ``scale_by_learning_rate``.

  References:
    Robbins & Monro, "A Stochastic Approximation Method", Ann. Math.
    Statist. 1951 (https://doi.org/10.1214/aoms/1177729586); Sutskever et
    al., "On the importance of initialization and momentum in deep
    learning", ICML 2013
    (https://proceedings.mlr.press/v28/sutskever13.html).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.sgd(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.512, -1.024]
  """
  if momentum is None:
    direction = base.identity()
  else:
    direction = momentum_lib.trace(
        decay=momentum, nesterov=nesterov, accumulator_dtype=accumulator_dtype)
  return combine.chain(direction, scaling.scale_by_learning_rate(learning_rate))


def noisy_sgd(
    learning_rate: base.ScalarOrSchedule,
    eta: jax.typing.ArrayLike = 0.01,
    gamma: jax.typing.ArrayLike = 0.55,
    key: jax.typing.ArrayLike | None = None,
    *,
    seed: int | None = None,
) -> _Extra:
  """SGD on the gradient plus annealed Gaussian noise.

  At step ``t`` (from 0) the gradient gets noise of variance
  ``eta / (1 + t) ** gamma`` before it is scaled by ``-learning_rate``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    eta: the noise's initial variance (default 0.01).
    gamma: the variance's decay exponent (default 0.55).
    key: a ``jax.random`` key for the noise; ``None`` uses ``seed`` or, if
      that is also ``None``, key 0 with a warning.
    seed: optax's deprecated integer spelling of ``key`` (keyword only).

  Returns:
    A ``GradientTransformationExtraArgs``: ``add_noise`` then
    ``scale_by_learning_rate``.

  References:
    Neelakantan et al., "Adding Gradient Noise Improves Learning for Very
    Deep Networks", 2015 (https://arxiv.org/abs/1511.06807).
  """
  return combine.chain(
      noise.add_noise(eta, gamma, key, seed=seed),
      scaling.scale_by_learning_rate(learning_rate),
  )


def descend(direction: base.GradientTransformation, learning_rate,
             weight_decay=0.0, mask: MaskOrFn = None) -> _Extra:
  """The common tail of many aliases: direction, weight decay, learning rate.

  Args:
    direction: the transformation giving the descent direction.
    learning_rate: a scalar or a schedule of the step count.
    weight_decay: rate of ``weight_decay * params`` added to the direction
      (default 0.0).
    mask: which params decay (a tree of bools or a function of the params);
      ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: ``direction``, then
    ``add_decayed_weights``, then ``scale_by_learning_rate``.
  """
  return combine.chain(
      direction,
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      scaling.scale_by_learning_rate(learning_rate),
  )


def polyak_sgd(
    max_learning_rate: jax.typing.ArrayLike = 1.0,
    scaling: base.ScalarOrSchedule = 1.0,  # pylint: disable=redefined-outer-name
    f_min: jax.typing.ArrayLike = 0.0,
    eps: jax.typing.ArrayLike = 0.0,
    variant: str = "sps",
) -> _Extra:
  """SGD with the Polyak step size; ``update`` needs ``value=``.

  The gradient is first scaled, ``u = -scaling * g``; the update is
  ``min((f(x) - f_min) / (||u||^2 + eps), max_learning_rate) * u``
  (variant ``"sps"``; ``"sps+"`` clips ``f(x) - f_min`` at 0).

  Args:
    max_learning_rate: upper bound of the step size (default 1.0).
    scaling: a scalar or schedule multiplying the gradient before the Polyak
      step (default 1.0).
    f_min: a lower bound of the objective (default 0.0).
    eps: added to the squared gradient norm (default 0.0).
    variant: ``"sps"`` (default) or ``"sps+"``.

  Returns:
    A ``GradientTransformationExtraArgs`` whose ``update`` takes the
    objective's value at the params as ``value=``.

  References:
    Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive Learning
    Rate for Fast Convergence", AISTATS 2021
    (https://arxiv.org/abs/2002.10542); Berrada et al., "Training Neural
    Networks for and by Interpolation", ICML 2020
    (https://arxiv.org/abs/1906.05661) for ``max_learning_rate``.
  """
  return combine.chain(
      sgd(learning_rate=scaling),
      polyak.scale_by_polyak(max_learning_rate=max_learning_rate,
                                      f_min=f_min, eps=eps, variant=variant),
  )
