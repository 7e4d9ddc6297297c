"""Ready-made sign-based optimizers (Lion, signSGD, Signum, Rprop) and those
whose step size comes from the objective (Polyak SGD, L-BFGS with a line
search), with optax's names, signatures and defaults.
"""

from typing import Any

import jax

from shardopt import accumulation
from shardopt import alias
from shardopt import base
from shardopt import combine
from shardopt import direction_rules
from shardopt import quasi_newton
from shardopt import scaling
from shardopt import sign_methods
from shardopt import zoom_linesearch
from shardopt.alias_adaptive import MaskOrFn, descend

__all__ = [
    "lbfgs",
    "lion",
    "polyak_sgd",
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
  return descend(sign_methods.scale_by_lion(b1=b1, b2=b2, mu_dtype=mu_dtype),
                  learning_rate, weight_decay, mask)


def sign_sgd(learning_rate: base.ScalarOrSchedule) -> _Extra:
  """signSGD: steps along the sign of the gradient.

  Reference: Bernstein et al., "signSGD: Compressed Optimisation for
  Non-Convex Problems", ICML 2018 (https://arxiv.org/abs/1802.04434).
  """
  return combine.chain(sign_methods.scale_by_sign(),
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
      accumulation.ema(beta, debias=False, accumulator_dtype=accumulator_dtype),
      sign_methods.scale_by_sign(),
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
      sign_methods.scale_by_rprop(
          learning_rate=learning_rate, eta_minus=eta_minus, eta_plus=eta_plus,
          min_step_size=min_step_size, max_step_size=max_step_size),
      scaling.scale(-1.0),
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
      alias.sgd(learning_rate=scaling),
      direction_rules.scale_by_polyak(max_learning_rate=max_learning_rate,
                                      f_min=f_min, eps=eps, variant=variant),
  )


def lbfgs(
    learning_rate: base.ScalarOrSchedule | None = None,
    memory_size: int = 10,
    scale_init_precond: bool = True,
    linesearch: base.GradientTransformation | None = (
        zoom_linesearch.scale_by_zoom_linesearch(
            max_linesearch_steps=20, initial_guess_strategy="one")),
) -> _Extra:
  """L-BFGS with a zoom line search.

  Without ``learning_rate`` the direction is negated and left to the line
  search; ``linesearch=None`` takes it as is. ``update`` needs ``value=``,
  ``grad=`` and ``value_fn=`` for the search.

  References: Nocedal, "Updating Quasi-Newton Matrices with Limited Storage",
  Math. Comp. 1980 (https://doi.org/10.1090/S0025-5718-1980-0572855-7); Liu &
  Nocedal, "On the limited memory BFGS method for large scale optimization",
  Math. Prog. 1989 (https://doi.org/10.1007/BF01589116); Nocedal & Wright,
  Numerical Optimization, 1999, Algorithms 7.4, 7.5.
  """
  if learning_rate is None:
    step = scaling.scale(-1.0)
  else:
    step = scaling.scale_by_learning_rate(learning_rate)
  return combine.chain(
      quasi_newton.scale_by_lbfgs(memory_size=memory_size,
                                  scale_init_precond=scale_init_precond),
      step,
      base.identity() if linesearch is None else linesearch,
  )
