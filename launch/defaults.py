"""The default learning rate of each optimizer family (no jax imported).

Each is the best of a learning-rate sweep on the LM demo (the job's default
model, data and 200 steps, warmup-cosine schedule to 0.1 x lr, clipping at
1.0, seed 0), ranked by the mean training loss of the last 10 steps:
``python -m benchmarks.matrix_optimizers`` writes the sweep to ``SOURCE``,
and tests/test_launch_config.py checks that this table equals its best rates.
The schedule default (warmup-cosine) is the one the sweep ran for every
optimizer. ``adam`` takes ``adamw``'s rate (not swept on its own); an
optimizer outside the table takes ``FALLBACK`` (not swept).

An optimizer whose line search picks the step length (``LINE_SEARCH``, not
swept) takes the rate its method defines, 1.0 (the rate scales the direction
the search starts from), and a constant schedule: L-BFGS from a warmup at 0
never moves, in shardopt as in optax (the first step is zero, and its
curvature pair, a zero param difference against a nonzero gradient
difference between two batches, scales every later direction to zero).
An optimizer that estimates its own step size (``ADAPTIVE_STEP``: Prodigy,
D-Adaptation) takes the rate its method defines, 1.0 (a scale of its
estimate), and a constant schedule too: from a warmup at 0 its first
estimate is 0 / 0, nan, in shardopt as in optax.
"""

__all__ = ["ADAPTIVE_STEP", "FALLBACK", "LEARNING_RATES", "LINE_SEARCH", "SOURCE", "describe",
           "learning_rate", "schedule", "source"]

SOURCE = "benchmarks/results/matrix_optimizers.md"
LEARNING_RATES = {
    "muon": 0.03, "adamw": 0.01, "adam": 0.01, "soap": 0.03, "shampoo": 0.01,
    "adafactor": 0.1, "sgd": 1.0, "lion": 0.003,
}
FALLBACK = 3e-3
LINE_SEARCH = {"lbfgs": 1.0}
ADAPTIVE_STEP = {"prodigy": 1.0, "dadapt_adamw": 1.0}
_CONSTANT_SCHEDULE = {**LINE_SEARCH, **ADAPTIVE_STEP}


def learning_rate(optimizer: str) -> float:
  """The default --lr of ``optimizer``."""
  return LEARNING_RATES.get(optimizer, _CONSTANT_SCHEDULE.get(optimizer, FALLBACK))


def source(optimizer: str) -> str:
  """Where the default --lr of ``optimizer`` comes from."""
  return SOURCE if optimizer in LEARNING_RATES else "not swept, launch/defaults.py"


def schedule(optimizer: str) -> str:
  """The default --schedule of ``optimizer``."""
  return "constant" if optimizer in _CONSTANT_SCHEDULE else "warmup_cosine"


def describe() -> str:
  """The table in one line (for --help)."""
  rates = ", ".join(f"{name} {lr:g}" for name, lr in LEARNING_RATES.items())
  searches = ", ".join(f"{name} {lr:g}" for name, lr in LINE_SEARCH.items())
  adaptive = ", ".join(f"{name} {lr:g}" for name, lr in ADAPTIVE_STEP.items())
  return (f"{rates}; any other {FALLBACK:g}; {searches} (line search, constant schedule);"
          f" {adaptive} (adaptive step size, constant schedule)")
