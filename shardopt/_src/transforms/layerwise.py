"""Scaling each update block (leaf) by norms of its param and of itself."""

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src.transforms.constraints import require_params

__all__ = [
    "ScaleByTrustRatioState",
    "scale_by_param_block_norm",
    "scale_by_param_block_rms",
    "scale_by_trust_ratio",
]

ScaleByTrustRatioState = base.EmptyState


def _per_param_block(name: str, scale_fn) -> base.GradientTransformation:
  """A stateless transform mapping (update, param) -> update * scale_fn(...)."""

  def update_fn(updates, state, params=None):
    require_params(params, name)
    return jax.tree.map(scale_fn, updates, params), state

  return base.GradientTransformation(base.init_empty_state, update_fn)


def scale_by_param_block_norm(
    min_scale: jax.typing.ArrayLike = 1e-3,
) -> base.GradientTransformation:
  """Multiplies each update by ``max(||param||, min_scale)``, its param's L2 norm.

  Needs the params.

  Args:
    min_scale: floor of the param norm (default 1e-3).

  Returns:
    A stateless ``GradientTransformation``.

  References:
    The relative step size of Shazeer & Stern, "Adafactor: Adaptive Learning
    Rates with Sublinear Memory Cost", ICML 2018
    (https://arxiv.org/abs/1804.04235), Sec. 8, with the L2 norm in place of
    the RMS.
  """
  return _per_param_block(
      "scale_by_param_block_norm",
      lambda u, p: u * numerics.safe_norm(p, min_scale),
  )


def scale_by_param_block_rms(
    min_scale: jax.typing.ArrayLike = 1e-3,
) -> base.GradientTransformation:
  """Multiplies each update by ``max(rms(param), min_scale)``, its param's RMS.

  Needs the params.

  Args:
    min_scale: floor of the param's root mean square (default 1e-3).

  Returns:
    A stateless ``GradientTransformation``.

  References:
    Shazeer & Stern, "Adafactor: Adaptive Learning Rates with Sublinear
    Memory Cost", ICML 2018 (https://arxiv.org/abs/1804.04235), Sec. 8
    (relative step size).
  """
  return _per_param_block(
      "scale_by_param_block_rms",
      lambda u, p: u * numerics.safe_root_mean_squares(p, min_scale),
  )


def scale_by_trust_ratio(
    min_norm: jax.typing.ArrayLike = 0.0,
    trust_coefficient: jax.typing.ArrayLike = 1.0,
    eps: jax.typing.ArrayLike = 0.0,
) -> base.GradientTransformation:
  """Scales each update by the layer-wise trust ratio of LARS/LAMB.

  Each update ``u`` of param ``p`` becomes ``u * trust_coefficient * ||p|| /
  (||u|| + eps)``, both norms floored at ``min_norm``; the ratio is 1 where
  either norm is zero. Needs the params.

  Args:
    min_norm: floor of both norms (default 0.0).
    trust_coefficient: multiplier of the ratio (default 1.0).
    eps: added to the update norm (default 0.0).

  Returns:
    A stateless ``GradientTransformation`` (state
    ``ScaleByTrustRatioState``, empty).

  References:
    You et al., "Large Batch Training of Convolutional Networks", 2017
    (https://arxiv.org/abs/1708.03888); You et al., "Large Batch
    Optimization for Deep Learning: Training BERT in 76 minutes", ICLR 2020
    (https://arxiv.org/abs/1904.00962).
  """

  def scale_leaf(u, p):
    param_norm = numerics.safe_norm(p, min_norm)
    update_norm = numerics.safe_norm(u, min_norm)
    ratio = trust_coefficient * param_norm / (update_norm + eps)
    either_zero = jnp.logical_or(param_norm == 0.0, update_norm == 0.0)
    return u * jnp.where(either_zero, jnp.array(1.0, dtype=p.dtype), ratio)

  return _per_param_block("scale_by_trust_ratio", scale_leaf)
