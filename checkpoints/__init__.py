"""Orbax checkpoints of sharded training state: async, resumable, restorable onto any mesh.

``CheckpointManager`` saves a state (params, optimizer state, step, RNG keys)
with user metadata, each process writing its own shards, and restores it into
the caller's own types on the shardings the caller gives. Every array's
checksum is written at save time and checked on restore: damaged steps raise
``CorruptCheckpointError`` and ``restore_latest_valid`` passes over them.

Its names are imported when first used (PEP 562), so a module of the package that
imports neither jax nor orbax (``checkpoints.digest``) can be used before jax starts.
"""

import importlib as _importlib

_EXPORTS = {
    "BarrierTimeoutError": "checkpoints.errors",
    "CheckpointDirectoryError": "checkpoints.errors",
    "CheckpointError": "checkpoints.errors",
    "CheckpointWriteError": "checkpoints.errors",
    "CorruptCheckpointError": "checkpoints.errors",
    "NoCheckpointError": "checkpoints.errors",
    "StructureMismatchError": "checkpoints.errors",
    "create_nnx_optimizer": "checkpoints.flax_state",
    "create_train_state": "checkpoints.flax_state",
    "nnx_checkpoint_state": "checkpoints.flax_state",
    "nnx_load_state": "checkpoints.flax_state",
    "nnx_tx": "checkpoints.flax_state",
    "CheckpointManager": "checkpoints.manager",
    "CheckpointPolicy": "checkpoints.policy",
    "Restored": "checkpoints.restore_results",
    "SkippedStep": "checkpoints.restore_results",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'checkpoints' has no attribute {name!r}")
  value = getattr(_importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *_EXPORTS})
