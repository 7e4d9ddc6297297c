"""Ready-made optimizers: optax's aliases as chains of shardopt transforms.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). ``adam`` and ``adamw``
also take ``nu_dtype``, the dtype of the second moment.
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import adam_variants
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine

__all__ = [
    "adam",
    "adamw",
    "amsgrad",
    "nadam",
    "nadamw",
    "radam",
]

MaskOrFn = base.MaskOrFn
_Extra = base.GradientTransformationExtraArgs


def adam(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
    nu_dtype: Any | None = None,
) -> _Extra:
  """Adam (NAdam with ``nesterov=True``).

  References: Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2014
  (https://arxiv.org/abs/1412.6980); Dozat, "Incorporating Nesterov Momentum
  into Adam", 2016.
  """
  return combine.chain(
      adam_lib.scale_by_adam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
          nesterov=nesterov, nu_dtype=nu_dtype),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adamw(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: base.ScalarOrSchedule = 1e-4,
    mask: MaskOrFn = None,
    *,
    nesterov: bool = False,
    nu_dtype: Any | None = None,
) -> _Extra:
  """Adam with weight decay decoupled from the gradient's scaling.

  ``mask`` (a tree of bools or a function of the params) selects the params
  that decay.

  Reference: Loshchilov & Hutter, "Decoupled Weight Decay Regularization",
  ICLR 2019 (https://arxiv.org/abs/1711.05101).
  """
  return combine.chain(
      adam_lib.scale_by_adam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
          nesterov=nesterov, nu_dtype=nu_dtype),
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      scaling.scale_by_learning_rate(learning_rate),
  )


def radam(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    threshold: jax.typing.ArrayLike = 5.0,
    *,
    nesterov: bool = False,
) -> _Extra:
  """Rectified Adam: momentum SGD until the variance estimate is reliable.

  Reference: Liu et al., "On the Variance of the Adaptive Learning Rate and
  Beyond", ICLR 2020 (https://arxiv.org/abs/1908.03265).
  """
  return combine.chain(
      adam_lib.scale_by_radam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold,
          nesterov=nesterov),
      scaling.scale_by_learning_rate(learning_rate),
  )


def amsgrad(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> _Extra:
  """AMSGrad: Adam dividing by the running maximum of the second moment.

  Reference: Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018
  (https://openreview.net/forum?id=ryQu7f-RZ).
  """
  return combine.chain(
      adam_variants.scale_by_amsgrad(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
          bias_correction_mu=bias_correction_mu,
          bias_correction_nu=bias_correction_nu),
      scaling.scale_by_learning_rate(learning_rate),
  )


def nadam(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
) -> _Extra:
  """NAdam: Adam with Nesterov momentum.

  Reference: Dozat, "Incorporating Nesterov Momentum into Adam", ICLR workshop
  2016 (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ).
  """
  return adam(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                    mu_dtype=mu_dtype, nesterov=True)


def nadamw(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
    eps_root: jax.typing.ArrayLike = 0.0,
    mu_dtype: Any | None = None,
    weight_decay: base.ScalarOrSchedule = 1e-4,
    mask: MaskOrFn = None,
) -> _Extra:
  """NAdamW: NAdam with decoupled weight decay.

  References: Dozat, "Incorporating Nesterov Momentum into Adam", ICLR
  workshop 2016 (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ);
  Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
  (https://arxiv.org/abs/1711.05101).
  """
  return adamw(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                     mu_dtype=mu_dtype, weight_decay=weight_decay, mask=mask,
                     nesterov=True)
