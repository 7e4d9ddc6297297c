"""shardopt: optax-style gradient transformations with sharded optimizer state.

``import shardopt as optax`` keeps optax code working (the README lists what it
covers); every transformation builds its state from the params, so the
state's shardings are derived from the params' (``shardopt.sharding``).

Public namespaces: ``shardopt`` (this curated list), ``shardopt.schedules``,
``shardopt.tree``, ``shardopt.tree_utils``, ``shardopt.transforms``, ``shardopt.losses``,
``shardopt.microbatching``, ``shardopt.assignment``, ``shardopt.projections``,
``shardopt.perturbations``, ``shardopt.second_order`` (deprecated, as in optax),
``shardopt.contrib`` and ``shardopt.sharding``. The
implementation lives in ``shardopt._src`` (see docs/architecture.md).
"""

import warnings as _warnings

from shardopt import assignment
from shardopt import contrib
from shardopt import losses
from shardopt import microbatching
from shardopt import perturbations
from shardopt import projections
from shardopt import schedules
from shardopt import second_order
from shardopt import sharding
from shardopt import transforms
from shardopt import tree
from shardopt import tree_utils

# Types and building blocks
from shardopt._src.base import (
    EmptyState, GradientTransformation, GradientTransformationExtraArgs, identity,
    init_empty_state, MaskOrFn, OptState, Params, ScalarOrSchedule, Schedule, set_to_zero,
    stateless, stateless_with_tree_map, TransformInitFn, TransformUpdateExtraArgsFn,
    TransformUpdateFn, Updates, value_at, with_extra_args_support,
)
from shardopt._src.linear_algebra import matrix_inverse_pth_root, nnls, power_iteration
from shardopt._src.microbatching import microbatch
from shardopt._src.multi_normal import multi_normal
from shardopt._src.numerics import (
    abs_sq, safe_increment, safe_int32_increment, safe_norm, safe_root_mean_squares,
)
from shardopt._src.scale_gradient import scale_gradient
from shardopt._src.target_params import incremental_update, periodic_update
from shardopt._src.tree_map_params import tree_map_params
from shardopt._src.tree_math import (
    apply_updates, bias_correction, global_norm, update_infinity_moment, update_moment,
    update_moment_per_elem_norm,
)

# Gradient transformations
from shardopt._src.transforms.adam import scale_by_adam, scale_by_radam, ScaleByAdamState
from shardopt._src.transforms.adadelta import scale_by_adadelta, ScaleByAdaDeltaState
from shardopt._src.transforms.adam_variants import (
    scale_by_adamax, scale_by_amsgrad, scale_by_belief, scale_by_yogi, ScaleByAmsgradState,
    ScaleByBeliefState,
)
from shardopt._src.transforms.adan import scale_by_adan, ScaleByAdanState
from shardopt._src.transforms.clipping import (
    adaptive_grad_clip, AdaptiveGradClipState, clip, clip_by_block_rms, clip_by_global_norm,
    ClipByGlobalNormState, ClipState,
)
from shardopt._src.transforms.constraints import (
    keep_params_nonnegative, NonNegativeParamsState, zero_nans, ZeroNansState,
)
from shardopt._src.transforms.distance_over_gradients import (
    scale_by_distance_over_gradients, ScaleByDistanceOverGradientsState,
)
from shardopt._src.transforms.factored_rms import FactoredState, scale_by_factored_rms
from shardopt._src.transforms.layerwise import (
    scale_by_param_block_norm, scale_by_param_block_rms, scale_by_trust_ratio,
    ScaleByTrustRatioState,
)
from shardopt._src.transforms.lbfgs import scale_by_lbfgs, ScaleByLBFGSState
from shardopt._src.transforms.momentum import ema, EmaState, trace, TraceState
from shardopt._src.transforms.noise import add_noise, AddNoiseState
from shardopt._src.transforms.normalization import centralize, normalize_by_update_norm
from shardopt._src.transforms.novograd import scale_by_novograd, ScaleByNovogradState
from shardopt._src.transforms.optimistic import (
    scale_by_optimistic_gradient, ScaleByOptimisticGradientState,
)
from shardopt._src.transforms.per_example_clipping import (
    per_example_global_norm_clip, per_example_layer_norm_clip,
)
from shardopt._src.transforms.polyak import scale_by_polyak
from shardopt._src.transforms.rms import (
    scale_by_rms, scale_by_rss, scale_by_stddev, ScaleByRmsState, ScaleByRmsWithCountState,
    ScaleByRssState, ScaleByRStdDevState, ScaleByRStdDevWithCountState,
)
from shardopt._src.transforms.scaling import (
    scale, scale_by_learning_rate, scale_by_schedule, ScaleByScheduleState, ScaleState,
)
from shardopt._src.transforms.sign import (
    scale_by_lion, scale_by_rprop, scale_by_sign, ScaleByLionState, ScaleByRpropState,
)
from shardopt._src.transforms.sm3 import scale_by_sm3, ScaleBySM3State
from shardopt._src.transforms.weight_decay import (
    add_decayed_weights, AddDecayedWeightsState, WeightDecaySchedule,
)

# Combinators and wrappers
from shardopt._src.wrappers.combine import (
    chain, multi_transform, MultiTransformState, named_chain, partition, PartitionState,
    selective_transform,
)
from shardopt._src.wrappers.conditional import (
    apply_if_finite, ApplyIfFiniteState, conditionally_mask, conditionally_transform,
    ConditionallyMaskState, ConditionallyTransformState, ConditionFn, skip_large_updates,
    skip_not_finite,
)
from shardopt._src.wrappers.flatten import flatten
from shardopt._src.wrappers.inject_hyperparams import (
    inject_hyperparams, inject_stateful_hyperparams, InjectHyperparamsState,
    InjectStatefulHyperparamsState, WrappedSchedule,
)
from shardopt._src.wrappers.lookahead import lookahead, LookaheadParams, LookaheadState
from shardopt._src.wrappers.low_precision import low_precision_state
from shardopt._src.wrappers.low_precision_params import (
    low_precision_params, LowPrecisionParamsState,
)
from shardopt._src.wrappers.masking import freeze, masked, MaskedNode, MaskedState
from shardopt._src.wrappers.monitoring import (
    measure_with_ema, monitor, MonitorState, snapshot, SnapshotState,
)
from shardopt._src.wrappers.multi_steps import (
    apply_every, ApplyEvery, MultiSteps, MultiStepsState, ShouldSkipUpdateFunction,
)
from shardopt._src.moments import declare_moments
from shardopt._src.quantization.quantized_array import QuantizedArray
from shardopt._src.quantization.quantized_array import retile as retile_quantized
from shardopt._src.quantization.report import describe_quantized_state, QuantizedStateReport
from shardopt._src.wrappers.quantized_state import quantized_state

# Line searches
from shardopt._src.linesearch.backtracking import (
    BacktrackingLinesearchInfo, scale_by_backtracking_linesearch,
    ScaleByBacktrackingLinesearchState, value_and_grad_from_state,
)
from shardopt._src.linesearch.zoom import (
    scale_by_zoom_linesearch, ScaleByZoomLinesearchState, ZoomLinesearchInfo,
)

# Optimizers (aliases)
from shardopt._src.aliases.adafactor import adafactor
from shardopt._src.aliases.adagrad_family import adadelta, adagrad, rmsprop, sm3
from shardopt._src.aliases.adam import adam, adamw
from shardopt._src.aliases.adam_variants import adabelief, amsgrad, radam, yogi
from shardopt._src.aliases.adamax_adan import adamax, adamaxw, adan
from shardopt._src.aliases.gradient_descent import noisy_sgd, polyak_sgd, sgd
from shardopt._src.aliases.layerwise import fromage, lamb, lars, novograd
from shardopt._src.aliases.lbfgs import lbfgs
from shardopt._src.aliases.nadam import nadam, nadamw
from shardopt._src.aliases.optimistic import (
    optimistic_adam, optimistic_adam_v2, optimistic_gradient_descent,
)
from shardopt._src.aliases.sign import lion, rprop, sign_sgd, signum

# trax-semantics optimizers
from shardopt._src.trax.adafactor import trax_adafactor, TraxAdafactorState
from shardopt._src.trax.optimizers import trax_adam, trax_momentum, trax_rmsprop
from shardopt._src.trax.sm3 import MomentumType, trax_sm3, TraxSM3State


# Losses that optax also re-exports at its top level
from shardopt.losses import (
    convex_kl_divergence, cosine_distance, cosine_similarity, ctc_loss,
    ctc_loss_with_forward_probs, generalized_kl_divergence, hinge_loss, huber_loss,
    kl_divergence, l2_loss, log_cosh, ntxent, safe_softmax_cross_entropy,
    sigmoid_binary_cross_entropy, sigmoid_focal_loss, smooth_labels, softmax_cross_entropy,
    softmax_cross_entropy_with_integer_labels, squared_error,
)

# Schedules
from shardopt.schedules import (
    constant_schedule, cosine_decay_schedule, exponential_decay, join_schedules,
    linear_schedule, piecewise_constant_schedule, piecewise_interpolate_schedule,
    polynomial_schedule,
)
from shardopt.schedules import (
    cosine_onecycle_schedule, linear_onecycle_schedule, sgdr_schedule, warmup_constant_schedule,
    warmup_cosine_decay_schedule, warmup_exponential_decay_schedule,
)

# Sharded optimizer state and the sharded step
from shardopt.sharding import (
    LeafPlan, plan_state_shardings, ReplicatedStateWarning, state_shardings, StatePlan,
)
from shardopt.sharding import (
    make_sharded_optimizer, sharded_init, sharded_update, ShardedOptimizer, ShardedUpdate,
    TrainStep,
)

__all__ = [
    "abs_sq", "adabelief", "adadelta", "adafactor", "adagrad", "adam", "adamax", "adamaxw",
    "adamw", "adan", "adaptive_grad_clip", "AdaptiveGradClipState", "add_decayed_weights",
    "add_noise", "AddDecayedWeightsState", "AddNoiseState", "amsgrad", "apply_every",
    "apply_if_finite", "apply_updates", "ApplyEvery", "ApplyIfFiniteState", "assignment",
    "BacktrackingLinesearchInfo", "bias_correction", "centralize", "chain", "clip",
    "clip_by_block_rms", "clip_by_global_norm", "ClipByGlobalNormState", "ClipState",
    "conditionally_mask", "conditionally_transform", "ConditionallyMaskState",
    "ConditionallyTransformState", "ConditionFn", "constant_schedule", "contrib",
    "cosine_decay_schedule", "cosine_onecycle_schedule", "declare_moments", "describe_quantized_state", "ema", "EmaState", "EmptyState",
    "exponential_decay", "FactoredState", "flatten", "freeze", "fromage", "global_norm",
    "GradientTransformation", "GradientTransformationExtraArgs", "identity",
    "incremental_update", "init_empty_state", "inject_hyperparams",
    "inject_stateful_hyperparams", "InjectHyperparamsState", "InjectStatefulHyperparamsState",
    "join_schedules", "keep_params_nonnegative", "lamb", "lars", "lbfgs", "LeafPlan",
    "linear_onecycle_schedule", "linear_schedule", "lion", "lookahead", "LookaheadParams",
    "LookaheadState", "low_precision_params", "low_precision_state", "LowPrecisionParamsState", "make_sharded_optimizer", "masked", "MaskedNode",
    "MaskedState", "MaskOrFn", "matrix_inverse_pth_root", "measure_with_ema", "microbatch",
    "microbatching", "MomentumType", "monitor", "MonitorState", "multi_normal",
    "multi_transform", "MultiSteps", "MultiStepsState", "MultiTransformState", "nadam",
    "nadamw", "named_chain", "nnls", "noisy_sgd", "NonNegativeParamsState",
    "normalize_by_update_norm",
    "novograd", "optimistic_adam", "optimistic_adam_v2", "optimistic_gradient_descent",
    "OptState", "Params", "partition", "PartitionState", "per_example_global_norm_clip",
    "per_example_layer_norm_clip", "periodic_update", "piecewise_constant_schedule",
    "piecewise_interpolate_schedule", "plan_state_shardings", "polyak_sgd",
    "polynomial_schedule", "power_iteration", "QuantizedArray", "quantized_state", "QuantizedStateReport", "retile_quantized",
    "radam", "ReplicatedStateWarning", "rmsprop", "rprop",
    "safe_increment", "safe_int32_increment", "safe_norm", "safe_root_mean_squares",
    "ScalarOrSchedule", "scale", "scale_by_adadelta", "scale_by_adam", "scale_by_adamax",
    "scale_by_adan", "scale_by_amsgrad", "scale_by_backtracking_linesearch", "scale_by_belief",
    "scale_by_distance_over_gradients", "scale_by_factored_rms", "scale_by_lbfgs",
    "scale_by_learning_rate", "scale_by_lion", "scale_by_novograd",
    "scale_by_optimistic_gradient", "scale_by_param_block_norm", "scale_by_param_block_rms",
    "scale_by_polyak", "scale_by_radam", "scale_by_rms", "scale_by_rprop", "scale_by_rss",
    "scale_by_schedule", "scale_by_sign", "scale_by_sm3", "scale_by_stddev",
    "scale_by_trust_ratio", "scale_by_yogi", "scale_by_zoom_linesearch", "scale_gradient",
    "ScaleByAdaDeltaState", "ScaleByAdamState", "ScaleByAdanState", "ScaleByAmsgradState",
    "ScaleByBacktrackingLinesearchState", "ScaleByBeliefState",
    "ScaleByDistanceOverGradientsState", "ScaleByLBFGSState", "ScaleByLionState",
    "ScaleByNovogradState", "ScaleByOptimisticGradientState", "ScaleByRmsState",
    "ScaleByRmsWithCountState", "ScaleByRpropState", "ScaleByRssState", "ScaleByRStdDevState",
    "ScaleByRStdDevWithCountState", "ScaleByScheduleState", "ScaleBySM3State",
    "ScaleByTrustRatioState", "ScaleByZoomLinesearchState", "ScaleState", "Schedule",
    "schedules", "selective_transform", "set_to_zero", "sgd", "sgdr_schedule", "sharded_init",
    "sharded_update", "ShardedOptimizer", "ShardedUpdate", "sharding",
    "ShouldSkipUpdateFunction", "sign_sgd", "signum", "skip_large_updates", "skip_not_finite",
    "sm3", "snapshot", "SnapshotState", "state_shardings", "stateless",
    "stateless_with_tree_map", "StatePlan", "trace", "TraceState", "TrainStep", "TransformInitFn",
    "TransformUpdateExtraArgsFn", "TransformUpdateFn", "trax_adafactor", "trax_adam",
    "trax_momentum", "trax_rmsprop", "trax_sm3", "TraxAdafactorState", "TraxSM3State", "tree",
    "tree_map_params", "update_infinity_moment", "update_moment", "update_moment_per_elem_norm",
    "Updates", "value_and_grad_from_state", "value_at", "warmup_constant_schedule",
    "warmup_cosine_decay_schedule", "warmup_exponential_decay_schedule", "WeightDecaySchedule",
    "with_extra_args_support", "WrappedSchedule", "yogi", "zero_nans", "ZeroNansState",
    "ZoomLinesearchInfo",
    # losses (as optax re-exports them) and the losses/tree_utils namespaces
    "convex_kl_divergence", "cosine_distance", "cosine_similarity", "ctc_loss",
    "ctc_loss_with_forward_probs", "generalized_kl_divergence", "hinge_loss", "huber_loss",
    "kl_divergence", "l2_loss", "log_cosh", "losses", "ntxent", "safe_softmax_cross_entropy",
    "sigmoid_binary_cross_entropy", "sigmoid_focal_loss", "smooth_labels",
    "softmax_cross_entropy", "softmax_cross_entropy_with_integer_labels", "squared_error",
    "tree_utils",
    # optax's projections, perturbations and (deprecated) second_order namespaces
    "perturbations", "projections", "second_order",
    # optax.transforms as a namespace; differential privacy as optax re-exports it
    "transforms", "differentially_private_aggregate", "DifferentiallyPrivateAggregateState",
    "dpsgd",
]

# Differential privacy: optax 0.2.8 still serves these at its top level,
# deprecated for optax.contrib's; so does shardopt, after the same warning.
_DEPRECATED = ("differentially_private_aggregate",
               "DifferentiallyPrivateAggregateState", "dpsgd")


def __getattr__(name):
  """Serves a deprecated name after a ``DeprecationWarning``."""
  if name not in _DEPRECATED:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  _warnings.warn(f"shardopt.{name} is deprecated (as in optax 0.2.8): use "
                f"shardopt.contrib.{name}.", DeprecationWarning, stacklevel=2)
  return getattr(contrib, name)


def __dir__():
  return sorted(set(globals()) | set(_DEPRECATED))
