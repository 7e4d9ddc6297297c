"""trace and ema against optax."""

import jax
import jax.numpy as jnp
import pytest

import shardopt
from tests import oracle

# bfloat16 accumulators: same ops in the same dtype, so equal to 1e-6 too.
CASES = [
    ("trace", dict(decay=0.9)),
    ("trace", dict(decay=0.9, nesterov=True)),
    ("trace", dict(decay=0.8, accumulator_dtype=jnp.bfloat16)),
    ("ema", dict(decay=0.9)),
    ("ema", dict(decay=0.9, debias=False)),
    ("ema", dict(decay=0.8, accumulator_dtype=jnp.bfloat16)),
]


test_matches_optax = oracle.matches_optax_test(CASES)


@pytest.mark.parametrize("name", ["trace", "ema"])
def test_accumulator_dtype_is_kept(name):
  tx = getattr(shardopt, name)(0.9, accumulator_dtype="bfloat16")
  params = oracle.mixed_tree()
  state = tx.init(params)
  _, state = tx.update(params, state)
  acc = state.trace if name == "trace" else state.ema
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(acc))


def test_trace_hand_computed():
  tx = shardopt.trace(decay=0.5, nesterov=True)
  g = jnp.array([2.0])
  state = tx.init(g)
  u1, state = tx.update(g, state)  # trace 2, update 2 + 0.5 * 2 = 3
  u2, state = tx.update(g, state)  # trace 3, update 2 + 0.5 * 3 = 3.5
  assert float(u1[0]) == 3.0 and float(u2[0]) == 3.5
  assert float(state.trace[0]) == 3.0
