"""Adamax, AdamaxW and Adan: Adam-like directions with decoupled weight decay.

Each is a chain of a direction, optional weight decay and the (negated)
learning rate, with optax's names, signatures and defaults.
"""

import jax

from shardopt._src import base
from shardopt._src.aliases.gradient_descent import descend
from shardopt._src.transforms import adam_variants
from shardopt._src.transforms import adan as adan_lib
from shardopt._src.transforms import scaling
from shardopt._src.wrappers import combine

__all__ = [
    "adamax",
    "adamaxw",
    "adan",
]

_Extra = base.GradientTransformationExtraArgs
MaskOrFn = base.MaskOrFn


def adamax(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
) -> _Extra:
  """Adamax: Adam with an infinity-norm second moment.

  ``u = max(b2 * u, |g| + eps)`` replaces Adam's second moment (not
  debiased); the update is ``-learning_rate * m_hat / u``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the infinity norm (default 0.999).
    eps: added to ``|g|`` in the infinity norm (default 1e-8).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adamax`` then
    ``scale_by_learning_rate``.

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980), Sec. 7.1.
  """
  return combine.chain(
      adam_variants.scale_by_adamax(b1=b1, b2=b2, eps=eps),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adamaxw(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: base.ScalarOrSchedule = 1e-4,
    mask: MaskOrFn = None,
) -> _Extra:
  """AdamaxW: Adamax with decoupled weight decay.

  The update is ``-learning_rate * (m_hat / u + weight_decay * params)``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the infinity norm (default 0.999).
    eps: added to ``|g|`` in the infinity norm (default 1e-8).
    weight_decay: a scalar or schedule, the decay rate (default 1e-4).
    mask: which params decay (a tree of bools or a function of the params);
      ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adamax``,
    ``add_decayed_weights``, ``scale_by_learning_rate``.

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980), Sec. 7.1; Loshchilov & Hutter,
    "Decoupled Weight Decay Regularization", ICLR 2019
    (https://arxiv.org/abs/1711.05101).
  """
  return descend(adam_variants.scale_by_adamax(b1=b1, b2=b2, eps=eps),
                  learning_rate, weight_decay, mask)


def adan(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.98,
    b2: jax.typing.ArrayLike = 0.92,
    b3: jax.typing.ArrayLike = 0.99,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 1e-8,
    weight_decay: base.ScalarOrSchedule = 0.0,
    mask: MaskOrFn = None,
) -> _Extra:
  """Adan: adaptive Nesterov momentum, with decoupled weight decay.

  Three debiased EMAs: ``m`` of the gradients (``b1``), ``v`` of the
  gradient differences ``g_t - g_{t-1}`` (``b2``), ``n`` of the squared
  corrected gradient ``(g + (1 - b2) * diff)**2`` (``b3``); the update is
  ``-learning_rate * ((m_hat + (1 - b2) * v_hat) / (sqrt(n_hat + eps_root)
  + eps) + weight_decay * params)``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the gradients' moment (default 0.98).
    b2: decay of the gradient differences' moment (default 0.92).
    b3: decay of the second moment (default 0.99).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 1e-8).
    weight_decay: a scalar or schedule, the decay rate (default 0.0).
    mask: which params decay (a tree of bools or a function of the params);
      ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adan``,
    ``add_decayed_weights``, ``scale_by_learning_rate``.

  References:
    Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster
    Optimizing Deep Models", 2022 (https://arxiv.org/abs/2208.06677).
  """
  return descend(
      adan_lib.scale_by_adan(b1=b1, b2=b2, b3=b3, eps=eps,
                                      eps_root=eps_root),
      learning_rate, weight_decay, mask)
