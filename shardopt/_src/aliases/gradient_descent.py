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

  Reference: Sutskever et al., "On the importance of initialization and
  momentum in deep learning", ICML 2013.
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
  """SGD on gradients plus Gaussian noise of variance ``eta / (1 + t)**gamma``.

  ``seed`` is optax's deprecated spelling of ``key``.

  Reference: Neelakantan et al., "Adding Gradient Noise Improves Learning for
  Very Deep Networks", 2015 (https://arxiv.org/abs/1511.06807).
  """
  return combine.chain(
      noise.add_noise(eta, gamma, key, seed=seed),
      scaling.scale_by_learning_rate(learning_rate),
  )


def descend(direction: base.GradientTransformation, learning_rate,
             weight_decay=0.0, mask: MaskOrFn = None) -> _Extra:
  """direction, then ``+ weight_decay * params`` (masked), then ``* -lr``."""
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
  """SGD with Polyak's step size; ``update`` needs ``value=``.

  ``scaling`` (a scalar or schedule) multiplies the gradient before the
  Polyak step.

  Reference: Loizou et al., "Stochastic Polyak Step-size for SGD: An Adaptive
  Learning Rate for Fast Convergence", AISTATS 2021
  (https://arxiv.org/abs/2002.10542).
  """
  return combine.chain(
      sgd(learning_rate=scaling),
      polyak.scale_by_polyak(max_learning_rate=max_learning_rate,
                                      f_min=f_min, eps=eps, variant=variant),
  )
