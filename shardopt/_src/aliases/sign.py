"""Ready-made sign-based optimizers (Lion, signSGD, Signum, Rprop) and those
whose step size comes from the objective (Polyak SGD, L-BFGS with a line
search), with optax's names, signatures and defaults.
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.aliases.gradient_descent import descend
from shardopt._src.base import MaskOrFn
from shardopt._src.transforms import momentum as momentum_lib
from shardopt._src.transforms import scaling
from shardopt._src.transforms import sign
from shardopt._src.wrappers import combine

__all__ = [
    "lion",
    "rprop",
    "sign_sgd",
    "signum",
]

_Extra = base.GradientTransformationExtraArgs


def lion(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.99,
    mu_dtype: Any | None = None,
    weight_decay: base.ScalarOrSchedule = 1e-3,
    mask: MaskOrFn = None,
) -> _Extra:
  """Lion: the sign of an interpolated momentum, with decoupled weight decay.

  The update is ``-learning_rate * (sign((1 - b1) * g + b1 * m) +
  weight_decay * p)``, then the momentum ``m = b2 * m + (1 - b2) * g``:
  each coordinate moves by the learning rate (plus the decay) or, where the
  interpolation is zero, not at all.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: interpolation weight of the momentum in the sign (default 0.9).
    b2: decay of the momentum (default 0.99).
    mu_dtype: dtype of the momentum; ``None`` (default) uses the params'
      dtype.
    weight_decay: a scalar or schedule, the decay rate (default 1e-3).
    mask: which params decay (a tree of bools or a function of the params);
      ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_lion``,
    ``add_decayed_weights``, ``scale_by_learning_rate``.

  References:
    Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS
    2023 (https://arxiv.org/abs/2302.06675).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.lion(learning_rate=0.1, weight_decay=0.0)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.7, -1.7]
  """
  return descend(sign.scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype),
                  learning_rate, weight_decay, mask)


def sign_sgd(learning_rate: base.ScalarOrSchedule) -> _Extra:
  """signSGD: steps along the sign of the gradient.

  The update is ``-learning_rate * sign(g)``.

  Args:
    learning_rate: a scalar or a schedule of the step count.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_sign`` then
    ``scale_by_learning_rate``.

  References:
    Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
    Problems", ICML 2018 (https://arxiv.org/abs/1802.04434).
  """
  return combine.chain(sign.scale_by_sign(),
                       scaling.scale_by_learning_rate(learning_rate))


def signum(
    learning_rate: base.ScalarOrSchedule,
    beta: jax.typing.ArrayLike = 0.9,
    accumulator_dtype: Any | None = None,
) -> _Extra:
  """Signum: the sign of an (undebiased) EMA of the gradients.

  ``m = beta * m + (1 - beta) * g``; the update is
  ``-learning_rate * sign(m)``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    beta: decay of the EMA (default 0.9).
    accumulator_dtype: dtype of the EMA; ``None`` (default) uses the
      params' dtype.

  Returns:
    A ``GradientTransformationExtraArgs``: ``ema``, ``scale_by_sign``,
    ``scale_by_learning_rate``.

  References:
    Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex
    Problems", ICML 2018 (https://arxiv.org/abs/1802.04434).
  """
  return combine.chain(
      momentum_lib.ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
      sign.scale_by_sign(),
      scaling.scale_by_learning_rate(learning_rate),
  )


def rprop(
    learning_rate: jax.typing.ArrayLike,
    eta_minus: jax.typing.ArrayLike = 0.5,
    eta_plus: jax.typing.ArrayLike = 1.2,
    min_step_size: jax.typing.ArrayLike = 1e-6,
    max_step_size: jax.typing.ArrayLike = 50.0,
) -> _Extra:
  """Rprop: per-coordinate step sizes adapted from the gradient's sign changes.

  Each coordinate's step size grows by ``eta_plus`` while its gradient keeps
  its sign and shrinks by ``eta_minus`` when the sign flips (that step is
  skipped), within ``[min_step_size, max_step_size]``. The update is
  ``-step_size * sign(g)`` of the previous step (zero at the first step),
  as optax 0.2.8 computes it.

  Args:
    learning_rate: the initial per-coordinate step size (a number).
    eta_minus: factor applied to the step size on a sign flip (default
      0.5).
    eta_plus: factor applied while the sign is kept (default 1.2).
    min_step_size: lower bound of the step sizes (default 1e-6).
    max_step_size: upper bound of the step sizes (default 50.0).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_rprop`` then
    ``scale(-1)``.

  References:
    Riedmiller & Braun, "A Direct Adaptive Method for Faster Backpropagation
    Learning: The RPROP Algorithm", ICNN 1993
    (https://doi.org/10.1109/ICNN.1993.298623).
  """
  return combine.chain(
      sign.scale_by_rprop(
          learning_rate=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus,
          min_step_size=min_step_size, max_step_size=max_step_size),
      scaling.scale(-1.0),
  )
