"""Every schedule against optax's at many steps, jitted and on Python ints."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from shardopt import schedules

CASES = [
    ("constant_schedule", dict(value=0.3)),
    ("polynomial_schedule", dict(init_value=1.0, end_value=0.01, power=2,
                                 transition_steps=100, transition_begin=5)),
    ("polynomial_schedule", dict(init_value=1.0, end_value=0.5, power=1.5,
                                 transition_steps=0)),
    ("polynomial_schedule", dict(init_value=2.0, end_value=0.5, power=0.5,
                                 transition_steps=50, transition_begin=-3)),
    ("linear_schedule", dict(init_value=0.0, end_value=1e-3,
                             transition_steps=30)),
    ("piecewise_constant_schedule", dict(
        init_value=1.0, boundaries_and_scales={100: 0.1, 20: 0.5, 60: 2.0})),
    ("piecewise_constant_schedule", dict(init_value=0.1)),
    ("exponential_decay", dict(init_value=1.0, transition_steps=10,
                               decay_rate=0.9)),
    ("exponential_decay", dict(init_value=1.0, transition_steps=7,
                               decay_rate=0.5, transition_begin=12,
                               staircase=True, end_value=0.05)),
    ("exponential_decay", dict(init_value=0.1, transition_steps=10,
                               decay_rate=1.5, end_value=0.4)),
    ("exponential_decay", dict(init_value=0.1, transition_steps=10,
                               decay_rate=0.0)),
    ("cosine_decay_schedule", dict(init_value=0.5, decay_steps=90)),
    ("cosine_decay_schedule", dict(init_value=0.5, decay_steps=70, alpha=0.1,
                                   exponent=2.0)),
    ("piecewise_interpolate_schedule", dict(
        interpolate_type="linear", init_value=1.0,
        boundaries_and_scales={40: 0.1, 10: 2.0, 80: 0.5})),
    ("piecewise_interpolate_schedule", dict(
        interpolate_type="cosine", init_value=1.0,
        boundaries_and_scales={30: 0.1, 90: 0.01})),
    ("piecewise_interpolate_schedule", dict(
        interpolate_type="linear", init_value=0.7)),
    ("linear_onecycle_schedule", dict(transition_steps=100, peak_value=1.0)),
    ("cosine_onecycle_schedule", dict(transition_steps=100, peak_value=0.5,
                                      pct_start=0.2, div_factor=10.0)),
    ("warmup_constant_schedule", dict(init_value=0.0, peak_value=1.0,
                                      warmup_steps=15)),
    ("warmup_cosine_decay_schedule", dict(init_value=0.0, peak_value=1.0,
                                          warmup_steps=10, decay_steps=100,
                                          end_value=0.01)),
    ("warmup_cosine_decay_schedule", dict(init_value=0.1, peak_value=0.0,
                                          warmup_steps=5, decay_steps=50)),
    ("warmup_exponential_decay_schedule", dict(
        init_value=0.0, peak_value=1.0, warmup_steps=10, transition_steps=8,
        decay_rate=0.7, transition_begin=5, staircase=True, end_value=0.1)),
    ("sgdr_schedule", dict(cosine_kwargs=[
        dict(init_value=0.0, peak_value=1.0, warmup_steps=5, decay_steps=40),
        dict(init_value=0.1, peak_value=0.5, warmup_steps=3, decay_steps=30,
             end_value=0.05),
        dict(init_value=0.0, peak_value=0.2, warmup_steps=0, decay_steps=50),
    ])),
]

COUNTS = np.concatenate([np.arange(0, 130), [1_000, 2**30]]).astype(np.int32)
PYTHON_COUNTS = [0, 1, 10, 20, 39, 40, 41, 99, 100, 101]


def _values(schedule, counts):
  return np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(counts)))


@pytest.mark.parametrize("name,kwargs", CASES, ids=[c[0] for c in CASES])
def test_matches_optax(name, kwargs):
  ours = getattr(shardopt, name)(**kwargs)
  theirs = getattr(optax, name)(**kwargs)
  np.testing.assert_allclose(
      _values(ours, COUNTS), _values(theirs, COUNTS), rtol=1e-6, atol=1e-7)
  for count in PYTHON_COUNTS:
    np.testing.assert_allclose(
        ours(count), theirs(count), rtol=1e-6, atol=1e-7, err_msg=f"{count}")


def test_cosine_decay_takes_python_counts_beyond_int32():
  ours = shardopt.cosine_decay_schedule(0.5, 4_000_000_000, alpha=0.1)
  theirs = optax.cosine_decay_schedule(0.5, 4_000_000_000, alpha=0.1)
  for count in [3_000_000_000, 5_000_000_000]:
    np.testing.assert_allclose(ours(count), theirs(count), rtol=1e-6)
  np.testing.assert_allclose(ours(5_000_000_000), 0.05, rtol=1e-6)


def test_join_schedules_matches_optax():
  parts = [optax.constant_schedule(1.0), optax.linear_schedule(1.0, 0.0, 20),
           optax.cosine_decay_schedule(0.5, 30)]
  ours = shardopt.join_schedules(parts, [10, 40])
  theirs = optax.join_schedules(parts, [10, 40])
  np.testing.assert_allclose(_values(ours, COUNTS), _values(theirs, COUNTS),
                             rtol=1e-6, atol=1e-7)


def test_importable_from_package_and_module():
  # optax.schedules also holds the injection wrappers and the schedule types
  wrappers = {"InjectHyperparamsState", "InjectStatefulHyperparamsState", "Schedule",
              "StatefulSchedule", "WrappedSchedule", "inject_hyperparams",
              "inject_stateful_hyperparams"}
  schedule_fns = set(schedules.__all__) - wrappers - {"join_schedules"}
  assert {c[0] for c in CASES} == schedule_fns
  for name in schedule_fns | {"join_schedules", "inject_hyperparams"}:
    assert getattr(shardopt, name) is getattr(schedules, name)


@pytest.mark.parametrize("make", [
    lambda: shardopt.piecewise_constant_schedule(1.0, {10: -0.1}),
    lambda: shardopt.piecewise_interpolate_schedule("linear", 1.0, {5: -1.0}),
    lambda: shardopt.piecewise_interpolate_schedule("cubic", 1.0),
    lambda: shardopt.cosine_decay_schedule(1.0, 0),
    lambda: shardopt.linear_onecycle_schedule(0, 1.0),
    lambda: shardopt.cosine_onecycle_schedule(-5, 1.0),
])
def test_bad_arguments_raise(make):
  with pytest.raises(ValueError):
    make()


_DTYPE_CASES = CASES + [
    ("piecewise_constant_schedule", dict(init_value=1, boundaries_and_scales={3: 2})),
    ("piecewise_constant_schedule", dict(init_value=jnp.bfloat16(1.0),
                                         boundaries_and_scales={3: 0.5})),
]


@pytest.mark.parametrize("name,kwargs", _DTYPE_CASES, ids=[c[0] for c in _DTYPE_CASES])
@pytest.mark.parametrize("count", [jnp.int32(5), jnp.float32(5.0), 5])
def test_value_dtypes_match_optax(name, kwargs, count):
  # An int or bfloat16 init_value promotes with the count as optax's does.
  ours = jnp.asarray(getattr(shardopt, name)(**kwargs)(count))
  theirs = jnp.asarray(getattr(optax, name)(**kwargs)(count))
  assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape)
  np.testing.assert_allclose(ours.astype(np.float32), theirs.astype(np.float32), rtol=1e-6)
