"""Orbax checkpoints of sharded training state: async, resumable, restorable onto any mesh.

``CheckpointManager`` saves a state (params, optimizer state, step, RNG keys)
with user metadata, each process writing its own shards, and restores it into
the caller's own types on the shardings the caller gives.
"""

from checkpoints.errors import *  # noqa: F401,F403
from checkpoints.manager import CheckpointManager, Restored  # noqa: F401
from checkpoints.policy import CheckpointPolicy  # noqa: F401
from checkpoints.flax_state import create_nnx_optimizer, create_train_state, nnx_checkpoint_state, nnx_load_state  # noqa: F401
