"""Shared test utilities: a nested mixed-rank tree and an optax-equality check."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt


def mixed_tree(seed: int = 0, scale: float = 1.0) -> dict:
  """A nested tree of a scalar, a vector, matrices and 3-D/4-D arrays."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 6)
  normal = lambda k, shape: scale * jax.random.normal(k, shape, jnp.float32)
  return {
      "scalar": normal(keys[0], ()),
      "vector": normal(keys[1], (6,)),
      "dense": {"kernel": normal(keys[2], (4, 6)), "bias": normal(keys[3], (6,))},
      "conv": {"kernel": normal(keys[4], (3, 3, 2, 4))},
      "block": [normal(keys[5], (2, 3, 4))],
  }


def gradient_stream(params, steps: int, seed: int = 1):
  """Deterministic pseudo-gradients: a quadratic pull plus noise, per step."""
  for step in range(steps):
    noise = mixed_tree(seed + step, scale=0.1)
    yield jax.tree.map(lambda p, n: 0.5 * p + n, params, noise)


def run_updates(tx, params, steps: int, *, with_params: bool, jit: bool,
                extra_args=None):
  """Applies ``tx`` for ``steps`` steps; returns the list of update trees."""
  update = jax.jit(tx.update) if jit else tx.update
  init = jax.jit(tx.init) if jit else tx.init
  state = init(params)
  history = []
  for grads in gradient_stream(params, steps):
    kwargs = extra_args or {}
    if with_params:
      updates, state = update(grads, state, params, **kwargs)
      params = jax.tree.map(lambda p, u: p + u, params, updates)
    else:
      updates, state = update(grads, state, **kwargs)
    history.append(updates)
  return history


def assert_trees_close(actual, expected, rtol=1e-6, atol=1e-7):
  """Same structure; leaf by leaf the same shape, the same dtype and close
  values (no broadcasting: () and (1,) differ)."""
  actual_leaves, actual_def = jax.tree_util.tree_flatten_with_path(actual)
  expected_leaves, expected_def = jax.tree.flatten(expected)
  assert actual_def == expected_def, f"{actual_def} != {expected_def}"
  for (path, a), e in zip(actual_leaves, expected_leaves):
    a, e, where = np.asarray(a), np.asarray(e), jax.tree_util.keystr(path)
    assert a.shape == e.shape, f"{where}: shape {a.shape} != {e.shape}"
    assert a.dtype == e.dtype, f"{where}: dtype {a.dtype} != {e.dtype}"
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=where)


def updates_shaped_like_grads(tx):
  """``tx`` with each update reshaped to its gradient's shape.

  For comparing with an optax transformation that changes a shape where
  shardopt keeps it on purpose: optax's ``scale_by_distance_over_gradients``
  gives a scalar param a (1,) update.
  """
  def update_fn(updates, state, params=None, **extra_args):
    new, state = tx.update(updates, state, params, **extra_args)
    return jax.tree.map(lambda u, g: u.reshape(jnp.shape(g)), new, updates), state

  return optax.GradientTransformationExtraArgs(tx.init, update_fn)


def assert_matches_optax(ours, theirs, *, steps: int = 20, params=None,
                         with_params: bool = True, jit: bool = True,
                         rtol: float = 1e-6, atol: float = 1e-7):
  """``ours`` and ``theirs`` give the same updates for ``steps`` steps."""
  params = mixed_tree() if params is None else params
  got = run_updates(ours, params, steps, with_params=with_params, jit=jit)
  want = run_updates(theirs, params, steps, with_params=with_params, jit=jit)
  for step, (g, w) in enumerate(zip(got, want)):
    try:
      assert_trees_close(g, w, rtol=rtol, atol=atol)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


def matches_optax_test(cases):
  """A test that ``shardopt.<name>(**kwargs)`` gives the updates of
  ``optax.<name>(**kwargs)`` for each ``(name, kwargs)`` or
  ``(name, kwargs, needs_params)`` of ``cases``, jitted and not, with and
  without params (only with, when ``needs_params``). Assign it to
  ``test_matches_optax``."""
  runs = [(name, kwargs, jit, with_params)
          for name, kwargs, *needs_params in cases
          for jit in (True, False)
          for with_params in (True, False)
          if with_params or not any(needs_params)]

  @pytest.mark.parametrize("name,kwargs,jit,with_params", runs)
  def test(name, kwargs, jit, with_params):
    assert_matches_optax(
        getattr(shardopt, name)(**kwargs), getattr(optax, name)(**kwargs),
        jit=jit, with_params=with_params)

  return test
