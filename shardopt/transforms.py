"""Transformations and wrappers under the names of ``optax.transforms``.

The same objects as at the top level of ``shardopt``, grouped as optax groups
them, so ``from optax import transforms`` code keeps working.
"""

from shardopt._src.transforms.clipping import adaptive_grad_clip
from shardopt._src.transforms.clipping import clip
from shardopt._src.transforms.clipping import clip_by_block_rms
from shardopt._src.transforms.clipping import clip_by_global_norm
from shardopt._src.transforms.clipping import unitwise_clip
from shardopt._src.transforms.clipping import unitwise_norm
from shardopt._src.transforms.constraints import keep_params_nonnegative
from shardopt._src.transforms.constraints import NonNegativeParamsState
from shardopt._src.transforms.constraints import zero_nans
from shardopt._src.transforms.constraints import ZeroNansState
from shardopt._src.transforms.momentum import ema
from shardopt._src.transforms.momentum import EmaState
from shardopt._src.transforms.momentum import trace
from shardopt._src.transforms.momentum import TraceState
from shardopt._src.transforms.noise import add_noise
from shardopt._src.transforms.noise import AddNoiseState
from shardopt._src.transforms.per_example_clipping import per_example_global_norm_clip
from shardopt._src.transforms.per_example_clipping import per_example_layer_norm_clip
from shardopt._src.transforms.weight_decay import add_decayed_weights
from shardopt._src.wrappers.combine import chain
from shardopt._src.wrappers.combine import named_chain
from shardopt._src.wrappers.combine import partition
from shardopt._src.wrappers.combine import PartitionState
from shardopt._src.wrappers.combine import selective_transform
from shardopt._src.wrappers.conditional import apply_if_finite
from shardopt._src.wrappers.conditional import ApplyIfFiniteState
from shardopt._src.wrappers.conditional import conditionally_mask
from shardopt._src.wrappers.conditional import conditionally_transform
from shardopt._src.wrappers.conditional import ConditionallyMaskState
from shardopt._src.wrappers.conditional import ConditionallyTransformState
from shardopt._src.wrappers.conditional import ConditionFn
from shardopt._src.wrappers.conditional import skip_large_updates
from shardopt._src.wrappers.conditional import skip_not_finite
from shardopt._src.wrappers.flatten import flatten
from shardopt._src.wrappers.masking import freeze
from shardopt._src.wrappers.masking import masked
from shardopt._src.wrappers.masking import MaskedNode
from shardopt._src.wrappers.masking import MaskedState
from shardopt._src.wrappers.monitoring import measure_with_ema
from shardopt._src.wrappers.monitoring import monitor
from shardopt._src.wrappers.monitoring import MonitorState
from shardopt._src.wrappers.monitoring import snapshot
from shardopt._src.wrappers.monitoring import SnapshotState
from shardopt._src.wrappers.multi_steps import MultiSteps
from shardopt._src.wrappers.multi_steps import MultiStepsState
from shardopt._src.wrappers.multi_steps import ShouldSkipUpdateFunction

__all__ = [
    "AddNoiseState", "ApplyIfFiniteState", "ConditionFn", "ConditionallyMaskState",
    "ConditionallyTransformState", "EmaState", "MaskedNode", "MaskedState", "MonitorState",
    "MultiSteps", "MultiStepsState", "NonNegativeParamsState", "PartitionState",
    "ShouldSkipUpdateFunction", "SnapshotState", "TraceState", "ZeroNansState",
    "adaptive_grad_clip", "add_decayed_weights", "add_noise", "apply_if_finite", "chain",
    "clip", "clip_by_block_rms", "clip_by_global_norm", "conditionally_mask",
    "conditionally_transform", "ema", "flatten", "freeze", "keep_params_nonnegative", "masked",
    "measure_with_ema", "monitor", "named_chain", "partition", "per_example_global_norm_clip",
    "per_example_layer_norm_clip", "selective_transform", "skip_large_updates",
    "skip_not_finite", "snapshot", "trace", "unitwise_clip", "unitwise_norm", "zero_nans",
]
