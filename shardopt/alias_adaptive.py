"""Ready-made optimizers built from the transforms of the optax catalogue
beyond Adam/SGD: each is a chain of a direction, optional weight decay and the
(negated) learning rate, with optax's names, signatures and defaults.
"""

from typing import Any

import jax

from shardopt import accumulation
from shardopt import adaptive_variants
from shardopt import alias
from shardopt import base
from shardopt import block_scaling
from shardopt import combine
from shardopt import direction_rules
from shardopt import layerwise_adaptive
from shardopt import masking
from shardopt import scaling
from shardopt import weight_decay as weight_decay_lib

__all__ = [
    "adabelief",
    "adadelta",
    "adamax",
    "adamaxw",
    "adan",
    "amsgrad",
    "lars",
    "nadam",
    "nadamw",
    "novograd",
    "optimistic_gradient_descent",
    "yogi",
]

_Extra = base.GradientTransformationExtraArgs
MaskOrFn = base.MaskOrFn


def descend(direction: base.GradientTransformation, learning_rate,
             weight_decay=0.0, mask: MaskOrFn = None) -> _Extra:
  """direction, then ``+ weight_decay * params`` (masked), then ``* -lr``."""
  return combine.chain(
      direction,
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      scaling.scale_by_learning_rate(learning_rate),
  )


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
      adaptive_variants.scale_by_belief(b1=b1, b2=b2, eps=eps,
                                        eps_root=eps_root, nesterov=nesterov),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adadelta(
    learning_rate: base.ScalarOrSchedule | None = None,
    rho: jax.typing.ArrayLike = 0.9,
    eps: jax.typing.ArrayLike = 1e-6,
    weight_decay: base.ScalarOrSchedule = 0.0,
    weight_decay_mask: MaskOrFn = None,
) -> _Extra:
  """Adadelta; the weight decay is added to the gradient before rescaling.

  Reference: Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012
  (https://arxiv.org/abs/1212.5701).
  """
  return combine.chain(
      weight_decay_lib.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      adaptive_variants.scale_by_adadelta(rho=rho, eps=eps),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adamax(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-8,
) -> _Extra:
  """Adamax: Adam with an infinity-norm second moment.

  Reference: Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2014
  (https://arxiv.org/abs/1412.6980), Sec. 7.1.
  """
  return combine.chain(
      adaptive_variants.scale_by_adamax(b1=b1, b2=b2, eps=eps),
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
  """Adamax with decoupled weight decay.

  References: Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2014
  (https://arxiv.org/abs/1412.6980), Sec. 7.1; Loshchilov & Hutter,
  "Decoupled Weight Decay Regularization", ICLR 2019
  (https://arxiv.org/abs/1711.05101).
  """
  return descend(adaptive_variants.scale_by_adamax(b1=b1, b2=b2, eps=eps),
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

  Reference: Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for
  Faster Optimizing Deep Models", 2022 (https://arxiv.org/abs/2208.06677).
  """
  return descend(
      adaptive_variants.scale_by_adan(b1=b1, b2=b2, b3=b3, eps=eps,
                                      eps_root=eps_root),
      learning_rate, weight_decay, mask)


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
      adaptive_variants.scale_by_amsgrad(
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
  return alias.adam(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
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
  return alias.adamw(learning_rate, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                     mu_dtype=mu_dtype, weight_decay=weight_decay, mask=mask,
                     nesterov=True)


def novograd(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.25,
    eps: jax.typing.ArrayLike = 1e-6,
    eps_root: jax.typing.ArrayLike = 0.0,
    weight_decay: base.ScalarOrSchedule = 0.0,
) -> _Extra:
  """NovoGrad: layer-wise second moments; needs the params.

  Reference: Ginsburg et al., "Stochastic Gradient Methods with Layer-wise
  Adaptive Moments for Training of Deep Networks", 2019
  (https://arxiv.org/abs/1905.11286).
  """
  return combine.chain(
      layerwise_adaptive.scale_by_novograd(b1=b1, b2=b2, eps=eps,
                                          eps_root=eps_root,
                                          weight_decay=weight_decay),
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
      adaptive_variants.scale_by_yogi(b1=b1, b2=b2, eps=eps),
      scaling.scale_by_learning_rate(learning_rate),
  )


def optimistic_gradient_descent(
    learning_rate: base.ScalarOrSchedule,
    alpha: jax.typing.ArrayLike = 1.0,
    beta: jax.typing.ArrayLike = 1.0,
) -> _Extra:
  """Optimistic gradient descent for min-max games.

  References: Mokhtari et al., "A Unified Analysis of Extra-gradient and
  Optimistic Gradient Methods for Saddle Point Problems", AISTATS 2020
  (https://arxiv.org/abs/1901.08511); Daskalakis et al., "Training GANs with
  Optimism", ICLR 2018 (https://arxiv.org/abs/1711.00141).
  """
  return combine.chain(
      direction_rules.scale_by_optimistic_gradient(alpha=alpha, beta=beta),
      scaling.scale_by_learning_rate(learning_rate),
  )


def lars(
    learning_rate: base.ScalarOrSchedule,
    weight_decay: base.ScalarOrSchedule = 0.0,
    weight_decay_mask: MaskOrFn = True,
    trust_coefficient: jax.typing.ArrayLike = 0.001,
    eps: jax.typing.ArrayLike = 0.0,
    trust_ratio_mask: MaskOrFn = True,
    momentum: jax.typing.ArrayLike = 0.9,
    nesterov: bool = False,
) -> _Extra:
  """LARS: layer-wise trust ratio, then momentum.

  Reference: You et al., "Large Batch Training of Convolutional Networks",
  2017 (https://arxiv.org/abs/1708.03888).
  """
  return combine.chain(
      weight_decay_lib.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      masking.masked(
          block_scaling.scale_by_trust_ratio(
              trust_coefficient=trust_coefficient, eps=eps),
          mask=trust_ratio_mask),
      scaling.scale_by_learning_rate(learning_rate),
      accumulation.trace(decay=momentum, nesterov=nesterov),
  )
