"""shardopt.second_order against optax.second_order (deprecated in optax
0.2.8): the same values (rtol 1e-6 in float32), dtypes and shapes for pytree
params, eagerly, under jit and under vmap; and the same deprecation warnings
(category, one per call, hessian_diag's plus the hvp it calls), naming
shardopt's functions."""

import inspect
import warnings

import jax
from jax import flatten_util
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from shardopt import second_order
from tests.oracle import assert_trees_close
from tests.test_docstrings import docstring_problems

_OURS, _THEIRS = second_order, optax.second_order
_NAMES = ("fisher_diag", "hessian_diag", "hvp")

# Every call here warns by design; the tests that look at the warnings record them.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")



def _loss(params, inputs, targets):
  """A one-hidden-layer tanh network's squared error (not quadratic in the
  params: its Hessian has off-diagonal and sign-changing entries)."""
  hidden = jnp.tanh(inputs @ params["w1"] + params["b1"])
  outputs = hidden @ params["w2"][0]
  return jnp.mean((outputs - targets) ** 2)


def _problem(seed=0, dtype=jnp.float32):
  keys = jax.random.split(jax.random.PRNGKey(seed), 6)
  params = {"w1": jax.random.normal(keys[0], (3, 4)), "b1": jax.random.normal(keys[1], (4,)),
            "w2": [jax.random.normal(keys[2], (4, 2))]}
  inputs = jax.random.normal(keys[3], (5, 3))
  targets = jax.random.normal(keys[4], (5, 2))
  v = jax.random.normal(keys[5], (12 + 4 + 8,))
  cast = lambda t: jax.tree.map(lambda x: x.astype(dtype), t)
  return cast(params), cast(inputs), cast(targets), cast(v)


def _args(name, problem):
  params, inputs, targets, v = problem
  return (v, params, inputs, targets) if name == "hvp" else (params, inputs, targets)


def _call(module, name, *problem):
  return getattr(module, name)(_loss, *_args(name, problem))


def _calls(module, *problem):
  return {name: _call(module, name, *problem) for name in _NAMES}


def test_values_match_optax_eagerly_and_under_jit():
  for seed in range(2):
    problem = _problem(seed)
    assert_trees_close(_calls(_OURS, *problem), _calls(_THEIRS, *problem))
  problem = _problem(2)
  jitted = lambda m: jax.jit(lambda *args: _calls(m, *args))
  assert_trees_close(jitted(_OURS)(*problem), jitted(_THEIRS)(*problem))
  # The Hessian's diagonal is the diagonal of the full Hessian.
  params, inputs, targets, _ = problem
  flat, unravel = flatten_util.ravel_pytree(params)
  full = jax.hessian(lambda f: _loss(unravel(f), inputs, targets))(flat)
  np.testing.assert_allclose(_OURS.hessian_diag(_loss, params, inputs, targets),
                             jnp.diag(full), rtol=1e-5, atol=1e-6)


def test_under_vmap():
  params, inputs, targets, v = _problem(3)
  vs = jnp.stack([v, -2 * v, jnp.zeros_like(v)])
  hvps = lambda m: jax.jit(jax.vmap(lambda v: m.hvp(_loss, v, params, inputs, targets)))
  assert_trees_close(hvps(_OURS)(vs), hvps(_THEIRS)(vs))
  per_example = lambda m, name: jax.jit(jax.vmap(
      lambda x, y: getattr(m, name)(_loss, params, x[None], y[None])))
  for name in ("fisher_diag", "hessian_diag"):
    assert_trees_close(per_example(_OURS, name)(inputs, targets),
                 per_example(_THEIRS, name)(inputs, targets))


def test_bfloat16_params():
  problem = _problem(4, jnp.bfloat16)
  for name in ("hvp", "fisher_diag"):
    assert_trees_close(_call(_OURS, name, *problem), _call(_THEIRS, name, *problem))
  # optax's hessian_diag raises here (float32 unit vectors as the tangents
  # of bfloat16 params); shardopt's takes them in the params' dtype.
  params, inputs, targets, _ = problem
  with pytest.raises(TypeError, match="primal and tangent"):
    _THEIRS.hessian_diag(_loss, params, inputs, targets)
  ours = _OURS.hessian_diag(_loss, params, inputs, targets)
  assert (ours.dtype, ours.shape) == (jnp.bfloat16, (24,))
  full_precision = _OURS.hessian_diag(
      _loss, *jax.tree.map(lambda x: x.astype(jnp.float32), (params, inputs, targets)))
  np.testing.assert_allclose(np.asarray(ours, np.float32), full_precision,
                             rtol=0.05, atol=0.05)


def _recorded(call):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    call()
  return caught


@pytest.mark.parametrize("name", _NAMES)
def test_deprecation_warnings_are_optaxs_naming_shardopts_functions(name):
  problem = _problem(5)
  theirs = _recorded(lambda: _call(_THEIRS, name, *problem))
  ours = _recorded(lambda: _call(_OURS, name, *problem))
  # One warning per call of a deprecated function: hessian_diag's, then that
  # of the hvp it calls; the same category and text, naming shardopt's.
  assert [w.category for w in ours] == [w.category for w in theirs]
  assert all(w.category is DeprecationWarning for w in ours)
  called = [str(w.message).split()[2] for w in theirs]
  assert called == ([name, "hvp"] if name == "hessian_diag" else [name])
  for got, want, function in zip(ours, theirs, called):
    assert str(got.message) == str(want.message).replace(
        f"The function {function} is deprecated.",
        f"The function shardopt.second_order.{function} is deprecated (as in optax 0.2.8).")
  # The first warning points at the caller (this file), as optax's does.
  assert ours[0].filename == theirs[0].filename == __file__


@pytest.mark.parametrize("name", _NAMES)
def test_signature_and_docstring(name):
  ours, theirs = getattr(_OURS, name), getattr(_THEIRS, name)
  strip = lambda f: [(p.name, p.default, p.kind) for p in inspect.signature(f).parameters.values()]
  assert strip(ours) == strip(theirs)
  assert ours.__name__ == name
  assert docstring_problems(ours, references=name != "fisher_diag") == []
  assert set(_OURS.__all__) == {n for n in dir(_THEIRS) if not n.startswith("_")}
