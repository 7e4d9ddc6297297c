"""Ready-made sign-based optimizers (Lion, signSGD, Signum, Rprop) and those
whose step size comes from the objective (Polyak SGD, L-BFGS with a line
search), with optax's names, signatures and defaults.
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.aliases.gradient_descent import descend
from shardopt._src.base import MaskOrFn
from shardopt._src.transforms import momentum
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

  Reference: Chen et al., "Symbolic Discovery of Optimization Algorithms",
  NeurIPS 2023 (https://arxiv.org/abs/2302.06675).
  """
  return descend(sign.scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype),
                  learning_rate, weight_decay, mask)


def sign_sgd(learning_rate: base.ScalarOrSchedule) -> _Extra:
  """signSGD: steps along the sign of the gradient.

  Reference: Bernstein et al., "signSGD: Compressed Optimisation for
  Non-Convex Problems", ICML 2018 (https://arxiv.org/abs/1802.04434).
  """
  return combine.chain(sign.scale_by_sign(),
                       scaling.scale_by_learning_rate(learning_rate))


def signum(
    learning_rate: base.ScalarOrSchedule,
    beta: jax.typing.ArrayLike = 0.9,
    accumulator_dtype: Any | None = None,
) -> _Extra:
  """Signum: the sign of an (undebiased) EMA of the gradients.

  Reference: Bernstein et al., "signSGD: Compressed Optimisation for
  Non-Convex Problems", ICML 2018 (https://arxiv.org/abs/1802.04434).
  """
  return combine.chain(
      momentum.ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
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
  """Rprop; ``learning_rate`` is the initial per-coordinate step size.

  Reference: Riedmiller & Braun, "A Direct Adaptive Method for Faster
  Backpropagation Learning: The RPROP Algorithm", ICNN 1993
  (https://doi.org/10.1109/ICNN.1993.298623).
  """
  return combine.chain(
      sign.scale_by_rprop(
          learning_rate=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus,
          min_step_size=min_step_size, max_step_size=max_step_size),
      scaling.scale(-1.0),
  )
