"""scale, scale_by_learning_rate and scale_by_schedule against optax."""

import jax.numpy as jnp

import shardopt
from tests import oracle


def _schedule(count):
  return 0.1 * 0.9**count


CASES = [
    ("scale", dict(step_size=-0.3)),
    ("scale_by_learning_rate", dict(learning_rate=0.05)),
    ("scale_by_learning_rate", dict(learning_rate=0.05, flip_sign=False)),
    ("scale_by_learning_rate", dict(learning_rate=_schedule)),
    ("scale_by_learning_rate", dict(learning_rate=None)),
    ("scale_by_schedule", dict(step_size_fn=_schedule)),
]


test_matches_optax = oracle.matches_optax_test(CASES)


def test_schedule_state_counts_steps():
  tx = shardopt.scale_by_schedule(_schedule)
  params = oracle.mixed_tree()
  state = tx.init(params)
  for _ in range(3):
    _, state = tx.update(params, state)
  assert isinstance(state, shardopt.ScaleByScheduleState)
  assert state.count.dtype == jnp.int32 and int(state.count) == 3


def test_state_aliases():
  assert shardopt.ScaleState is shardopt.EmptyState
  assert shardopt.ScaleByScheduleState._fields == ("count",)
