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
  """LAMB: Adam's direction with weight decay, rescaled per param by a trust ratio.

  With ``r = m_hat / (sqrt(v_hat + eps_root) + eps) + weight_decay * p``
  (Adam's debiased moments), each param's update is
  ``-learning_rate * (||p|| / ||r||) * r``, the ratio taken as 1 where either
  norm is zero. Needs the params.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-6).
    eps_root: added to the second moment inside the root (default 0.0).
    weight_decay: a scalar or schedule, the decay rate (default 0.0).
    mask: which params decay (a tree of bools or a function of the params);
      ``None`` (default) decays all.

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam``,
    ``add_decayed_weights``, ``scale_by_trust_ratio``,
    ``scale_by_learning_rate``.

  References:
    You et al., "Large Batch Optimization for Deep Learning: Training BERT in
    76 minutes", ICLR 2020 (https://arxiv.org/abs/1904.00962).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.lamb(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.57, -1.567]
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
  """Fromage: Frobenius matched gradient descent.

  Each param takes a trust-ratio step ``-lr * (||p|| / ||g||) * g`` (the
  relative size of the step is ``lr``) and is shrunk, so the update is
  ``(p - lr * (||p|| / ||g||) * g) / sqrt(1 + lr**2) - p``.

  Args:
    learning_rate: a scalar or a schedule of the step count (a relative
      step size).
    min_norm: floor of both norms in the trust ratio (default 1e-6).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_trust_ratio``,
    ``scale_by_learning_rate``, ``add_decayed_weights``. Needs the params.

  References:
    Bernstein et al., "On the distance between two neural networks and the
    stability of learning", NeurIPS 2020 (https://arxiv.org/abs/2002.03432).
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
  """NovoGrad: Adam-like steps with one second moment per layer (param).

  ``nu = b2 * nu + (1 - b2) * ||g||**2`` is a scalar per param; the step
  ``g / (sqrt(nu + eps_root) + eps) + weight_decay * p`` is accumulated in a
  momentum ``mu = b1 * mu + step``, and the update is ``-learning_rate * mu``.
  The first step takes both moments from the gradient, undecayed. Needs the
  params.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the momentum (default 0.9).
    b2: decay of the per-param second moment (default 0.25).
    eps: added to the root of the second moment (default 1e-6).
    eps_root: added to the second moment inside the root (default 0.0).
    weight_decay: rate of ``weight_decay * params`` added to each step
      (default 0.0).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_novograd`` then
    ``scale_by_learning_rate``.

  References:
    Ginsburg et al., "Stochastic Gradient Methods with Layer-wise Adaptive
    Moments for Training of Deep Networks", 2019
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

  ``weight_decay * p`` is added to the gradient, each (masked) param's update
  is scaled by ``trust_coefficient * ||p|| / (||u|| + eps)`` (1 where either
  norm is zero), multiplied by ``-learning_rate`` and accumulated in a
  momentum trace. Needs the params.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    weight_decay: a scalar or schedule, the decay rate (default 0.0).
    weight_decay_mask: which params decay: a tree of bools, a function of the
      params, or ``True`` (default) for all.
    trust_coefficient: the trust ratio's multiplier (default 0.001).
    eps: added to the update norm in the trust ratio (default 0.0).
    trust_ratio_mask: which params get the trust ratio: a tree of bools, a
      function of the params, or ``True`` (default) for all.
    momentum: decay of the momentum trace (default 0.9).
    nesterov: whether to use Nesterov momentum (default False).

  Returns:
    A ``GradientTransformationExtraArgs``: ``add_decayed_weights``, masked
    ``scale_by_trust_ratio``, ``scale_by_learning_rate``, ``trace``.

  References:
    You et al., "Large Batch Training of Convolutional Networks", 2017
    (https://arxiv.org/abs/1708.03888).
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
