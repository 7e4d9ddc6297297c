"""GaLore: the base optimizer runs on a low-rank projection of each matrix.

Same names, signatures, defaults, state and numbers as ``optax.contrib``'s
``galore`` (0.2.8). The projectors and the low-rank proxies that the base
optimizer's state is built on are derived from reductions of the param
(its row and column sums), so on a mesh a projector keeps the mesh axis of
the param dimension it spans, and the base state keeps the other one.
"""

from collections.abc import Callable
from collections.abc import Sequence
import math
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import typed_layouts
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.wrappers import combine
from shardopt.contrib._matrix_axes import as_matrix_stack
from shardopt.contrib._matrix_axes import split_axes

__all__ = ["GaLoreDimensionNumbers", "GaLoreState", "galore",
           "scale_by_galore"]


class GaLoreDimensionNumbers(NamedTuple):
  """Which axes of a weight form the (reduction, output) matrix GaLore
  projects; every axis must be named (no batch axes)."""

  reduction_axis: Sequence[int] | int = 0
  output_axis: Sequence[int] | int = 1


GaLoreDimNumsOrFn = GaLoreDimensionNumbers | Any | Callable[[Any], Any]


# The base optimizer's moments are of the projected gradient, not of the
# param's elements: quantized_state keeps them as they are. (At a rank that
# reaches a param's shorter side they have the param's shape, and quantized
# with the param's tiles they moved Adam's updates well past the error the
# param's own moments give at the same width.)
@moments.declare_moments(kept={
    "base_optimizer_state": "moments of the projected gradient, not of the param"})
class GaLoreState(NamedTuple):
  """Step count, the base optimizer's (low-rank) state, the projectors."""

  count: jax.Array  # int32 scalar
  base_optimizer_state: base.OptState
  projector: base.Updates


def _is_dims_leaf(x) -> bool:
  return x is None or isinstance(x, GaLoreDimensionNumbers)


class _Matrix(NamedTuple):
  """How a param is read as an (m, n) matrix and which side is projected."""

  to_2d: Callable
  from_2d: Callable
  rank: int
  left: bool  # project the rows (m >= n): P is (m, r), P^T G is (r, n)


def _matrix(shape, dims, rank) -> _Matrix:
  batch, reduction, output = split_axes(shape, dims, "GaLore")
  if batch:
    raise ValueError(
        f"GaLore: dimension numbers {dims} leave axes {batch} of shape "
        f"{shape} unnamed; name every axis as a reduction or output axis.")
  m = math.prod(shape[a] for a in reduction)
  n = math.prod(shape[a] for a in output)
  to_stack, from_stack = as_matrix_stack(shape, dims, "GaLore")
  return _Matrix(lambda x: to_stack(x)[0], lambda x: from_stack(x[None]),
                 min(rank, m, n), m >= n)


def _zeros_along(vector, width, first: bool):
  """Zeros of shape (len, width) (``first``) or (width, len), laid out along
  ``vector``'s sharding on its dimension."""
  column = jnp.zeros_like(vector)
  return (jnp.broadcast_to(column[:, None], (column.shape[0], width)) if first
          else jnp.broadcast_to(column[None, :], (width, column.shape[0])))


def _projector_and_proxy(param, dims, rank):
  """Zero projector and low-rank proxy of one param, from its row/column
  sums so they carry its shardings."""
  if dims is None:
    return jnp.zeros((0, 0), param.dtype), jnp.zeros_like(param)
  matrix = _matrix(param.shape, dims, rank)
  p2d = matrix.to_2d(param)
  rows, cols = jnp.sum(p2d, axis=1), jnp.sum(p2d, axis=0)
  if matrix.left:
    return (_zeros_along(rows, matrix.rank, True),
            _zeros_along(cols, matrix.rank, False))
  return (_zeros_along(cols, matrix.rank, True),
          _zeros_along(rows, matrix.rank, True))


def _project(projector, grad_2d, left: bool):
  """The low-rank gradient, split along the kept dimension as the proxy
  ``_projector_and_proxy`` built is (on Explicit axes the contraction over
  a split dimension must say where its sum goes)."""
  out = None
  sharding = typed_layouts.explicit_sharding(grad_2d)
  if sharding is not None:
    spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    out = sharding.update(spec=P(None, spec[1]) if left else P(spec[0], None))
  if left:
    return jnp.matmul(projector.T, grad_2d, out_sharding=out)
  return jnp.matmul(grad_2d, projector, out_sharding=out)


def _svd_projector(grad_2d, matrix: _Matrix):
  u, _, vh = jnp.linalg.svd(typed_layouts.whole(grad_2d).astype(jnp.float32),
                            full_matrices=False)
  chosen = u[:, :matrix.rank] if matrix.left else vh[:matrix.rank, :].T
  return chosen.astype(grad_2d.dtype)


def _unzip(tree, pairs):
  return jax.tree.transpose(jax.tree.structure(tree),
                            jax.tree.structure((0, 0)), pairs)


def scale_by_galore(
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: float = 1.0,
    base_optimizer: base.GradientTransformation | None = None,
    weight_dimension_numbers: GaLoreDimNumsOrFn | None = None,
) -> base.GradientTransformation:
  """Runs ``base_optimizer`` on ``P^T G`` (or ``G P``) and returns
  ``scale * P (update)``; ``P`` holds the top singular vectors of the
  gradient, recomputed every ``update_proj_gap`` steps.

  ``base_optimizer`` must not need the params (``scale_by_adam``, not
  ``adamw``); use ``galore``'s ``weight_decay`` for decay.

  Args:
    rank: the projection's rank (at most the matrix's smaller side).
    update_proj_gap: steps between SVDs of the gradient.
    scale: factor on the projected-back updates.
    base_optimizer: the low-rank optimizer (default ``scale_by_adam()``).
    weight_dimension_numbers: None (project the 2-D params), one
      ``GaLoreDimensionNumbers`` for every param of rank >= 2, a tree of
      them (None: not projected) or a function of the params giving one.

  Returns:
    A ``GradientTransformation`` whose state is a ``GaLoreState``.

  References:
    Zhao et al., "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
    Projection", ICML 2024 (https://arxiv.org/abs/2403.03507).
  """
  base_optimizer = (adam_lib.scale_by_adam() if base_optimizer is None
                    else base_optimizer)
  if not isinstance(rank, int):
    raise TypeError(f"rank must be an int, got {type(rank).__name__}")
  if rank <= 0:
    raise ValueError(f"rank={rank}: must be positive")

  def dims_of(tree):
    spec = weight_dimension_numbers
    if spec is None:
      return jax.tree.map(
          lambda p: GaLoreDimensionNumbers() if p.ndim == 2 else None, tree)
    if callable(spec):
      return spec(tree)
    if isinstance(spec, GaLoreDimensionNumbers):
      return jax.tree.map(lambda p: spec if p.ndim >= 2 else None, tree)
    return spec

  def init_fn(params):
    if not jax.tree.leaves(params):
      return GaLoreState(jnp.zeros([], jnp.int32), base_optimizer.init(params),
                         params)
    pairs = jax.tree.map(lambda p, d: _projector_and_proxy(p, d, rank),
                         params, dims_of(params), is_leaf=_is_dims_leaf)
    projectors, proxies = _unzip(params, pairs)
    return GaLoreState(jnp.zeros([], jnp.int32), base_optimizer.init(proxies),
                       projectors)

  def update_fn(updates, state, params=None):
    del params
    refresh = state.count % update_proj_gap == 0
    dims = dims_of(updates)

    def project(grad, projector, d):
      if d is None:
        return grad, projector
      matrix = _matrix(grad.shape, d, rank)
      grad_2d = matrix.to_2d(grad)
      fresh = lambda: typed_layouts.laid_out_like(
          _svd_projector(grad_2d, matrix), projector)
      projector = jax.lax.cond(refresh, fresh, lambda: projector)
      return _project(projector, grad_2d, matrix.left), projector

    def project_back(low_update, projector, grad, d):
      if d is None:
        return low_update
      matrix = _matrix(grad.shape, d, rank)
      full = (projector @ low_update if matrix.left
              else low_update @ projector.T)
      return (scale * matrix.from_2d(full)).astype(grad.dtype)

    low, projectors = _unzip(updates, jax.tree.map(
        project, updates, state.projector, dims, is_leaf=_is_dims_leaf))
    low_updates, base_state = base_optimizer.update(
        low, state.base_optimizer_state, None)
    full = jax.tree.map(project_back, low_updates, projectors, updates, dims,
                        is_leaf=_is_dims_leaf)
    return full, GaLoreState(numerics.safe_increment(state.count), base_state,
                             projectors)

  return base.GradientTransformation(init_fn, update_fn)


def galore(
    learning_rate: base.ScalarOrSchedule,
    rank: int = 128,
    update_proj_gap: int = 200,
    scale: float = 1.0,
    base_optimizer: base.GradientTransformation | None = None,
    weight_decay: jax.typing.ArrayLike = 0.0,
    mask: base.MaskOrFn = None,
    weight_dimension_numbers: GaLoreDimNumsOrFn | None = None,
) -> base.GradientTransformation:
  """GaLore: ``scale_by_galore``, decoupled weight decay in the full space,
  then the learning rate.

  Args:
    learning_rate: a scalar or a schedule of the step count.
    rank: the projection's rank.
    update_proj_gap: steps between SVDs of the gradient.
    scale: factor on the projected-back updates.
    base_optimizer: the low-rank optimizer (default ``scale_by_adam()``);
      one that needs no params.
    weight_decay: decoupled weight decay.
    mask: which params decay (tree or function of params).
    weight_dimension_numbers: which params are projected, as in
      ``scale_by_galore``.

  Returns:
    A ``GradientTransformation`` (a chain) whose first state is a
    ``GaLoreState``.

  References:
    Zhao et al., "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
    Projection", ICML 2024 (https://arxiv.org/abs/2403.03507).
  """
  return combine.chain(
      scale_by_galore(rank=rank, update_proj_gap=update_proj_gap, scale=scale,
                      base_optimizer=base_optimizer,
                      weight_dimension_numbers=weight_dimension_numbers),
      weight_decay_lib.add_decayed_weights(weight_decay, mask),
      scaling.scale_by_learning_rate(learning_rate))
