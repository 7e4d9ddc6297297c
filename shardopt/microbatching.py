"""``shardopt.microbatching``: optax's ``optax.microbatching`` (evaluating a
function, a vmap or per-example gradients over sequential microbatches)."""

from shardopt._src.batch_axis import reshape_batch_axis
from shardopt._src.microbatch_accumulators import AccumulationType
from shardopt._src.microbatch_accumulators import Accumulator
from shardopt._src.microbatching import micro_grad
from shardopt._src.microbatching import micro_vmap
from shardopt._src.microbatching import microbatch

__all__ = [
    "AccumulationType", "Accumulator", "micro_grad", "micro_vmap", "microbatch",
    "reshape_batch_axis",
]
