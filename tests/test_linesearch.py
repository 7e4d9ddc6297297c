"""Backtracking and zoom line searches against optax on a non-quadratic
objective over the mixed tree (20 steps, values, updates and states)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

TARGET = oracle.mixed_tree(seed=7)


def objective(params, shift=0.0):
  """A separable quadratic pull to TARGET plus a double-well (quartic) term,
  with per-leaf curvature, so line searches must really search."""
  total = jnp.zeros([])
  for i, (p, t) in enumerate(zip(jax.tree.leaves(params),
                                 jax.tree.leaves(TARGET))):
    total += 0.5 * (1.0 + i) * jnp.sum((p - t - shift) ** 2)
    total += 0.05 * jnp.sum((p**2 - 0.5) ** 2)
  return total


def run(tx, *, steps=20, jit=True, value_and_grad=None, **fn_kwargs):
  """Minimises ``objective``; returns per-step (value, updates, state)."""
  params = oracle.mixed_tree()
  state = tx.init(params)
  update = functools.partial(tx.update, value_fn=objective)
  if jit:
    update = jax.jit(update)
  value_and_grad = value_and_grad or (
      lambda p, state: jax.value_and_grad(objective)(p, **fn_kwargs))
  history = []
  for _ in range(steps):
    value, grad = value_and_grad(params, state=state)
    updates, state = update(grad, state, params, value=value, grad=grad,
                            **fn_kwargs)
    params = optax.apply_updates(params, updates)
    history.append((value, updates, state))
  return history


def assert_runs_match(ours, theirs, rtol=1e-6, atol=1e-7):
  """Same values, updates and state contents at every step."""
  for step, ((v1, u1, s1), (v2, u2, s2)) in enumerate(zip(ours, theirs)):
    try:
      oracle.assert_trees_close((v1, u1), (v2, u2), rtol=rtol, atol=atol)
      oracle.assert_trees_close(jax.tree.leaves(s1), jax.tree.leaves(s2),
                                rtol=rtol, atol=atol)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


BACKTRACKING = [
    dict(max_backtracking_steps=15, max_learning_rate=1.0),
    dict(max_backtracking_steps=15, store_grad=True, decrease_factor=0.5,
         increase_factor=2.0, max_learning_rate=5.0, slope_rtol=0.3),
    dict(max_backtracking_steps=3, atol=1e-3, rtol=1e-3,
         max_learning_rate=0.3),
]


@pytest.mark.parametrize("kwargs", BACKTRACKING)
def test_backtracking_matches_optax(kwargs):
  def build(lib):
    return lib.chain(lib.scale(-1.0),
                     lib.scale_by_backtracking_linesearch(**kwargs))
  ours, theirs = run(build(shardopt)), run(build(optax))
  assert_runs_match(ours, theirs)
  assert float(ours[-1][0]) < 0.5 * float(ours[0][0])  # it does descend
  steps = [int(s[1].info.num_linesearch_steps) for _, _, s in ours]
  assert max(steps) > 1 or kwargs["max_learning_rate"] < 1  # did backtrack


ZOOM = [
    dict(max_linesearch_steps=15),
    dict(max_linesearch_steps=10, max_learning_rate=0.5, curv_rtol=0.5,
         approx_dec_rtol=None, initial_guess_strategy="one",
         increase_factor=3.0),
    dict(max_linesearch_steps=4, tol=1e-4, slope_rtol=0.2,
         stepsize_precision=1e-3),
]


@pytest.mark.parametrize("kwargs", ZOOM)
def test_zoom_matches_optax(kwargs):
  def build(lib):
    return lib.chain(lib.scale(-1.0), lib.scale_by_zoom_linesearch(**kwargs))
  ours, theirs = run(build(shardopt)), run(build(optax))
  assert_runs_match(ours, theirs)
  assert float(ours[-1][0]) < 0.5 * float(ours[0][0])


def test_eager_and_extra_fn_kwargs_and_state_reuse():
  """Unjitted; value_fn takes a keyword argument; value and grad reused from
  the state as optax.value_and_grad_from_state does."""
  for kwargs_ls in (dict(max_backtracking_steps=15, store_grad=True),):
    ours_tx = shardopt.chain(
        shardopt.scale(-1.0),
        shardopt.scale_by_backtracking_linesearch(**kwargs_ls))
    theirs_tx = optax.chain(
        optax.scale(-1.0), optax.scale_by_backtracking_linesearch(**kwargs_ls))
    # 8 steps unjitted (op by op: 20 took 26 s); the jitted runs take 20.
    ours = run(ours_tx, steps=8, jit=False, shift=0.3,
               value_and_grad=_from_state(shardopt, shift=0.3))
    theirs = run(theirs_tx, steps=8, jit=False, shift=0.3,
                 value_and_grad=_from_state(optax, shift=0.3))
    assert_runs_match(ours, theirs)


def _from_state(lib, **fn_kwargs):
  fetch = lib.value_and_grad_from_state(objective)
  return lambda params, state: fetch(params, state=state, **fn_kwargs)


def test_unknown_kwargs_and_bad_strategy_are_rejected():
  tx = shardopt.scale_by_backtracking_linesearch(5)
  params = oracle.mixed_tree()
  value, grad = jax.value_and_grad(objective)(params)
  with pytest.raises(TypeError, match=r"Unexpected keyword arguments \['batch'\]"):
    tx.update(grad, tx.init(params), params, value=value, grad=grad,
              value_fn=objective, batch=1.0)
  with pytest.raises(ValueError, match="initial_guess_strategy"):
    shardopt.scale_by_zoom_linesearch(5, initial_guess_strategy="two")
  for lib in (shardopt, optax):  # optax's exception types
    with pytest.raises(ValueError, match="grad"):
      lib.value_and_grad_from_state(objective)(
          params, state=lib.scale_by_backtracking_linesearch(5).init(params))
    twice = lib.chain(*[lib.scale_by_backtracking_linesearch(5, store_grad=True)] * 2)
    with pytest.raises(KeyError):
      lib.value_and_grad_from_state(objective)(params, state=twice.init(params))


def test_state_types_and_fields():
  params = oracle.mixed_tree()
  state = shardopt.scale_by_zoom_linesearch(5).init(params)
  assert isinstance(state, shardopt.ScaleByZoomLinesearchState)
  assert isinstance(state.info, shardopt.ZoomLinesearchInfo)
  assert state._fields == optax.ScaleByZoomLinesearchState._fields
  assert state.info._fields == optax.ZoomLinesearchInfo._fields
  bt = shardopt.scale_by_backtracking_linesearch(5).init(params)
  assert bt._fields == optax.ScaleByBacktrackingLinesearchState._fields
  assert bt.grad is None and np.isinf(bt.value)
