"""L-BFGS direction: the update times a limited-memory inverse-Hessian estimate.

The memory holds the last ``memory_size`` differences of params and of
updates, each stacked along a new leading axis in front of the param's own
axes, so it is sharded like the params (the memory axis is replicated).
"""

from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src import tree_reductions

__all__ = [
    "ScaleByLBFGSState",
    "scale_by_lbfgs",
]


class ScaleByLBFGSState(NamedTuple):
  """Step count, the previous params and updates, and the ring buffers of
  their differences with the weights ``1 / <dw, du>``."""

  count: jax.Array  # int32 scalar
  params: base.Params
  updates: base.Params
  diff_params_memory: Any
  diff_updates_memory: Any
  weights_memory: jax.Array  # (memory_size,)


def _stacked_zeros(leaf: jax.Array, memory_size: int) -> jax.Array:
  """``memory_size`` zero copies of ``leaf`` stacked on a new leading axis."""
  return jnp.stack([jnp.zeros_like(leaf)] * memory_size)


def _axpy(scalar, x: Any, y: Any) -> Any:
  """``y + scalar * x``, each leaf in ``y``'s dtype."""
  return jax.tree.map(lambda a, b: (b + scalar * a).astype(b.dtype), x, y)


def _two_loop(updates, diff_params, diff_updates, weights, identity_scale,
              oldest):
  """Nocedal & Wright's two-loop recursion (Algorithm 7.4): H_k @ updates.

  Slots are visited from the newest (``oldest - 1``) back to the oldest, then
  forward again; never-filled slots have weight 0 and change nothing.
  """
  memory_size = weights.shape[0]
  order = (oldest + jnp.arange(memory_size)) % memory_size

  def slot(i):
    return jax.tree.map(lambda m: m[i], (diff_params, diff_updates))

  def backward(vec, i):
    dw, du = slot(i)
    alpha = weights[i] * tree_math.tree_vdot(dw, vec)
    return _axpy(-alpha, du, vec), alpha

  vec, alphas = jax.lax.scan(backward, updates, order, reverse=True)
  vec = jax.tree.map(lambda x: identity_scale * x, vec)

  def forward(vec, i_alpha):
    i, alpha = i_alpha
    dw, du = slot(i)
    beta = weights[i] * tree_math.tree_vdot(du, vec)
    return _axpy(alpha - beta, dw, vec), beta

  vec, _ = jax.lax.scan(forward, vec, (order, alphas))
  return vec


def scale_by_lbfgs(
    memory_size: int = 10,
    scale_init_precond: bool = True,
) -> base.GradientTransformation:
  """The L-BFGS direction ``H_k u_k`` for updates (gradients) ``u_k``.

  ``H_k`` is built by the two-loop recursion from the last ``memory_size``
  pairs (``w_{k+1} - w_k``, ``u_{k+1} - u_k``), starting from ``gamma I``:
  with ``scale_init_precond``, ``gamma = <dw, du> / <du, du>`` of the newest
  pair (and ``min(1, 1 / ||u_0||)`` at the first step), else 1. Needs the
  params; chain it with a (zoom) line search, as ``shardopt.lbfgs`` does.
  The memory is ``memory_size`` copies of each param, each with the param's
  sharding.

  Args:
    memory_size: number of past difference pairs kept (default 10; below 1
      raises ValueError).
    scale_init_precond: whether to scale the initial inverse Hessian by
      ``gamma`` (default True).

  Returns:
    A ``GradientTransformation`` whose state is a ``ScaleByLBFGSState``.

  References:
    Nocedal & Wright, "Numerical Optimization", 1999, Algorithms 7.4 and
    7.5; Liu & Nocedal, "On the limited memory BFGS method for large scale
    optimization", Math. Prog. 1989 (https://doi.org/10.1007/BF01589116).
  """
  if memory_size < 1:
    raise ValueError(
        f"scale_by_lbfgs: memory_size must be >= 1, got {memory_size}")

  def init_fn(params):
    memory = jax.tree.map(lambda p: _stacked_zeros(p, memory_size), params)
    return ScaleByLBFGSState(
        count=jnp.zeros([], jnp.int32),
        params=tree_math.tree_zeros_like(params),
        updates=tree_math.tree_zeros_like(params),
        diff_params_memory=memory,
        diff_updates_memory=memory,
        weights_memory=jnp.zeros([memory_size]),  # not param-shaped
    )

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "scale_by_lbfgs needs the params: call update(updates, state, params)")
    started = state.count > 0
    oldest = state.count % memory_size
    newest = (state.count - 1) % memory_size
    dw = tree_math.tree_sub(params, state.params)
    du = tree_math.tree_sub(updates, state.updates)
    curvature = tree_math.tree_vdot(du, dw)
    weight = jnp.where(curvature == 0.0, 0.0, 1.0 / curvature)
    # Nothing to remember before the first step.
    dw, du, weight = jax.tree.map(
        lambda x: jnp.where(started, x, jnp.zeros_like(x)), (dw, du, weight))
    diff_params, diff_updates, weights = jax.tree.map(
        lambda memory, new: memory.at[newest].set(
            new, out_sharding=jax.typeof(memory).sharding),
        (state.diff_params_memory, state.diff_updates_memory,
         state.weights_memory),
        (dw, du, weight))
    if scale_init_precond:
      sq_du = tree_reductions.tree_sum(jax.tree.map(numerics.abs_sq, du))
      ratio = jnp.where(sq_du > 0.0, curvature / sq_du, 1.0)
      first = jnp.minimum(
          1.0, 1.0 / tree_math.global_norm(jax.lax.stop_gradient(updates)))
      # Computed in float32 (or wider), applied in the float type the
      # updates promote to with a float, as optax's: bfloat16 or float16
      # updates stay so, integer leaves become float.
      identity_scale = jnp.where(started, ratio, first).astype(
          jnp.result_type(*jax.tree.leaves(updates), 1.0))
    else:
      identity_scale = 1.0
    direction = _two_loop(updates, diff_params, diff_updates, weights,
                          identity_scale, oldest)
    return direction, ScaleByLBFGSState(
        count=numerics.safe_increment(state.count),
        params=params,
        updates=updates,
        diff_params_memory=diff_params,
        diff_updates_memory=diff_updates,
        weights_memory=weights,
    )

  return base.GradientTransformation(init_fn, update_fn)
