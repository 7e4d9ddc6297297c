"""Ready-made optimizers: optax's aliases as chains of shardopt transforms.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). ``adam`` and ``adamw``
also take ``nu_dtype``, the dtype of the second moment.
"""

import jax

from shardopt._src import base
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import layerwise
from shardopt._src.transforms import momentum as momentum_lib
from shardopt._src.transforms import novograd as novograd_lib
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine
from shardopt._src.wrappers import masking

__all__ = [
    "fromage",
    "lamb",
    "lars",
    "novograd",
]

MaskOrFn = base.MaskOrFn
_Extra = base.GradientTransformationExtraArgs


def lamb(
    learning_rate: base.ScalarOrSchedule,
    b1: jax.typing.ArrayLike = 0.9,
    b2: jax.typing.ArrayLike = 0.999,
    eps: jax.typing.ArrayLike = 1e-6,
    eps_root: jax.typing.ArrayLike = 0.0,
    weight_decay: base.ScalarOrSchedule = 0.0,
    mask: MaskOrFn = None,
) -> _Extra:
  """LAMB: Adam's direction with weight decay, rescaled per param by a trust
  ratio ||param|| / ||update||.

  Reference: You et al., "Large Batch Optimization for Deep Learning: Training
  BERT in 76 minutes", ICLR 2020 (https://arxiv.org/abs/1904.00962).
  """
  return combine.chain(
      adam_lib.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      layerwise.scale_by_trust_ratio(),
      scaling.scale_by_learning_rate(learning_rate),
  )


def fromage(
    learning_rate: base.ScalarOrSchedule,
    min_norm: jax.typing.ArrayLike = 1e-6,
) -> _Extra:
  """Frobenius matched gradient descent: trust-ratio steps of relative size
  ``learning_rate``, shrinking the params by ``1 / sqrt(1 + lr**2)``.

  Reference: Bernstein et al., "On the distance between two neural networks
  and the stability of learning", NeurIPS 2020
  (https://arxiv.org/abs/2002.03432).
  """
  shrink = lambda lr: 1 / (1 + lr**2) ** 0.5
  if callable(learning_rate):
    lr = learning_rate
    step_size = lambda count: shrink(lr(count)) * lr(count)
    decay = lambda count: shrink(lr(count)) - 1
  else:
    step_size = learning_rate * shrink(learning_rate)
    decay = shrink(learning_rate) - 1
  return combine.chain(
      layerwise.scale_by_trust_ratio(min_norm),
      scaling.scale_by_learning_rate(step_size),
      weight_decay_lib.add_decayed_weights(decay),
  )


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
      novograd_lib.scale_by_novograd(b1=b1, b2=b2, eps=eps,
                                          eps_root=eps_root,
                                          weight_decay=weight_decay),
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
          layerwise.scale_by_trust_ratio(
              trust_coefficient=trust_coefficient, eps=eps),
          mask=trust_ratio_mask),
      scaling.scale_by_learning_rate(learning_rate),
      momentum_lib.trace(decay=momentum, nesterov=nesterov),
  )
