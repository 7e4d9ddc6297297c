"""Per-coordinate adaptive step sizes: Adagrad, Adadelta, RMSProp and SM3.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). Adafactor is in
adafactor.py.
"""

import jax

from shardopt._src import base
from shardopt._src.transforms import adadelta as adadelta_lib
from shardopt._src.transforms import momentum as momentum_lib
from shardopt._src.transforms import rms
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.transforms.sm3 import scale_by_sm3
from shardopt._src.wrappers import combine

__all__ = [
    "adadelta",
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
  """RMSProp: divides the gradient by the root of a moving average of its square.

  ``nu = decay * nu + (1 - decay) * g**2`` (starting at ``initial_scale``);
  the update is ``-learning_rate * g / sqrt(nu + eps)`` (``eps_in_sqrt``) or
  ``-learning_rate * g / (sqrt(nu) + eps)``. ``centered`` subtracts the
  squared moving average of ``g`` from ``nu`` (the variance). Momentum, if
  given, is a trace applied after the learning rate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    decay: decay of the moving averages (default 0.9).
    eps: added to the average (inside the root) or to its root (default
      1e-8).
    initial_scale: initial value of ``nu`` (default 0.0).
    eps_in_sqrt: whether ``eps`` goes inside the root (default True).
    centered: whether to divide by the root of the variance instead of the
      second moment (default False).
    momentum: decay of a momentum trace applied after the learning rate;
      ``None`` (default) for none.
    nesterov: whether that momentum is Nesterov's (default False).
    bias_correction: whether to debias the moving averages (default False).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_rms`` (or
    ``scale_by_stddev``), ``scale_by_learning_rate``, then the optional
    ``trace``.

  References:
    Tieleman & Hinton, "Lecture 6.5 - rmsprop", Coursera: Neural Networks for
    Machine Learning, 2012
    (https://www.cs.toronto.edu/~tijmen/csc321/slides/lecture_slides_lec6.pdf);
    Graves, "Generating Sequences With Recurrent Neural Networks", 2013
    (https://arxiv.org/abs/1308.0850) for ``centered``.

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.rmsprop(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.369, -1.309]
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
  """SM3: Adagrad with one accumulator per row, column, ... of each param.

  For a param of shape ``(n_1, ..., n_k)`` SM3 keeps ``k`` vectors of sizes
  ``n_i`` (``sum(n_i)`` numbers) instead of a full second moment: each
  coordinate's sum of squared gradients is estimated by the minimum over its
  covers. The rescaled gradient then goes through a momentum, which is kept
  in full (see ``scale_by_sm3``).

  Args:
    learning_rate: a scalar or a schedule of the step count.
    momentum: decay of the momentum applied to the rescaled gradient
      (default 0.9).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_sm3`` then
    ``scale_by_learning_rate``.

  References:
    Anil et al., "Memory-Efficient Adaptive Optimization", NeurIPS 2019
    (https://arxiv.org/abs/1901.11150).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.sm3(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.954, -1.954]
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

  ``s = s + g**2`` (starting at ``initial_accumulator_value``); the update
  is ``-learning_rate * g / sqrt(s + eps)``, zero where ``s`` is zero.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    initial_accumulator_value: initial value of the sum (default 0.1).
    eps: added to the sum inside the root (default 1e-7).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_rss`` then
    ``scale_by_learning_rate``.

  References:
    Duchi et al., "Adaptive Subgradient Methods for Online Learning and
    Stochastic Optimization", JMLR 2011
    (https://jmlr.org/papers/v12/duchi11a.html).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.adagrad(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.782, -1.776]
  """
  return combine.chain(
      rms.scale_by_rss(
          initial_accumulator_value=initial_accumulator_value, eps=eps),
      scaling.scale_by_learning_rate(learning_rate),
  )


def adadelta(
    learning_rate: base.ScalarOrSchedule | None = None,
    rho: jax.typing.ArrayLike = 0.9,
    eps: jax.typing.ArrayLike = 1e-6,
    weight_decay: base.ScalarOrSchedule = 0.0,
    weight_decay_mask: MaskOrFn = None,
) -> _Extra:
  """Adadelta: rescales by the ratio of the RMS of past updates to past gradients.

  ``E[g^2]`` and ``E[dx^2]`` are moving averages with decay ``rho``; the
  direction is ``g * sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps)``. The weight
  decay, if any, is added to the gradient before the rescaling.

  Args:
    learning_rate: a scalar or a schedule of the step count; ``None``
      (default) returns the direction as is (no scaling and no sign flip,
      as in optax).
    rho: decay of both moving averages (default 0.9).
    eps: added inside both roots (default 1e-6).
    weight_decay: a scalar or schedule, the rate of ``weight_decay *
      params`` added to the gradient (default 0.0).
    weight_decay_mask: which params decay (a tree of bools or a function of
      the params); ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: ``add_decayed_weights``,
    ``scale_by_adadelta``, ``scale_by_learning_rate``.

  References:
    Zeiler, "ADADELTA: An Adaptive Learning Rate Method", 2012
    (https://arxiv.org/abs/1212.5701).
  """
  return combine.chain(
      weight_decay_lib.add_decayed_weights(weight_decay, mask=weight_decay_mask),
      adadelta_lib.scale_by_adadelta(rho=rho, eps=eps),
      scaling.scale_by_learning_rate(learning_rate),
  )
