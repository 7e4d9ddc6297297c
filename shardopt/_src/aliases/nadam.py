"""NAdam and NAdamW: Adam and AdamW with Nesterov momentum.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``).
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.aliases.adam import adam
from shardopt._src.aliases.adam import adamw

__all__ = [
    "nadam",
    "nadamw",
]


def nadam(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
) -> base.GradientTransformationExtraArgs:
  """NAdam: Adam with Nesterov momentum.

  Adam's update with the debiased first moment replaced by a look-ahead,
  ``b1 * m / (1 - b1**(t+1)) + (1 - b1) * g / (1 - b1**t)``: this is
  ``adam(..., nesterov=True)``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    nesterov: keyword-only; ``True`` (default) takes the look-ahead,
      ``False`` gives plain ``adam``.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam`` (with
    ``nesterov``) then ``scale_by_learning_rate``.

  References:
    Dozat, "Incorporating Nesterov Momentum into Adam", ICLR workshop 2016
    (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ).
  """
  return adam(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
              mu_dtype=mu_dtype, nesterov=nesterov)


def nadamw(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: base.ScalarOrSchedule = 1e-4,
    mask: base.MaskOrFn = None,
    *,
    nesterov: bool = True,
) -> base.GradientTransformationExtraArgs:
  """NAdamW: NAdam with decoupled weight decay (``adamw(...,
  nesterov=True)``).

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    weight_decay: a scalar or schedule, the decay rate (default 1e-4).
    mask: which params decay (a tree of bools or a function of the
      params); ``None`` (default) decays all.
    nesterov: keyword-only; ``True`` (default) takes the look-ahead,
      ``False`` gives plain ``adamw``.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam`` (with
    ``nesterov``), ``add_decayed_weights``, ``scale_by_learning_rate``.

  References:
    Dozat, "Incorporating Nesterov Momentum into Adam", ICLR workshop 2016
    (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ); Loshchilov &
    Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
    (https://arxiv.org/abs/1711.05101).
  """
  return adamw(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
               mu_dtype=mu_dtype, weight_decay=weight_decay, mask=mask,
               nesterov=nesterov)
