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

  With ``m = b1 * m + (1 - b1) * g`` and
  ``s = b2 * s + (1 - b2) * (g - m)**2 + eps_root``, the update is
  ``-learning_rate * m_hat / (sqrt(s_hat) + eps)`` (both debiased): steps
  are large where the gradient agrees with its prediction ``m``.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the belief (centred second) moment (default 0.999).
    eps: added to the root of the belief moment (default 1e-16).
    eps_root: added to the belief moment at every step (default 1e-16).
    nesterov: whether to use Nesterov momentum (default False).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_belief`` then
    ``scale_by_learning_rate``.

  References:
    Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief in
    Observed Gradients", NeurIPS 2020 (https://arxiv.org/abs/2010.07468).
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

  ``v = v - (1 - b2) * sign(v - g**2) * g**2`` changes the second moment by
  at most ``(1 - b2) * g**2`` per step, so a sudden large gradient does not
  shrink the step size at once. Both moments start at 1e-6.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: rate of the second moment's change (default 0.999).
    eps: added to the root of the second moment (default 1e-3).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_yogi`` then
    ``scale_by_learning_rate``.

  References:
    Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS
    2018 (https://papers.nips.cc/paper/8186).
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

  The update is ``-learning_rate * m_hat / (sqrt(nu_max + eps_root) + eps)``
  with ``nu_max = max(nu_max, nu_hat)``, so the per-coordinate step size
  never grows.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    mu_dtype: dtype of the first moment; ``None`` (default) uses the
      params' dtype.
    bias_correction_mu: whether to debias the first moment (default True;
      False follows the paper).
    bias_correction_nu: whether to debias the second moment before the
      maximum (default True; False follows the paper).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_amsgrad`` then
    ``scale_by_learning_rate``.

  References:
    Reddi et al., "On the Convergence of Adam and Beyond", ICLR 2018
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
  """RAdam: Adam with its step rectified while the variance estimate is young.

  With ``rho_inf = 2 / (1 - b2) - 1`` and
  ``rho_t = rho_inf - 2 t b2**t / (1 - b2**t)``, the update is
  ``-learning_rate * r_t * m_hat / (sqrt(v_hat + eps_root) + eps)`` when
  ``rho_t >= threshold`` (``r_t`` the variance rectification) and
  ``-learning_rate * m_hat`` (momentum SGD) before.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    b1: decay of the first moment (default 0.9).
    b2: decay of the second moment (default 0.999).
    eps: added to the root of the second moment (default 1e-8).
    eps_root: added to the second moment inside the root (default 0.0).
    threshold: the ``rho_t`` from which the adaptive step is used
      (default 5.0).
    nesterov: whether to use Nesterov momentum (default False).

  Returns:
    A ``GradientTransformationExtraArgs``: ``scale_by_radam`` then
    ``scale_by_learning_rate``.

  References:
    Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond",
    ICLR 2020 (https://arxiv.org/abs/1908.03265).
  """
  return combine.chain(
      adam_lib.scale_by_radam(
          b1=b1, b2=b2, eps=eps, eps_root=eps_root, threshold=threshold,
          nesterov=nesterov),
      scaling.scale_by_learning_rate(learning_rate),
  )
