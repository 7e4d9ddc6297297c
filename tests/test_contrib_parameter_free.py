"""shardopt.contrib's first half where the harness does not reach: options
other than the catalogue's, MoMo's ``value`` argument, the learning-rate
estimates of D-Adaptation and Prodigy over 20 steps, and the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardopt
from shardopt import contrib
from tests import oracle

_VALUE = {"value": jnp.asarray(1.3)}

# (name, kwargs, extra args of update): variants beyond tests/catalogue.py's.
CASES = [
    ("scale_by_acprop", {"eps_root": 1e-8, "b2": 0.99}, None),
    ("acprop", {"learning_rate": 0.1, "weight_decay": 0.1,
                "mask": lambda p: jax.tree.map(lambda x: x.ndim > 1, p)}, None),
    ("scale_by_ademamix", {"b3": lambda c: 0.9 + 0.09 * c / (c + 1.0),
                           "alpha": lambda c: 1.0 + c / 10.0,
                           "eps_root": 1e-8}, None),
    ("ademamix", {"learning_rate": 0.1, "mu_dtype": jnp.bfloat16}, None),
    ("scale_by_simplified_ademamix", {"alpha": lambda t: t / 4.0}, None),
    ("adopt", {"learning_rate": 0.1, "use_clipping": False}, None),
    ("adopt", {"learning_rate": 0.1, "mu_dtype": jnp.bfloat16,
               "clip_value_fn": lambda c: 0.5 + c**0.5}, None),
    ("cocob", {"learning_rate": 0.5, "alpha": 10.0}, None),
    ("dadapt_adamw", {"learning_rate": lambda c: 1.0 / (1.0 + c),
                      "betas": (0.8, 0.99), "estim_lr0": 1e-3}, None),
    ("dog", {"init_step": ("distance", 0.1)}, None),
    ("dog", {"init_step": ("learning_rate", 0.05), "learning_rate": 0.5},
     None),
    ("dowg", {"init_estim_sq_dist": 0.01, "learning_rate": 0.5}, None),
    ("madgrad", {"learning_rate": lambda c: 0.1 / (1.0 + c),
                 "momentum": 0.5}, None),
    ("mechanize", {"base_optimizer": optax.adam(0.1), "num_betas": 3,
                   "weight_decay": 0.0}, None),
    ("momo", {"learning_rate": 0.1}, _VALUE),
    ("momo", {"learning_rate": 0.1, "weight_decay": 0.01, "lower_bound": 0.2,
              "beta": 0.8}, _VALUE),
    ("momo_adam", {"learning_rate": 0.1}, _VALUE),
    ("momo_adam", {"learning_rate": 0.1, "weight_decay": 0.01,
                   "adapt_lower_bound": True, "lower_bound": 0.1}, _VALUE),
    ("prodigy", {"safeguard_warmup": True, "beta3": 0.9,
                 "estim_lr_coef": 2.0}, None),
    # eps is scaled by the estimate updated in this step.
    ("prodigy", {"eps": 1e-2}, None),
    ("prodigy", {"learning_rate": lambda c: jnp.minimum(0.1 + 0.3 * c, 1.0),
                 "eps": 1e-3, "estim_lr0": 1e-4}, None),
]


def _ours_and_optax(name, kwargs):
  ours = dict(kwargs)
  if name == "mechanize":  # the base optimizer of each library
    ours["base_optimizer"] = shardopt.adam(0.1)
  return getattr(contrib, name)(**ours), getattr(optax.contrib, name)(**kwargs)


@pytest.mark.parametrize("name,kwargs,extra", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_matches_optax(name, kwargs, extra):
  ours, theirs = _ours_and_optax(name, kwargs)
  params = oracle.mixed_tree()
  got = oracle.run_updates(ours, params, 20, with_params=True, jit=True,
                           extra_args=extra)
  want = oracle.run_updates(theirs, params, 20, with_params=True, jit=True,
                            extra_args=extra)
  for step, (g, w) in enumerate(zip(got, want)):
    try:
      oracle.assert_trees_close(g, w, rtol=2e-6, atol=1e-7)
    except AssertionError as err:
      raise AssertionError(f"step {step}: {err}") from None


def _estimates(tx, steps=20):
  """estim_lr after each of ``steps`` steps."""
  params = oracle.mixed_tree()
  state, found = tx.init(params), []
  update = jax.jit(tx.update)
  for grads in oracle.gradient_stream(params, steps):
    updates, state = update(grads, state, params)
    params = jax.tree.map(jnp.add, params, updates)
    found.append(float(state.estim_lr))
  return np.array(found)


@pytest.mark.parametrize("name", ["dadapt_adamw", "prodigy"])
def test_learning_rate_estimates_over_20_steps(name):
  ours = _estimates(getattr(contrib, name)())
  want = _estimates(getattr(optax.contrib, name)())
  np.testing.assert_allclose(ours, want, rtol=1e-5)
  assert np.all(np.diff(ours) >= 0), "the estimate never decreases"
  assert ours[-1] > 100 * 1e-6, f"it grew from estim_lr0=1e-6: {ours}"


def test_prodigy_warmup_from_zero_gives_optax_first_step():
  # A schedule at 0 makes the first estimate 0 / 0: nan, as in optax.
  schedule = lambda c: jnp.minimum(0.25 * c, 1.0)
  params = oracle.mixed_tree()
  got = oracle.run_updates(contrib.prodigy(schedule, eps=1e-2), params, 3,
                           with_params=True, jit=True)
  want = oracle.run_updates(optax.contrib.prodigy(schedule, eps=1e-2), params,
                            3, with_params=True, jit=True)
  assert all(np.isnan(leaf).all() for leaf in jax.tree.leaves(want[0]))
  for g, w in zip(got, want):
    oracle.assert_trees_close(g, w)


def test_momo_without_value_says_what_to_pass():
  tx = contrib.momo()
  params = oracle.mixed_tree()
  with pytest.raises(ValueError, match=r"value=loss"):
    tx.update(params, tx.init(params), params, value=None)


@pytest.mark.parametrize("name", ["cocob", "dadapt_adamw", "dog", "dowg",
                                  "madgrad", "prodigy"])
def test_update_without_params_names_the_optimizer(name):
  tx = getattr(contrib, name)(**({"learning_rate": 0.1}
                                 if name == "madgrad" else {}))
  params = oracle.mixed_tree()
  with pytest.raises(ValueError, match="needs the current params"):
    tx.update(params, tx.init(params))


def test_dog_rejects_an_unknown_init_step():
  with pytest.raises(ValueError, match="'distance', 'learning_rate' or"):
    contrib.dog(init_step=("guess", 1.0)).init(oracle.mixed_tree())


def test_state_classes_have_optax_fields():
  for name in ("ScaleByAdemamixState", "ScaleBySimplifiedAdEMAMixState",
               "COCOBState", "DAdaptAdamWState", "DoGState", "DoWGState",
               "MadgradState", "MechanicState", "MomoState", "MomoAdamState",
               "ProdigyState"):
    assert getattr(contrib, name)._fields == getattr(optax.contrib,
                                                     name)._fields, name
