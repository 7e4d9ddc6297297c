"""Multi-host barriers that time out and name the processes that did not arrive.

Each process first records its arrival under a key in the JAX distributed
key-value store, then waits at the coordination-service barrier. On timeout the
arrivals are read back, so the error says which processes never came.
"""

import itertools

import jax

from checkpoints.errors import BarrierTimeoutError

__all__ = ["barrier", "orbax_barrier_fn"]

_PREFIX = "shardopt_checkpoints/barrier"
_counter = itertools.count()


def _client():
  from jax._src import distributed  # pylint: disable=import-outside-toplevel
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("Several JAX processes but no distributed client: call jax.distributed.initialize() first.")
  return client


def _wait(key: str, timeout_ms: int) -> None:
  client = _client()
  me = jax.process_index()
  client.key_value_set(f"{_PREFIX}/{key}/{me}", "1", allow_overwrite=True)
  try:
    client.wait_at_barrier(f"{_PREFIX}/{key}", max(int(timeout_ms), 1))
  except Exception as e:  # the runtime raises a JaxRuntimeError (DEADLINE_EXCEEDED, ...)
    try:
      arrived = {int(k.rsplit("/", 1)[1]) for k, _ in client.key_value_dir_get(f"{_PREFIX}/{key}/")}
    except Exception:  # pylint: disable=broad-except
      arrived = {me}
    missing = sorted(set(range(jax.process_count())) - arrived)
    raise BarrierTimeoutError(
        f"Process {me}: barrier {key!r} timed out after {timeout_ms / 1000:.1f} s; process(es) {missing} did not "
        f"arrive (arrived: {sorted(arrived)}). Every process must call the same checkpoint operation; "
        "check the missing processes' logs.") from e


def barrier(name: str, timeout_s: float) -> None:
  """Waits until every process reaches ``name`` (no-op with one process).

  Every process must call barriers in the same order: the key is made unique
  with a per-process call counter.
  """
  if jax.process_count() == 1:
    return
  _wait(f"{name}/{next(_counter)}", int(timeout_s * 1000))


def orbax_barrier_fn(*, key: str, timeout_ms: int) -> None:
  """An orbax ``barrier_sync_fn`` (keys are already unique) with named missing processes."""
  if jax.process_count() > 1:
    _wait(key, timeout_ms)
