"""Ready-made optimizers: optax's aliases as chains of shardopt transforms.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). ``adam`` and ``adamw``
also take ``nu_dtype``, the dtype of the second moment.
"""

from typing import Any

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src.transforms import adam_variants
from shardopt._src.transforms import clipping
from shardopt._src.transforms import factored_rms
from shardopt._src.transforms import layerwise
from shardopt._src.transforms import momentum as momentum_lib
from shardopt._src.transforms import rms
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.transforms.sm3 import scale_by_sm3
from shardopt._src.wrappers import combine

__all__ = [
    "adadelta",
    "adafactor",
    "adagrad",
    "rmsprop",
    "sm3",
]

MaskOrFn = base.MaskOrFn
_Extra = base.GradientTransformationExtraArgs


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
  scale_by = rms.scale_by_stddev if centered else rms.scale_by_rms
  if momentum is None:
    momentum_tx = base.identity()
  else:
    momentum_tx = momentum_lib.trace(decay=momentum, nesterov=nesterov)
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
      rms.scale_by_rss(
          initial_accumulator_value=initial_accumulator_value, eps=eps),
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
  stages = [factored_rms.scale_by_factored_rms(
      factored, decay_rate, decay_offset, min_dim_size_to_factor, eps)]
  if clipping_threshold is not None:
    stages.append(clipping.clip_by_block_rms(clipping_threshold))
  if learning_rate is not None:
    stages.append(
        scaling.scale_by_learning_rate(learning_rate, flip_sign=False))
  if multiply_by_parameter_scale:
    stages.append(layerwise.scale_by_param_block_rms())
  if momentum is not None:
    stages.append(momentum_lib.ema(
        momentum, debias=False, accumulator_dtype=dtype_momentum))
  if weight_decay_rate is not None:
    stages.append(weight_decay_lib.add_decayed_weights(
        weight_decay_rate, mask=weight_decay_mask))
  stages.append(scaling.scale(-1))
  return combine.chain(*stages)


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
      adam_variants.scale_by_adadelta(rho=rho, eps=eps),
      scaling.scale_by_learning_rate(learning_rate),
  )
