"""shardopt.perturbations against optax.perturbations: with the same key, the
same samples, values and derivatives (first and second order; rtol 1e-6 in
float32) and dtypes, for Gumbel and Normal noise, with and without the
baseline, on arrays and pytrees, eagerly, under jit and under vmap."""

import inspect

import jax
import jax.numpy as jnp
import optax
import pytest

from shardopt import perturbations
from tests.oracle import assert_trees_close
from tests.test_docstrings import docstring_problems

_OURS, _THEIRS = perturbations, optax.perturbations
_NUM_SAMPLES = 64



def _relu_sum(x):
  """Piecewise linear, scalar: sum of max(x, 0) over a pytree."""
  return sum(jnp.sum(jnp.maximum(leaf, 0.0)) for leaf in jax.tree.leaves(x))


def _argmax_one_hot(x):
  """Piecewise constant, pytree in and out: a one-hot of each leaf's argmax."""
  return jax.tree.map(lambda leaf: jax.nn.one_hot(jnp.argmax(leaf), leaf.size), x)


def _tree(seed):
  keys = jax.random.split(jax.random.PRNGKey(seed), 2)
  return {"a": jax.random.normal(keys[0], (5,)), "b": [jax.random.normal(keys[1], (3,))]}


def _perturbed(module, fun, noise, use_baseline, sigma=0.5):
  return module.make_perturbed_fun(fun, num_samples=_NUM_SAMPLES, sigma=sigma,
                                   noise=getattr(module, noise)(),
                                   use_baseline=use_baseline)


_SETTINGS = [(noise, baseline) for noise in ("Gumbel", "Normal") for baseline in (True, False)]


@pytest.mark.parametrize("noise,use_baseline", _SETTINGS)
def test_values_and_gradients_match_optax_with_the_same_key(noise, use_baseline):
  key, x = jax.random.key(0), _tree(1)
  for fun in (_relu_sum, _argmax_one_hot):
    ours, theirs = (_perturbed(m, fun, noise, use_baseline) for m in (_OURS, _THEIRS))
    assert_trees_close(jax.jit(ours)(key, x), jax.jit(theirs)(key, x))
  # A scalar function's gradient, and a pytree-valued one's Jacobian.
  grad = lambda m: jax.jit(jax.grad(_perturbed(m, _relu_sum, noise, use_baseline),
                                    argnums=1))
  assert_trees_close(grad(_OURS)(key, x), grad(_THEIRS)(key, x))
  vector = x["a"]
  jacobian = lambda m: jax.jit(jax.jacobian(
      _perturbed(m, _argmax_one_hot, noise, use_baseline), argnums=1))
  assert_trees_close(jacobian(_OURS)(key, vector), jacobian(_THEIRS)(key, vector))


def test_eager_values_default_arguments_and_second_derivatives():
  # The defaults (1000 samples, sigma 0.1, Gumbel noise, a baseline), eagerly.
  key, x = jax.random.PRNGKey(3), jnp.array([0.05, -0.02, 0.3])
  ours, theirs = (m.make_perturbed_fun(_relu_sum) for m in (_OURS, _THEIRS))
  assert_trees_close(ours(key, x), theirs(key, x))
  # Derivatives of any order: the Hessian estimate (the magic box's second
  # derivative), on a small sample.
  hessian = lambda m: jax.jit(jax.hessian(
      _perturbed(m, _relu_sum, "Normal", True), argnums=1))
  assert_trees_close(hessian(_OURS)(key, x), hessian(_THEIRS)(key, x))


def test_vmap_over_keys_and_inputs_and_an_array_sigma():
  keys = jax.random.split(jax.random.key(4), 3)
  xs = jax.random.normal(jax.random.PRNGKey(5), (3, 6))
  sigma = jnp.float32(0.3)
  run = lambda m: jax.jit(jax.vmap(_perturbed(m, _argmax_one_hot, "Gumbel", True, sigma)))
  assert_trees_close(run(_OURS)(keys, xs), run(_THEIRS)(keys, xs))
  grads = lambda m: jax.jit(jax.vmap(jax.grad(
      _perturbed(m, _relu_sum, "Gumbel", True, sigma), argnums=1)))
  assert_trees_close(grads(_OURS)(keys, xs), grads(_THEIRS)(keys, xs))


def test_bfloat16_inputs_give_optaxs_dtypes():
  key = jax.random.key(6)
  x = {"a": jnp.array([0.5, -1.0, 2.0], jnp.bfloat16), "b": jnp.array([0.25, 1.0])}
  for fun in (_relu_sum, _argmax_one_hot):
    ours, theirs = (_perturbed(m, fun, "Normal", True) for m in (_OURS, _THEIRS))
    assert_trees_close(jax.jit(ours)(key, x), jax.jit(theirs)(key, x))
  grad = lambda m: jax.jit(jax.grad(_perturbed(m, _relu_sum, "Normal", True), argnums=1))
  assert_trees_close(grad(_OURS)(key, x), grad(_THEIRS)(key, x))


@pytest.mark.parametrize("noise", ["Gumbel", "Normal"])
def test_noise_samples_and_log_densities_match_optax(noise):
  ours, theirs = getattr(_OURS, noise)(), getattr(_THEIRS, noise)()
  key = jax.random.key(7)
  for args in [(), ((4, 3),), ((5,), jnp.bfloat16)]:
    assert_trees_close(ours.sample(key, *args), theirs.sample(key, *args))
  points = jnp.linspace(-3.0, 3.0, 13)
  assert_trees_close(ours.log_prob(points), theirs.log_prob(points))
  assert_trees_close(jax.vmap(jax.grad(ours.log_prob))(points),
               jax.vmap(jax.grad(theirs.log_prob))(points))


@pytest.mark.parametrize("name", ["make_perturbed_fun", "Normal.sample", "Gumbel.sample",
                                  "Normal.log_prob", "Gumbel.log_prob"])
def test_signature_and_docstring(name):
  def get(module):  # methods bound to an instance (no self)
    owner, _, attribute = name.rpartition(".")
    return getattr(getattr(module, owner)() if owner else module, attribute)
  ours, theirs = get(_OURS), get(_THEIRS)
  default = lambda d: type(d).__name__ if isinstance(d, (_OURS.Gumbel, _THEIRS.Gumbel)) else d
  strip = lambda f: [(p.name, p.kind, default(p.default))
                     for p in inspect.signature(f).parameters.values()]
  assert strip(ours) == strip(theirs)
  assert docstring_problems(ours, references=name == "make_perturbed_fun") == []
  default_noise = inspect.signature(_OURS.make_perturbed_fun).parameters["noise"].default
  assert isinstance(default_noise, _OURS.Gumbel)
  assert set(_OURS.__all__) == {n for n in dir(_THEIRS) if not n.startswith("_")}
