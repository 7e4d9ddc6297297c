"""Ready-made optimizers: optax's aliases as chains of shardopt transforms.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). ``adam`` and ``adamw``
also take ``nu_dtype``, the dtype of the second moment.
"""

from typing import Any

import jax
import jax.numpy as jnp

from shardopt import accumulation
from shardopt import adaptive
from shardopt import base
from shardopt import block_scaling
from shardopt import clipping
from shardopt import combine
from shardopt import factorized
from shardopt import perturbation
from shardopt import scaling
from shardopt import weight_decay as weight_decay_lib
# The package's `sm3` attribute is the alias below, not the module.
from shardopt.sm3 import scale_by_sm3

__all__ = [
    "adafactor",
    "adagrad",
    "adam",
    "adamw",
    "fromage",
    "lamb",
    "noisy_sgd",
    "radam",
    "rmsprop",
    "sgd",
    "sm3",
]

MaskOrFn = base.MaskOrFn
_Extra = base.GradientTransformationExtraArgs


def sgd(
    learning_rate: base.ScalarOrSchedule,
    momentum: jax.typing.ArrayLike | None = None,
    nesterov: bool = False,
    accumulator_dtype: Any | None = None,
) -> _Extra:
  """Stochastic gradient descent, with optional (Nesterov) momentum.

  Reference: Sutskever et al., "On the importance of initialization and
  momentum in deep learning", ICML 2013.
  """
  if momentum is None:
    direction = base.identity()
  else:
    direction = accumulation.trace(
        decay=momentum, nesterov=nesterov, accumulator_dtype=accumulator_dtype)
  return combine.chain(direction, scaling.scale_by_learning_rate(learning_rate))


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
      adaptive.scale_by_adam(
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
      adaptive.scale_by_adam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
          nesterov=nesterov, nu_dtype=nu_dtype),
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      scaling.scale_by_learning_rate(learning_rate),
  )


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
      adaptive.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      block_scaling.scale_by_trust_ratio(),
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
      adaptive.scale_by_radam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold,
          nesterov=nesterov),
      scaling.scale_by_learning_rate(learning_rate),
  )


def rmsprop(
    learning_rate: base.ScalarOrSchedule,
    decay: jax.typing.ArrayLike = 0.9,
    eps: jax.typing.ArrayLike = 1e-8,
    initial_scale: jax.typing.ArrayLike = 0.0,
    eps_in_sqrt: bool = True,
    centered: bool = False,
    momentum: jax.typing.ArrayLike | None = None,
    nesterov: bool = False,
    bias_correction: bool = False,
) -> _Extra:
  """RMSProp; ``centered`` divides by the standard deviation instead.

  Momentum, if any, is applied after the learning rate.

  References: Tieleman & Hinton, "Lecture 6.5 - rmsprop", Coursera: Neural
  Networks for Machine Learning, 2012
  (https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf);
  Graves, "Generating Sequences With Recurrent Neural Networks", 2013
  (https://arxiv.org/abs/1308.0850) for ``centered``.
  """
  scale_by = adaptive.scale_by_stddev if centered else adaptive.scale_by_rms
  if momentum is None:
    momentum_tx = base.identity()
  else:
    momentum_tx = accumulation.trace(decay=momentum, nesterov=nesterov)
  return combine.chain(
      scale_by(decay=decay, eps=eps, initial_scale=initial_scale,
               eps_in_sqrt=eps_in_sqrt, bias_correction=bias_correction),
      scaling.scale_by_learning_rate(learning_rate),
      momentum_tx,
  )


def sm3(
    learning_rate: base.ScalarOrSchedule,
    momentum: jax.typing.ArrayLike = 0.9,
) -> _Extra:
  """SM3 with momentum (see ``scale_by_sm3``); also takes a schedule.

  Reference: Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS
  2019 (https://arxiv.org/abs/1901.11150).
  """
  return combine.chain(
      scale_by_sm3(momentum),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adagrad(
    learning_rate: base.ScalarOrSchedule,
    initial_accumulator_value: jax.typing.ArrayLike = 0.1,
    eps: jax.typing.ArrayLike = 1e-7,
) -> _Extra:
  """Adagrad: divides by the root of the summed squared gradients.

  Reference: Duchi et al., "Adaptive Subgradient Methods for Online Learning
  and Stochastic Optimization", JMLR 2011
  (https://jmlr.org/papers/v12/duchi11a.html).
  """
  return combine.chain(
      adaptive.scale_by_rss(
          initial_accumulator_value=initial_accumulator_value, eps=eps),
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
      block_scaling.scale_by_trust_ratio(min_norm),
      scaling.scale_by_learning_rate(step_size),
      weight_decay_lib.add_decayed_weights(decay),
  )


def noisy_sgd(
    learning_rate: base.ScalarOrSchedule,
    eta: jax.typing.ArrayLike = 0.01,
    gamma: jax.typing.ArrayLike = 0.55,
    key: jax.typing.ArrayLike | None = None,
    *,
    seed: int | None = None,
) -> _Extra:
  """SGD on gradients plus Gaussian noise of variance ``eta / (1 + t)**gamma``.

  ``seed`` is optax's deprecated spelling of ``key``.

  Reference: Neelakantan et al., "Adding Gradient Noise Improves Learning for
  Very Deep Networks", 2015 (https://arxiv.org/abs/1511.06807).
  """
  return combine.chain(
      perturbation.add_noise(eta, gamma, key, seed=seed),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adafactor(
    learning_rate: base.ScalarOrSchedule | None = None,
    min_dim_size_to_factor: int = 128,
    decay_rate: jax.typing.ArrayLike = 0.8,
    decay_offset: jax.typing.ArrayLike = 0,
    multiply_by_parameter_scale: bool = True,
    clipping_threshold: jax.typing.ArrayLike | None = 1.0,
    momentum: jax.typing.ArrayLike | None = None,
    dtype_momentum: Any = jnp.float32,
    weight_decay_rate: base.ScalarOrSchedule | None = None,
    eps: jax.typing.ArrayLike = 1e-30,
    factored: bool = True,
    weight_decay_mask: MaskOrFn = None,
) -> _Extra:
  """Adafactor: factored second moments, update clipping, relative steps.

  Each optional stage is skipped when its argument is None/False: block-RMS
  clipping (``clipping_threshold``), the learning rate, scaling by the
  param's block RMS (``multiply_by_parameter_scale``), momentum (an EMA in
  ``dtype_momentum``) and weight decay.

  Reference: Shazeer & Stern, "Adafactor: Adaptive Learning Rates with
  Sublinear Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235).
  """
  stages = [factorized.scale_by_factored_rms(
      factored, decay_rate, decay_offset, min_dim_size_to_factor, eps)]
  if clipping_threshold is not None:
    stages.append(clipping.clip_by_block_rms(clipping_threshold))
  if learning_rate is not None:
    stages.append(
        scaling.scale_by_learning_rate(learning_rate, flip_sign=False))
  if multiply_by_parameter_scale:
    stages.append(block_scaling.scale_by_param_block_rms())
  if momentum is not None:
    stages.append(accumulation.ema(
        momentum, debias=False, accumulator_dtype=dtype_momentum))
  if weight_decay_rate is not None:
    stages.append(weight_decay_lib.add_decayed_weights(
        weight_decay_rate, mask=weight_decay_mask))
  stages.append(scaling.scale(-1))
  return combine.chain(*stages)
