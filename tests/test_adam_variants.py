"""Adam's relatives, sign methods and direction rules against optax."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

# (name, kwargs, needs_params). Every case runs jitted and eager, with and
# without params (only with params when the transform needs them).
CASES = [
    ("scale_by_adadelta", dict(), False),
    ("scale_by_adadelta", dict(rho=0.8, eps=1e-4), False),
    ("scale_by_adan", dict(), False),
    ("scale_by_adan", dict(b1=0.9, b2=0.8, b3=0.95, eps_root=1e-8), False),
    ("scale_by_adamax", dict(), False),
    ("scale_by_adamax", dict(b1=0.8, b2=0.99, eps=1e-6), False),
    ("scale_by_amsgrad", dict(), False),
    ("scale_by_amsgrad", dict(b1=0.8, eps_root=1e-8, mu_dtype=jnp.bfloat16,
                              bias_correction_mu=False,
                              bias_correction_nu=False), False),
    ("scale_by_belief", dict(), False),
    ("scale_by_belief", dict(b1=0.8, eps=1e-8, nesterov=True), False),
    ("scale_by_yogi", dict(), False),
    ("scale_by_yogi", dict(b2=0.99, eps_root=1e-8,
                           initial_accumulator_value=0.1), False),
    ("scale_by_novograd", dict(), True),
    ("scale_by_novograd", dict(b1=0.8, b2=0.5, eps_root=1e-8,
                               weight_decay=0.01, mu_dtype=jnp.bfloat16), True),
    ("scale_by_lion", dict(), False),
    ("scale_by_lion", dict(b1=0.8, b2=0.9, mu_dtype=jnp.bfloat16,
                           mode="smooth", smooth_beta=2.0), False),
    ("scale_by_lion", dict(mode="refined"), False),
    ("scale_by_sign", dict(), False),
    ("scale_by_rprop", dict(learning_rate=0.1), False),
    ("scale_by_rprop", dict(learning_rate=0.5, eta_minus=0.3, eta_plus=1.5,
                            min_step_size=0.2, max_step_size=0.6), False),
    ("scale_by_optimistic_gradient", dict(), False),
    ("scale_by_optimistic_gradient", dict(alpha=0.7, beta=0.3), False),
    ("normalize_by_update_norm", dict(), False),
    ("normalize_by_update_norm", dict(scale_factor=-0.5, eps=1e-3), False),
    ("centralize", dict(), False),
]


test_matches_optax = oracle.matches_optax_test(CASES)


def _run_polyak(tx, jit):
  params = oracle.mixed_tree()
  update = jax.jit(tx.update) if jit else tx.update
  state = tx.init(params)
  history = []
  for grads in oracle.gradient_stream(params, 20):
    value = 0.25 * sum(jnp.sum(p**2) for p in jax.tree.leaves(params)) - 1.0
    updates, state = update(grads, state, params, value=value)
    params = jax.tree.map(lambda p, u: p - 0.1 * u, params, updates)
    history.append(updates)
  return history


@pytest.mark.parametrize("jit", [True, False])
@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(f_min=0.5, max_learning_rate=0.05, eps=1e-3, variant="sps+"),
])
def test_polyak_matches_optax(kwargs, jit):
  ours = _run_polyak(shardopt.scale_by_polyak(**kwargs), jit)
  theirs = _run_polyak(optax.scale_by_polyak(**kwargs), jit)
  for got, want in zip(ours, theirs):
    oracle.assert_trees_close(got, want)


def test_polyak_zero_gradient_gives_zero_step():
  tx = shardopt.scale_by_polyak()
  zeros = jax.tree.map(jnp.zeros_like, oracle.mixed_tree())
  updates, _ = tx.update(zeros, tx.init(zeros), value=3.0)
  assert all(not np.any(u) for u in jax.tree.leaves(updates))


def test_bad_options_are_rejected_up_front():
  with pytest.raises(ValueError, match="mode"):
    shardopt.scale_by_lion(mode="soft")
  with pytest.raises(ValueError, match="variant"):
    shardopt.scale_by_polyak(variant="sps-")
  tx = shardopt.scale_by_novograd()
  params = oracle.mixed_tree()
  with pytest.raises(ValueError, match="params"):
    tx.update(params, tx.init(params))


def test_centralize_hand_computed():
  updates, _ = shardopt.centralize().update(
      {"m": jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]]),
       "v": jnp.array([1.0, 2.0])}, shardopt.EmptyState())
  np.testing.assert_allclose(updates["m"], [[-1, 0, 1], [-2, -1, 3]])
  np.testing.assert_allclose(updates["v"], [1.0, 2.0])


def test_state_types():
  params = oracle.mixed_tree()
  assert isinstance(shardopt.scale_by_yogi().init(params),
                    shardopt.ScaleByAdamState)
  assert isinstance(shardopt.scale_by_adamax().init(params),
                    shardopt.ScaleByAdamState)
  expected_fields = {
      shardopt.ScaleByAdaDeltaState: optax.ScaleByAdaDeltaState,
      shardopt.ScaleByAdanState: optax.ScaleByAdanState,
      shardopt.ScaleByAmsgradState: optax.ScaleByAmsgradState,
      shardopt.ScaleByBeliefState: optax.ScaleByBeliefState,
      shardopt.ScaleByNovogradState: optax.ScaleByNovogradState,
      shardopt.ScaleByLionState: optax.ScaleByLionState,
      shardopt.ScaleByRpropState: optax.ScaleByRpropState,
  }
  for ours, theirs in expected_fields.items():
    assert ours._fields == theirs._fields, ours.__name__
