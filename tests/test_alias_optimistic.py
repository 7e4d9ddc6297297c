"""optimistic_adam and optimistic_adam_v2 against optax's."""

import optax
import pytest

import shardopt
from tests import oracle

pytestmark = pytest.mark.filterwarnings(
    "ignore:`optimistic_adam` is deprecated:DeprecationWarning")

test_matches_optax = oracle.matches_optax_test([
    ("optimistic_adam", {"learning_rate": 0.1}),
    ("optimistic_adam", {"learning_rate": 0.1, "optimism": 0.5,
                         "nesterov": False}),
    ("optimistic_adam_v2", {"learning_rate": lambda count: 0.1 / (1 + count),
                            "alpha": 0.5, "beta": 2.0}),
])


def test_schedule_in_first_interface_is_refused():
  with pytest.raises(ValueError, match="optimistic_adam_v2"):
    shardopt.optimistic_adam(lambda count: 0.1)


def test_optimistic_adam_is_deprecated_as_in_optax():
  for lib in (shardopt, optax):
    with pytest.warns(DeprecationWarning, match="use `optimistic_adam_v2` instead"):
      lib.optimistic_adam(0.1)
