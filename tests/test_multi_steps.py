"""apply_every and MultiSteps (accumulation, schedules, skipped mini-steps)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from tests import oracle

LR = 0.1


def _params():
  return (jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0]))


def _grads():
  return (jnp.array([0.5, -0.25]), jnp.array([2.0, 1.0]))


def test_apply_every_matches_sgd_every_k_steps():
  k = 4
  sgd = shardopt.chain(shardopt.trace(0.0), shardopt.scale(-LR))
  every = shardopt.chain(shardopt.apply_every(k), shardopt.trace(0.0),
                         shardopt.scale(-LR))
  update = jax.jit(every.update)
  sgd_params = every_params = _params()
  sgd_state, every_state = sgd.init(sgd_params), every.init(every_params)
  for step in range(3 * k):
    updates, sgd_state = sgd.update(_grads(), sgd_state)
    sgd_params = shardopt.apply_updates(sgd_params, updates)
    updates, every_state = update(_grads(), every_state)
    every_params = shardopt.apply_updates(every_params, updates)
    if step % k == k - 1:  # k steps of one gradient == one step of k of them
      oracle.assert_trees_close(every_params, sgd_params, rtol=1e-6)
    else:
      assert not any(np.any(np.asarray(u)) for u in updates)
  assert isinstance(every_state[0], shardopt.ApplyEvery)
  assert int(every_state[0].count) == 0


@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("jit", [True, False])
def test_apply_every_matches_optax(jit, with_params):
  oracle.assert_matches_optax(shardopt.apply_every(3), optax.apply_every(3),
                              jit=jit, with_params=with_params)


def _multi_steps(module, **kwargs):
  return module.MultiSteps(
      module.chain(module.scale_by_adam(), module.scale(-LR)), **kwargs)


@pytest.mark.parametrize("use_grad_mean,jit,with_params",
                         [(True, True, True), (False, True, False),
                          (True, False, True)])
def test_multi_steps_matches_optax(use_grad_mean, jit, with_params):
  kwargs = dict(every_k_schedule=3, use_grad_mean=use_grad_mean)
  params = oracle.mixed_tree()
  got = oracle.run_updates(
      _multi_steps(shardopt, **kwargs).gradient_transformation(), params, 20,
      with_params=with_params, jit=jit)
  # optax's numbers do not depend on jit; jitted, its un-jitted lax.cond
  # retracing (~1 s a step here) is avoided.
  want = oracle.run_updates(
      _multi_steps(optax, **kwargs).gradient_transformation(), params, 20,
      with_params=with_params, jit=True)
  for g, w in zip(got, want, strict=True):
    oracle.assert_trees_close(g, w)


def test_multi_steps_schedule_matches_optax():
  # Growing windows: 1, 2, 3, ... mini-steps per gradient step.
  kwargs = dict(every_k_schedule=lambda step: step + 1)
  oracle.assert_matches_optax(_multi_steps(shardopt, **kwargs),
                              _multi_steps(optax, **kwargs), steps=21)


def test_multi_steps_averages_like_a_big_batch():
  k = 3
  opt = shardopt.MultiSteps(shardopt.scale(-LR), every_k_schedule=k)
  update = jax.jit(opt.update)
  params = jnp.zeros(2)
  state = opt.init(params)
  mini_batches = [jnp.array([1.0, 2.0]), jnp.array([4.0, -2.0]),
                  jnp.array([1.0, 3.0])]
  emitted = []
  for grads in mini_batches * 2:
    updates, state = update(grads, state)
    emitted.append(bool(opt.has_updated(state)))
    params = params + updates
  assert emitted == [False, False, True] * 2
  np.testing.assert_allclose(params, -2 * LR * np.array([2.0, 1.0]), rtol=1e-6)
  assert isinstance(state, shardopt.MultiStepsState)
  assert int(state.gradient_step) == 2 and int(state.mini_step) == 0


def _stream_with_bad_steps(bad):
  """A gradient stream where the steps in ``bad`` carry a NaN or a huge value."""
  params = oracle.mixed_tree()
  for step, grads in enumerate(oracle.gradient_stream(params, 12)):
    if step in bad:
      grads["vector"] = grads["vector"].at[0].set(bad[step])
    yield grads


@pytest.mark.parametrize("skip", ["not_finite", "large"])
def test_multi_steps_skips_bad_mini_steps(skip):
  bad = {2: jnp.nan, 7: jnp.inf} if skip == "not_finite" else {2: 1e6, 7: -1e6}
  ours_fn, theirs_fn = shardopt.skip_not_finite, optax.skip_not_finite
  if skip == "large":
    ours_fn = functools.partial(shardopt.skip_large_updates,
                                max_squared_norm=1e4)
    theirs_fn = functools.partial(optax.skip_large_updates,
                                  max_squared_norm=1e4)
  ours = _multi_steps(shardopt, every_k_schedule=2,
                      should_skip_update_fn=ours_fn)
  theirs = _multi_steps(optax, every_k_schedule=2,
                        should_skip_update_fn=theirs_fn)
  params = oracle.mixed_tree()
  state, ref_state = ours.init(params), theirs.init(params)
  update, ref_update = jax.jit(ours.update), jax.jit(theirs.update)
  for step, grads in enumerate(_stream_with_bad_steps(bad)):
    before = state
    updates, state = update(grads, state, params)
    want, ref_state = ref_update(grads, ref_state, params)
    oracle.assert_trees_close(updates, want)
    oracle.assert_trees_close(jax.tree.leaves(state), jax.tree.leaves(ref_state))
    assert bool(state.skip_state["should_skip"]) == (step in bad)
    if step in bad:  # as if the mini-step never happened
      oracle.assert_trees_close(
          jax.tree.leaves(state._replace(skip_state=())),
          jax.tree.leaves(before._replace(skip_state=())), rtol=0, atol=0)
  # 12 mini-steps, 2 skipped, 2 per gradient step.
  assert int(state.gradient_step) == 5


def test_multi_steps_forwards_extra_args_and_checks_skip_output():
  def update_fn(updates, state, params=None, *, factor):
    return jax.tree.map(lambda u: u * factor, updates), state

  inner = shardopt.GradientTransformationExtraArgs(
      shardopt.init_empty_state, update_fn)
  opt = shardopt.MultiSteps(inner, every_k_schedule=1)
  updates, _ = opt.update(jnp.ones(2), opt.init(jnp.ones(2)), factor=3.0)
  np.testing.assert_allclose(updates, [3.0, 3.0])
  bad = shardopt.MultiSteps(shardopt.scale(1.0), 2,
                            should_skip_update_fn=lambda u, s, p: (1, ()))
  with pytest.raises(ValueError, match="bool scalar"):
    bad.update(jnp.ones(2), bad.init(jnp.ones(2)))


def test_a_nan_gradient_reaches_its_gradient_step_and_no_later_one():
  # optax keeps the nan in its accumulator (0 * nan) and every later update,
  # zeros included, is nan; shardopt's accumulator restarts at each emit.
  grads = [jnp.array([jnp.nan, 0.0]), jnp.array([0.0, 1.0]),
           jnp.array([0.0, 0.0]), jnp.array([1.0, 1.0])]
  def run(lib):
    tx = lib.MultiSteps(lib.sgd(0.1), 2)
    state, params, out = tx.init(jnp.zeros(2)), jnp.zeros(2), []
    for g in grads:
      u, state = tx.update(g, state, params)
      out.append(np.asarray(u))
    return np.stack(out), state
  ours, state = run(shardopt)
  theirs, _ = run(optax)
  np.testing.assert_array_equal(ours[1], theirs[1])  # the emit of the nan's step, as optax's
  np.testing.assert_allclose(ours[[0, 2, 3]], [[0.0, 0.0], [0.0, 0.0], [-0.05, -0.05]], rtol=1e-6)
  assert np.isnan(theirs[:, 0]).all()
  assert np.isfinite(np.asarray(state.acc_grads)).all()
