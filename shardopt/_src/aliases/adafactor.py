"""Adafactor: factored second moments, update clipping, relative step sizes.

Same name, signature, defaults and numbers as optax 0.2.8's ``adafactor``.
"""

from typing import Any

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src.transforms import clipping
from shardopt._src.transforms import factored_rms
from shardopt._src.transforms import layerwise
from shardopt._src.transforms import momentum as momentum_lib
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine

__all__ = [
    "adafactor",
]


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
    weight_decay_mask: base.MaskOrFn = None,
) -> base.GradientTransformationExtraArgs:
  """Adafactor: factored second moments, update clipping, relative step sizes.

  The gradient is rescaled by ``scale_by_factored_rms`` (for a param with
  two dimensions of at least ``min_dim_size_to_factor``, the second moment
  is kept as row and column means: ``n + m`` numbers for an ``n x m``
  param), then each stage runs unless its argument is None/False: block-RMS
  clipping to ``clipping_threshold``, the learning rate, scaling by the
  param's block RMS (``multiply_by_parameter_scale``), momentum (an EMA in
  ``dtype_momentum``) and weight decay; the result is negated.

  Args:
    learning_rate: a scalar or a schedule of the step count; ``None``
      (default) skips the scaling (the relative step then comes from
      ``multiply_by_parameter_scale`` alone).
    min_dim_size_to_factor: a param is factored only if its two largest
      dimensions are at least this large (default 128).
    decay_rate: exponent ``c`` of the second-moment decay
      ``1 - (t + 1)**(-c)`` (default 0.8).
    decay_offset: subtracted from the step count in that decay, for
      fine-tuning (default 0).
    multiply_by_parameter_scale: whether to scale the update by the
      param's root mean square (default True).
    clipping_threshold: clip each update to this block RMS; ``None`` skips
      it (default 1.0).
    momentum: decay of an (undebiased) EMA of the updates; ``None``
      (default) keeps no momentum.
    dtype_momentum: dtype of the momentum (default float32).
    weight_decay_rate: a scalar or schedule, rate of ``weight_decay_rate *
      params`` added to the update; ``None`` (default) for none.
    eps: added to the squared gradient (default 1e-30).
    factored: whether to factor the second moment at all (default True).
    weight_decay_mask: which params decay (a tree of bools or a function of
      the params); ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: a ``chain`` of the stages above.

  References:
    Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
    Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.adafactor(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.599, -1.582]
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
