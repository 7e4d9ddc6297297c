"""The catalogue's remaining aliases against optax (20 steps, mixed tree)."""

import inspect

import jax
import optax
import pytest

import shardopt
from tests import oracle
from tests.test_linesearch import assert_runs_match, run


def _matrices(params):
  return jax.tree.map(lambda p: p.ndim > 1, params)


def _decay(count):
  return 0.05 * 0.95**count


# (name, kwargs, needs_params). Cases run jitted and eager, with and without
# params (only with params when needed: add_decayed_weights reads them).
CASES = [
    ("adabelief", dict(learning_rate=0.01), False),
    ("adabelief", dict(learning_rate=_decay, b1=0.8, eps=1e-8, nesterov=True),
     False),
    ("adadelta", dict(), True),
    ("adadelta", dict(learning_rate=0.5, rho=0.8, eps=1e-4, weight_decay=0.1,
                      weight_decay_mask=_matrices), True),
    ("adamax", dict(learning_rate=0.01), False),
    ("adamax", dict(learning_rate=_decay, b1=0.8, b2=0.99, eps=1e-6), False),
    ("adamaxw", dict(learning_rate=0.01), True),
    ("adamaxw", dict(learning_rate=0.01, weight_decay=0.1, mask=_matrices),
     True),
    ("adan", dict(learning_rate=0.01), True),
    ("adan", dict(learning_rate=_decay, b1=0.9, b2=0.8, b3=0.95, eps_root=0.0,
                  weight_decay=0.05, mask=_matrices), True),
    ("amsgrad", dict(learning_rate=0.01), False),
    ("amsgrad", dict(learning_rate=0.01, b1=0.8, bias_correction_mu=False,
                     bias_correction_nu=False), False),
    ("lion", dict(learning_rate=0.01), True),
    ("lion", dict(learning_rate=_decay, b1=0.8, b2=0.9, weight_decay=0.1,
                  mask=_matrices), True),
    ("nadam", dict(learning_rate=0.01), False),
    ("nadam", dict(learning_rate=_decay, b1=0.8, eps_root=1e-8), False),
    ("nadam", dict(learning_rate=0.01, b1=0.8, nesterov=False), False),
    ("nadam", dict(learning_rate=0.01, b1=0.8, nesterov=True), False),
    ("nadamw", dict(learning_rate=0.01), True),
    ("nadamw", dict(learning_rate=0.01, weight_decay=0.1, mask=_matrices),
     True),
    ("nadamw", dict(learning_rate=0.01, weight_decay=0.1, nesterov=False),
     True),
    ("nadamw", dict(learning_rate=0.01, weight_decay=0.1, nesterov=True),
     True),
    ("novograd", dict(learning_rate=0.01), True),
    ("novograd", dict(learning_rate=_decay, b1=0.8, b2=0.5, weight_decay=0.01),
     True),
    ("yogi", dict(learning_rate=0.01), False),
    ("yogi", dict(learning_rate=_decay, b1=0.8, b2=0.99, eps=1e-2), False),
    ("sign_sgd", dict(learning_rate=0.01), False),
    ("signum", dict(learning_rate=0.01), False),
    ("signum", dict(learning_rate=_decay, beta=0.5), False),
    ("rprop", dict(learning_rate=0.01), False),
    ("rprop", dict(learning_rate=0.1, eta_minus=0.3, eta_plus=1.5,
                   min_step_size=0.01, max_step_size=0.2), False),
    ("optimistic_gradient_descent", dict(learning_rate=0.01), False),
    ("optimistic_gradient_descent", dict(learning_rate=_decay, alpha=0.5,
                                         beta=0.2), False),
    ("lars", dict(learning_rate=0.1), True),
    ("lars", dict(learning_rate=_decay, weight_decay=0.01,
                  weight_decay_mask=_matrices, trust_coefficient=0.01,
                  eps=1e-6, trust_ratio_mask=_matrices, momentum=0.5,
                  nesterov=True), True),
]


test_matches_optax = oracle.matches_optax_test(CASES)


@pytest.mark.parametrize("kwargs", [
    dict(), dict(max_learning_rate=0.3, scaling=_decay, f_min=0.5, eps=1e-3,
                 variant="sps+")])
def test_polyak_sgd_matches_optax(kwargs):
  # The driver also passes grad= and value_fn=, which polyak_sgd ignores.
  ours, theirs = run(shardopt.polyak_sgd(**kwargs)), run(optax.polyak_sgd(**kwargs))
  assert_runs_match(ours, theirs)
  assert float(ours[-1][0]) < float(ours[0][0])


@pytest.mark.default_codegen
@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(learning_rate=0.1, memory_size=4, scale_init_precond=False,
         linesearch=None),
])
def test_lbfgs_matches_optax(kwargs):
  ours, theirs = run(shardopt.lbfgs(**kwargs)), run(optax.lbfgs(**kwargs))
  assert_runs_match(ours, theirs)
  assert float(ours[-1][0]) < float(ours[0][0])


@pytest.mark.parametrize("name", ["nadam", "nadamw"])
def test_nadam_signature_matches_optax(name):
  # ``nesterov`` is keyword-only in optax; names, kinds and defaults agree.
  def shape(fn):
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(fn).parameters.values()]
  assert shape(getattr(shardopt, name)) == shape(getattr(optax, name))
