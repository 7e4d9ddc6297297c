"""The optimizer aliases against optax's, step by step, and their signatures."""

import inspect

import jax
import jax.numpy as jnp
import optax
import pytest

import shardopt
from tests import oracle


def _schedule(count):
  return 0.05 * 0.95**count


def _no_bias(params):
  return jax.tree.map(lambda p: p.ndim > 1, params)


# (alias, kwargs, whether the update needs the params)
CASES = [
    ("sgd", dict(learning_rate=0.1), False),
    ("sgd", dict(learning_rate=_schedule, momentum=0.9, nesterov=True), False),
    ("sgd", dict(learning_rate=0.1, momentum=0.8,
                 accumulator_dtype=jnp.bfloat16), False),
    ("adam", dict(learning_rate=0.01), False),
    ("adam", dict(learning_rate=_schedule, b1=0.8, eps_root=1e-8,
                  mu_dtype=jnp.bfloat16, nesterov=True), False),
    ("adamw", dict(learning_rate=0.01), True),
    ("adamw", dict(learning_rate=_schedule, weight_decay=0.1, mask=_no_bias,
                   nesterov=True), True),
    ("lamb", dict(learning_rate=0.01), True),
    ("lamb", dict(learning_rate=_schedule, weight_decay=0.01,
                  mask=_no_bias), True),
    ("radam", dict(learning_rate=0.01), False),
    ("radam", dict(learning_rate=0.01, threshold=3.0, nesterov=True), False),
    ("rmsprop", dict(learning_rate=0.01), False),
    ("rmsprop", dict(learning_rate=0.01, centered=True, momentum=0.9,
                     nesterov=True), False),
    ("rmsprop", dict(learning_rate=_schedule, initial_scale=1.0,
                     eps_in_sqrt=False, bias_correction=True), False),
    ("rmsprop", dict(learning_rate=0.01, centered=True, bias_correction=True,
                     momentum=0.5), False),
    ("sm3", dict(learning_rate=0.1), False),
    ("sm3", dict(learning_rate=0.1, momentum=0.5), False),
    ("adagrad", dict(learning_rate=0.1), False),
    ("adagrad", dict(learning_rate=_schedule, initial_accumulator_value=0.5,
                     eps=1e-5), False),
    ("fromage", dict(learning_rate=0.1), True),
    ("fromage", dict(learning_rate=_schedule, min_norm=1e-4), True),
    ("noisy_sgd", dict(learning_rate=0.1, key=0), False),
    ("noisy_sgd", dict(learning_rate=_schedule, eta=0.1, gamma=0.3,
                       key=jax.random.key(3)), False),
    ("adafactor", dict(learning_rate=0.01), True),
    ("adafactor", dict(learning_rate=_schedule, min_dim_size_to_factor=2,
                       decay_offset=2, momentum=0.9,
                       dtype_momentum=jnp.bfloat16, weight_decay_rate=0.01,
                       weight_decay_mask=_no_bias), True),
    ("adafactor", dict(min_dim_size_to_factor=2, decay_rate=0.5,
                       clipping_threshold=None,
                       multiply_by_parameter_scale=False), False),
    ("adafactor", dict(learning_rate=0.1, factored=False, eps=1e-20,
                       clipping_threshold=2.0), True),
]
IDS = [f"{name}{i}" for i, (name, _, _) in enumerate(CASES)]
# Op-by-op (not jitted) runs are slow: one case per alias.
EAGER = {name: i for i, (name, _, _) in reversed(list(enumerate(CASES)))}


def _params(name):
  params = oracle.mixed_tree()
  if name == "sm3":  # optax's SM3 fails on scalar params (IndexError).
    params["scalar"] = params["scalar"].reshape(1)
  return params


@pytest.mark.parametrize("name,kwargs,needs_params", CASES, ids=IDS)
def test_matches_optax_jitted(name, kwargs, needs_params):
  _check_against_optax(name, kwargs, needs_params, jit=True)


@pytest.mark.parametrize(
    "name,kwargs,needs_params", [CASES[i] for i in EAGER.values()],
    ids=[IDS[i] for i in EAGER.values()])
def test_matches_optax_op_by_op(name, kwargs, needs_params):
  _check_against_optax(name, kwargs, needs_params, jit=False)


def _check_against_optax(name, kwargs, needs_params, jit):
  ours = getattr(shardopt, name)(**kwargs)
  assert isinstance(ours, shardopt.GradientTransformationExtraArgs)
  oracle.assert_matches_optax(
      ours, getattr(optax, name)(**kwargs), params=_params(name), jit=jit,
      with_params=needs_params or jit)


@pytest.mark.parametrize("name", [
    "adafactor", "adagrad", "adam", "adamw", "fromage", "lamb", "noisy_sgd",
    "radam", "rmsprop", "sgd", "sm3"])
def test_signature_matches_optax(name):
  ours = inspect.signature(getattr(shardopt, name)).parameters
  theirs = inspect.signature(getattr(optax, name)).parameters
  extra = {"nu_dtype", "state_bits"} if name in ("adam", "adamw") else set()
  assert set(ours) - set(theirs) == extra
  for key, param in theirs.items():
    assert (ours[key].kind, ours[key].default) == (param.kind, param.default)


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_nu_dtype_reaches_the_state(name):
  tx = getattr(shardopt, name)(0.01, mu_dtype=jnp.bfloat16,
                               nu_dtype=jnp.bfloat16)
  state = tx.init(oracle.mixed_tree())
  adam_state = state[0]
  bf16 = jnp.dtype(jnp.bfloat16)
  assert {x.dtype for x in jax.tree.leaves(adam_state.mu)} == {bf16}
  assert {x.dtype for x in jax.tree.leaves(adam_state.nu)} == {bf16}
  params = oracle.mixed_tree()
  updates, _ = tx.update(params, state, params)
  assert jax.tree.map(lambda u: u.dtype, updates) == jax.tree.map(
      lambda p: p.dtype, params)


def test_sm3_alias_takes_a_schedule():
  params = _params("sm3")
  oracle.assert_matches_optax(
      shardopt.sm3(_schedule),
      optax.chain(optax.scale_by_sm3(0.9), optax.scale_by_learning_rate(
          _schedule)), params=params, steps=5)
