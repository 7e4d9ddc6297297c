"""Adam and AdamW, the most used aliases.

Same names, signatures, defaults and numbers as optax 0.2.8; each returns a
``GradientTransformationExtraArgs`` (a ``chain``). Both also take
``nu_dtype``, the dtype of the second moment, and ``state_bits`` (8 or 4:
moments stored block-wise quantized, see wrappers/quantized_state.py).
NAdam/NAdamW are in nadam.py, AMSGrad and RAdam in adam_variants.py.
"""

from typing import Any

import jax

from shardopt._src import base
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine
from shardopt._src.wrappers import quantized_state as quantized_lib

__all__ = [
    "adam",
    "adamw",
]

MaskOrFn = base.MaskOrFn
_Extra = base.GradientTransformationExtraArgs


def _with_state_bits(tx: _Extra, state_bits: int | None) -> _Extra:
  """``tx``, its moments quantized to ``state_bits`` when given."""
  if state_bits is None:
    return tx
  return quantized_lib.quantized_state(tx, bits=state_bits)


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
    state_bits: int | None = None,
) -> _Extra:
  """Adam: steps by bias-corrected first over second moment estimates.

  With ``m = b1 * m + (1 - b1) * g`` and ``v = b2 * v + (1 - b2) * g**2``,
  debiased as ``m_hat = m / (1 - b1**t)`` and ``v_hat = v / (1 - b2**t)``,
  the update is ``-learning_rate * m_hat / (sqrt(v_hat + eps_root) + eps)``.
  With ``nesterov=True`` it is NAdam (``m_hat`` looks one step ahead).

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0);
      a positive value keeps the gradient of the update finite, e.g. when
      differentiating through the optimizer.
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    nesterov: whether to use Nesterov momentum (NAdam), default False.
    nu_dtype: dtype of the second moment; ``None`` (default) uses the
      params' dtype (a shardopt addition; optax has no such argument).
    state_bits: 8 or 4 to store both moments block-wise quantized
      (``quantized_state`` with its defaults); ``None`` (default) keeps them
      in float (a shardopt addition).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam`` then
    ``scale_by_learning_rate``.

  References:
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015
    (https://arxiv.org/abs/1412.6980); Dozat, "Incorporating Nesterov
    Momentum into Adam", ICLR workshop 2016
    (https://openreview.net/forum?id=OM0jvwB8jIp57ZJjtNEZ).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.adam(learning_rate=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.702, -1.701]
  """
  return _with_state_bits(combine.chain(
      adam_lib.scale_by_adam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
          nesterov=nesterov, nu_dtype=nu_dtype),
      scaling.scale_by_learning_rate(learning_rate),
  ), state_bits)


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
    state_bits: int | None = None,
) -> _Extra:
  """AdamW: Adam with weight decay decoupled from the gradient's scaling.

  The update is ``-learning_rate * (m_hat / (sqrt(v_hat + eps_root) + eps)
  + weight_decay * params)`` with Adam's debiased moments (see ``adam``):
  the decay is added after Adam's rescaling, not to the gradient.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    weight_decay: a scalar or schedule, the decay rate (default 1e-4).
    mask: which params decay: a tree of bools with the params' structure (or
      a prefix of it) or a function of the params returning one; ``None``
      (default) decays all.
    nesterov: whether to use Nesterov momentum (NAdamW), default False.
    nu_dtype: dtype of the second moment; ``None`` (default) uses the
      params' dtype (a shardopt addition; optax has no such argument).
    state_bits: 8 or 4 to store both moments block-wise quantized
      (``quantized_state`` with its defaults); ``None`` (default) keeps them
      in float (a shardopt addition).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_adam``,
    ``add_decayed_weights``, ``scale_by_learning_rate``.

  References:
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019
    (https://arxiv.org/abs/1711.05101).

  Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import shardopt
    >>> loss = lambda params: jnp.sum(params["w"] ** 2)
    >>> params = {"w": jnp.array([1.0, -2.0])}
    >>> tx = shardopt.adamw(learning_rate=0.1, weight_decay=0.1)
    >>> state = tx.init(params)
    >>> for _ in range(3):
    ...   updates, state = tx.update(jax.grad(loss)(params), state, params)
    ...   params = shardopt.apply_updates(params, updates)
    >>> [round(float(w), 3) for w in params["w"]]
    [0.675, -1.644]
  """
  return _with_state_bits(combine.chain(
      adam_lib.scale_by_adam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, mu_dtype=mu_dtype,
          nesterov=nesterov, nu_dtype=nu_dtype),
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      scaling.scale_by_learning_rate(learning_rate),
  ), state_bits)
