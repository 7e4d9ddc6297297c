"""Muon: momentum orthogonalised by Newton-Schulz, Adam for the rest.

Same names, signatures, defaults, state and numbers as ``optax.contrib``'s
muon (0.2.8). The momentum is ``zeros_like`` of the params, so its shardings
are derived like Adam's; the orthogonalisation (``_newton_schulz``) is plain
matmuls that XLA partitions over the matrix's shards.
"""

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import jax
import jax.numpy as jnp

from shardopt._src import base
from shardopt._src import moments
from shardopt._src import numerics
from shardopt._src import tree_math
from shardopt._src.aliases import adam as adam_aliases
from shardopt._src.transforms import adam as adam_lib
from shardopt._src.transforms import scaling
from shardopt._src.transforms import weight_decay as weight_decay_lib
from shardopt._src.transforms.momentum import canonical_dtype
from shardopt._src.wrappers import combine
from shardopt.contrib import _newton_schulz as ns
from shardopt.contrib._matrix_axes import fan_in_and_out
from shardopt.contrib._newton_schulz import MuonDimensionNumbers

__all__ = ["MuonDimensionNumbers", "MuonState", "muon", "scale_by_muon"]

_STANDARD_COEFFS = (3.4445, -4.7750, 2.0315)
_PRESETS = {
    "standard": _STANDARD_COEFFS,
    "dion": [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377),
             (3.7418, -5.5913, 2.3037), (2.8769, -3.1427, 1.2046),
             (2.8366, -3.0525, 1.2012)],
}

# A MuonDimensionNumbers for every param, a tree of them (None: not a muon
# param; a prefix covers a subtree) or a function of the params giving one.
WeightDimNumOrFn = MuonDimensionNumbers | Any | Callable[[Any], Any]


def _is_spec_leaf(x) -> bool:
  return x is None or isinstance(x, MuonDimensionNumbers)


def _dims_per_leaf(spec: WeightDimNumOrFn | None, tree) -> Any:
  """A MuonDimensionNumbers (or None) for every leaf of ``tree``."""
  spec = spec(tree) if callable(spec) else spec
  if spec is None or isinstance(spec, MuonDimensionNumbers):
    return jax.tree.map(lambda _: spec, tree)
  return jax.tree.map(lambda d, sub: jax.tree.map(lambda _: d, sub), spec,
                      tree, is_leaf=_is_spec_leaf)


def _map_with_dims(fn, tree, dims):
  """``fn(leaf, dims)`` for every leaf of ``tree``; None leaves stay None."""
  return jax.tree.map(lambda d, x: None if x is None else fn(x, d), dims, tree,
                      is_leaf=_is_spec_leaf)


@moments.declare_moments(mu=moments.SIGNED)
class MuonState(NamedTuple):
  """Step count, momentum ``mu`` and the Newton-Schulz coefficients."""

  count: jax.Array  # int32 scalar
  mu: base.Updates
  ns_coeffs: jax.Array  # (3,) or (steps, 3)


def _coefficients(ns_coeffs, ns_steps) -> jax.Array:
  coeffs = jnp.asarray(ns_coeffs)
  if coeffs.ndim not in (1, 2) or coeffs.shape[-1] != 3:
    raise ValueError(
        f"ns_coeffs must have shape (3,) or (n, 3), got {coeffs.shape}")
  if coeffs.ndim == 2:
    if coeffs.shape[0] > ns_steps:
      raise ValueError(f"{coeffs.shape[0]} rows of ns_coeffs for "
                       f"ns_steps={ns_steps}: give at most ns_steps rows")
    coeffs = coeffs[-ns_steps:]
  return coeffs


def scale_by_muon(
    ns_coeffs: tuple = _STANDARD_COEFFS,
    ns_steps: int = 5,
    beta: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = "frobenius",
    weight_dimension_numbers: WeightDimNumOrFn | None = None,
) -> base.GradientTransformation:
  """Orthogonalised momentum: Newton-Schulz applied to Muon's momentum.

  Args:
    ns_coeffs: quintic Newton-Schulz coefficients, (3,) or one row per step.
    ns_steps: number of iterations (ignored for per-step coefficients).
    beta: decay of the momentum.
    eps: added to denominators.
    mu_dtype: storage dtype of the momentum (default: the params').
    nesterov: whether to look one momentum step ahead.
    adaptive: whether to scale each update by <momentum, update> (the dual
      norm of the momentum).
    preconditioning: 'frobenius', 'spectral', 'aol' or 'schatten'.
    weight_dimension_numbers: a ``MuonDimensionNumbers`` per param (a tree,
      a prefix of one, or a function of the updates); None means every param
      is a 2-D matrix.

  Returns:
    A ``GradientTransformation`` whose state is a ``MuonState``.

  References:
    Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024
    (https://kellerjordan.github.io/posts/muon/); Bernstein & Newhouse, "Old
    Optimizer, New Norm: An Anthology", 2024 (https://arxiv.org/abs/2409.20325).
  """
  mu_dtype = canonical_dtype(mu_dtype)

  def init_fn(params):
    return MuonState(count=jnp.zeros([], jnp.int32),
                     mu=tree_math.tree_zeros_like(params, dtype=mu_dtype),
                     ns_coeffs=_coefficients(ns_coeffs, ns_steps))

  def update_fn(updates, state, params=None):
    del params
    dims = _dims_per_leaf(weight_dimension_numbers, updates)
    mu = tree_math.update_moment(updates, state.mu, beta, 1)
    count = numerics.safe_increment(state.count)
    mu_hat = adam_lib.debiased_first_moment(updates, mu, beta, count, nesterov)
    orthogonal = _map_with_dims(
        lambda x, d: ns.orthogonalize_via_newton_schulz(
            x, state.ns_coeffs, ns_steps, preconditioning, eps, d),
        mu_hat, dims)
    if adaptive:
      orthogonal = jax.tree.map(lambda m, o: jnp.sum(m.conj() * o) * o,
                                mu_hat, orthogonal)
    return orthogonal, MuonState(count=count,
                                 mu=tree_math.tree_cast(mu, mu_dtype),
                                 ns_coeffs=state.ns_coeffs)

  return base.GradientTransformation(init_fn, update_fn)


def _scale_by_shape(weight_dimension_numbers, consistent_rms):
  """Muon's per-matrix scale: sqrt(max(1, fan_out / fan_in)) (width
  transfer) or sqrt(max(fan_in, fan_out)) * consistent_rms."""

  def scale_leaf(x, dims):
    fan_in, fan_out = fan_in_and_out(x.shape, dims)
    if consistent_rms is None:
      return jnp.sqrt(jnp.maximum(1, fan_out / fan_in)) * x
    return jnp.sqrt(jnp.maximum(fan_in, fan_out)) * consistent_rms * x

  def update_fn(updates, state, params=None):
    del params
    dims = _dims_per_leaf(weight_dimension_numbers, updates)
    return _map_with_dims(scale_leaf, updates, dims), state

  return base.GradientTransformation(base.init_empty_state, update_fn)


def _labels_fn(weight_dimension_numbers):
  """params -> 'muon' where a param has dimension numbers, else 'adam'."""
  if weight_dimension_numbers is None:
    return lambda params: jax.tree.map(
        lambda p: "muon" if p.ndim == 2 else "adam", params)
  return lambda params: jax.tree.map(
      lambda d: "adam" if d is None else "muon",
      _dims_per_leaf(weight_dimension_numbers, params), is_leaf=_is_spec_leaf)


def muon(
    learning_rate: base.ScalarOrSchedule,
    ns_coeffs: tuple | str = _STANDARD_COEFFS,
    ns_steps: int = 5,
    beta: jax.typing.ArrayLike = 0.95,
    eps: jax.typing.ArrayLike = 1e-8,
    weight_decay: jax.typing.ArrayLike = 0.0,
    weight_decay_mask: base.MaskOrFn = None,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = "frobenius",
    adam_b1: jax.typing.ArrayLike = 0.9,
    adam_b2: jax.typing.ArrayLike = 0.999,
    adam_eps_root: jax.typing.ArrayLike = 0.0,
    adam_weight_decay: jax.typing.ArrayLike = 0.0,
    adam_learning_rate: base.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: WeightDimNumOrFn | None = None,
    consistent_rms: jax.typing.ArrayLike | None = None,
) -> base.GradientTransformationExtraArgs:
  """Muon for the matrices, AdamW for every other param.

  A param is a Muon matrix when it is 2-D (default) or when
  ``muon_weight_dimension_numbers`` gives it dimension numbers (None marks
  the AdamW params). On a mesh, Muon's momentum is sharded like its param
  and the Newton-Schulz matmuls are partitioned by XLA
  (benchmarks/results/muon_communication.md counts what they communicate).

  Args:
    learning_rate: a scalar or a schedule of the step count.
    ns_coeffs: Newton-Schulz coefficients, or a preset: 'standard', 'dion'.
    ns_steps: number of Newton-Schulz iterations.
    beta: decay of the momentum.
    eps: added to denominators (Muon's and Adam's).
    weight_decay: decoupled weight decay of the Muon params (times the
      learning rate).
    weight_decay_mask: which Muon params decay (tree or function of params).
    mu_dtype: storage dtype of both momenta.
    nesterov: Nesterov momentum (Muon and Adam).
    adaptive: scale Muon's updates by the dual norm of the momentum.
    preconditioning: 'frobenius', 'spectral', 'aol' or 'schatten'.
    adam_b1: Adam's first-moment decay.
    adam_b2: Adam's second-moment decay.
    adam_eps_root: Adam's epsilon inside the square root.
    adam_weight_decay: AdamW's weight decay.
    adam_learning_rate: Adam's learning rate (default: ``learning_rate``).
    muon_weight_dimension_numbers: which params are Muon matrices and how to
      read them as matrices (see ``scale_by_muon``).
    consistent_rms: if set, scale updates by
      ``sqrt(max(fan_in, fan_out)) * consistent_rms``; else by
      ``sqrt(max(1, fan_out / fan_in))``.

  Returns:
    A ``partition`` of the Muon chain and AdamW, labelled 'muon'/'adam'.

  References:
    Jordan, "Muon: An optimizer for hidden layers in neural networks", 2024
    (https://kellerjordan.github.io/posts/muon/); Liu et al., "Muon is
    Scalable for LLM Training", 2025 (https://arxiv.org/abs/2502.16982).
  """
  if isinstance(ns_coeffs, str):
    if ns_coeffs not in _PRESETS:
      raise ValueError(f"ns_coeffs={ns_coeffs!r}: use a preset of "
                       f"{sorted(_PRESETS)} or the coefficients")
    ns_coeffs = _PRESETS[ns_coeffs]
  dims = muon_weight_dimension_numbers
  inner_dims = MuonDimensionNumbers() if dims is None else dims
  return combine.partition(
      transforms={
          "muon": combine.chain(
              scale_by_muon(ns_coeffs, ns_steps, beta, eps, mu_dtype,
                            nesterov=nesterov, adaptive=adaptive,
                            preconditioning=preconditioning,
                            weight_dimension_numbers=inner_dims),
              _scale_by_shape(inner_dims, consistent_rms),
              weight_decay_lib.add_decayed_weights(weight_decay,
                                                   weight_decay_mask),
              scaling.scale_by_learning_rate(learning_rate),
          ),
          "adam": adam_aliases.adamw(
              learning_rate=(learning_rate if adam_learning_rate is None
                             else adam_learning_rate),
              b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root,
              weight_decay=adam_weight_decay, mu_dtype=mu_dtype,
              nesterov=nesterov),
      },
      param_labels=_labels_fn(dims),
  )
