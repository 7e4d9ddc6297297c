"""Orbax checkpoints of sharded training state: async, resumable, restorable onto any mesh.

``CheckpointManager`` saves a state (params, optimizer state, step, RNG keys)
with user metadata, each process writing its own shards, and restores it into
the caller's own types on the shardings the caller gives. Every array's
checksum is written at save time and checked on restore: damaged steps raise
``CorruptCheckpointError`` and ``restore_latest_valid`` passes over them.
"""

from checkpoints.errors import BarrierTimeoutError  # noqa: F401
from checkpoints.errors import CheckpointDirectoryError  # noqa: F401
from checkpoints.errors import CheckpointError  # noqa: F401
from checkpoints.errors import CheckpointWriteError  # noqa: F401
from checkpoints.errors import CorruptCheckpointError  # noqa: F401
from checkpoints.errors import NoCheckpointError  # noqa: F401
from checkpoints.errors import StructureMismatchError  # noqa: F401
from checkpoints.flax_state import create_nnx_optimizer  # noqa: F401
from checkpoints.flax_state import create_train_state  # noqa: F401
from checkpoints.flax_state import nnx_checkpoint_state  # noqa: F401
from checkpoints.flax_state import nnx_load_state  # noqa: F401
from checkpoints.flax_state import nnx_tx  # noqa: F401
from checkpoints.manager import CheckpointManager  # noqa: F401
from checkpoints.manager import Restored  # noqa: F401
from checkpoints.manager import SkippedStep  # noqa: F401
from checkpoints.policy import CheckpointPolicy  # noqa: F401
