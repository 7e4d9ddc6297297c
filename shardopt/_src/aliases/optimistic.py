"""Ready-made optimizers built from the transforms of the optax catalogue
beyond Adam/SGD: each is a chain of a direction, optional weight decay and the
(negated) learning rate, with optax's names, signatures and defaults.
"""

from typing import Any
import warnings

import jax

from shardopt._src import base
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import optimistic
from shardopt._src.transforms import scaling
from shardopt._src.wrappers import combine

__all__ = [
    "optimistic_adam",
    "optimistic_adam_v2",
    "optimistic_gradient_descent",
]

_Extra = base.GradientTransformationExtraArgs


def optimistic_gradient_descent(
    learning_rate: base.ScalarOrSchedule,
    alpha: jax.typing.ArrayLike = 1.0,
    beta: jax.typing.ArrayLike = 1.0,
) -> _Extra:
  """Optimistic gradient descent, for min-max games.

  The update is ``-learning_rate * ((alpha + beta) * g_t - beta * g_{t-1})``:
  a gradient step corrected by the change of the gradient.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    alpha: weight of the current gradient (default 1.0).
    beta: weight of the gradient's change ``g_t - g_{t-1}`` (default 1.0).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_optimistic_gradient``
    then ``scale_by_learning_rate``.

  References:
    Mokhtari et al., "A Unified Analysis of Extra-gradient and Optimistic
    Gradient Methods for Saddle Point Problems", AISTATS 2020
    (https://arxiv.org/abs/1901.08511); Daskalakis et al., "Training GANs
    with Optimism", ICLR 2018 (https://arxiv.org/abs/1711.00141).
  """
  return combine.chain(
      optimistic.scale_by_optimistic_gradient(alpha=alpha, beta=beta),
      scaling.scale_by_learning_rate(learning_rate),
  )


def _adam_then_optimism(learning_rate, alpha, beta, b1, b2, eps, eps_root,
                        mu_dtype, nesterov) -> base.GradientTransformationExtraArgs:
  return combine.chain(
      adam_lib.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                             mu_dtype=mu_dtype, nesterov=nesterov),
      optimistic.scale_by_optimistic_gradient(alpha=alpha, beta=beta),
      scaling.scale_by_learning_rate(learning_rate),
  )


def optimistic_adam_v2(
    learning_rate: base.ScalarOrSchedule,
    *,
    alpha: jax.typing.ArrayLike = 1.0,
    beta: jax.typing.ArrayLike = 1.0,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    nesterov: bool = True,
) -> base.GradientTransformationExtraArgs:
  """Optimistic Adam, with a schedulable learning rate.

  With ``r_t`` Adam's (Nesterov) direction, the update is
  ``-learning_rate * ((alpha + beta) * r_t - beta * r_{t-1})``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    alpha: weight of the current direction (default 1.0).
    beta: weight of the direction's change (default 1.0).
    b1: decay of Adam's first moment (default 0.9).
    b2: decay of Adam's second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    nesterov: whether Adam uses Nesterov momentum (default True).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam``,
    ``scale_by_optimistic_gradient``, ``scale_by_learning_rate``.

  References:
    Daskalakis et al., "Training GANs with Optimism", ICLR 2018
    (https://arxiv.org/abs/1711.00141).
  """
  return _adam_then_optimism(learning_rate, alpha, beta, b1, b2, eps,
                             eps_root, mu_dtype, nesterov)


def optimistic_adam(
    learning_rate: jax.typing.ArrayLike,
    optimism: jax.typing.ArrayLike | None = None,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
) -> base.GradientTransformationExtraArgs:
  """Optimistic Adam with optax's first interface (a numeric learning rate);
  deprecated as in optax (a ``DeprecationWarning``): use ``optimistic_adam_v2``.

  With ``r_t`` Adam's (Nesterov) direction, the update is
  ``-(learning_rate * r_t + optimism * (r_t - r_{t-1}))``. For a schedule
  use ``optimistic_adam_v2``.

  Args:
    learning_rate: the step size, a number (a schedule raises ValueError).
    optimism: weight of the direction's change; ``None`` (default) uses
      ``learning_rate``.
    b1: decay of Adam's first moment (default 0.9).
    b2: decay of Adam's second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    nesterov: whether Adam uses Nesterov momentum (default True).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam``,
    ``scale_by_optimistic_gradient``, ``scale_by_learning_rate``.

  Raises:
    ValueError: if ``learning_rate`` is a schedule.

  References:
    Daskalakis et al., "Training GANs with Optimism", ICLR 2018
    (https://arxiv.org/abs/1711.00141).
  """
  warnings.warn("`optimistic_adam` is deprecated (as in optax), please use"
                " `optimistic_adam_v2` instead.", DeprecationWarning, stacklevel=2)
  if callable(learning_rate):
    raise ValueError(
        "optimistic_adam: learning_rate must be a number, not a schedule; use"
        " optimistic_adam_v2(learning_rate=schedule, alpha=..., beta=...)")
  optimism = learning_rate if optimism is None else optimism
  return _adam_then_optimism(1.0, learning_rate, optimism, b1, b2, eps,
                             eps_root, mu_dtype, nesterov)
