"""Adam variants changing the second moment: AdaBelief, AMSGrad, RAdam, Yogi.

Each is a chain of a direction and the (negated) learning rate, with optax's
names, signatures and defaults.
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import adam_variants
from shardopt._src.transforms import scaling
from shardopt._src.wrappers import combine

__all__ = [
    "adabelief",
    "amsgrad",
    "radam",
    "yogi",
]

_Extra = base.GradientTransformationExtraArgs


def adabelief(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-16,
    eps_root: jax.typing.ArrayLike = 1e-16,
    *,
    nesterov: bool = False,
) -> _Extra:
  """AdaBelief: Adam dividing by the variance of the gradient around its EMA.

  Reference: Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the
  Belief in Observed Gradients", NeurIPS 2020
  (https://arxiv.org/abs/2010.07468).
  """
  return combine.chain(
      adam_variants.scale_by_belief(b1=b1, b2=b2, eps=eps,
                                        eps_root=eps_root, nesterov=nesterov),
      scaling.scale_by_learning_rate(learning_rate),
  )


def yogi(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-3,
) -> _Extra:
  """Yogi: Adam with an additive, sign-controlled second-moment update.

  Reference: Zaheer et al., "Adaptive Methods for Nonconvex Optimization",
  NeurIPS 2018 (https://papers.nips.cc/paper/8186).
  """
  return combine.chain(
      adam_variants.scale_by_yogi(b1=b1, b2=b2, eps=eps),
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
