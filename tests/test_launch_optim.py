"""launch/optim.py: --optimizer names in shardopt and shardopt.contrib, --opt types, the
learning rate as each alias takes it."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launch import arg_checks
from launch import cli
from launch import optim
from launch import validation
import partitioning
import shardopt


def _args(tmp_path, *argv):
  return cli.parse_args([*argv, "--out", str(tmp_path / "run")])


@pytest.mark.parametrize("name, home", [
    ("adamw", shardopt), ("muon", shardopt.contrib), ("shampoo", shardopt.contrib),
    ("soap", shardopt.contrib)])
def test_optimizer_names_resolve(name, home):
  assert optim._alias(name) is getattr(home, name)


def test_integer_keywords_stay_integers(tmp_path):
  args = _args(tmp_path, "--optimizer", "shampoo", "--opt", "block_size=16",
               "--opt", "precondition_frequency=5", "--opt", "eps=1e-4")
  kwargs = optim.optimizer_kwargs(args, shardopt.contrib.shampoo)
  assert kwargs == {"block_size": 16, "precondition_frequency": 5, "eps": 1e-4}
  assert [type(kwargs[k]) for k in kwargs] == [int, int, float]
  args = _args(tmp_path, "--optimizer", "adamw", "--opt", "state_bits=8")
  kwargs = optim.optimizer_kwargs(args, shardopt.adamw)  # annotated int | None
  assert kwargs == {"state_bits": 8} and type(kwargs["state_bits"]) is int


def _fraction_keywords(factory):
  """The keywords of ``factory`` whose default is a float (b1, momentum, eps, decay_rate...)."""
  return [k for k, p in inspect.signature(factory).parameters.items()
          if isinstance(p.default, float)]


@pytest.mark.parametrize("name", ["adamw", "adafactor", "lion", "rmsprop", "muon", "shampoo"])
def test_fractions_pass_as_given(tmp_path, name):
  """Every keyword defaulting to a float takes a fraction, by its flag or by --opt (b1's
  annotation also names int: it is not an integer keyword)."""
  factory = optim._alias(name)
  keywords = _fraction_keywords(factory)
  assert keywords
  argv = []
  for k in keywords:
    argv += ([f"--{k.replace('_', '-')}", "0.375"] if k in arg_checks.HYPERPARAMETER_FLAGS
             else ["--opt", f"{k}=0.375"])
  kwargs = optim.optimizer_kwargs(_args(tmp_path, "--optimizer", name, *argv), factory)
  assert kwargs == {k: 0.375 for k in keywords}


def test_momentum_flag_reaches_sgd(tmp_path):
  args = _args(tmp_path, "--optimizer", "sgd", "--momentum", "0.9", "--schedule", "constant",
               "--clip-norm", "0",
               "--lr", "0.1")
  tx = optim.build_optimizer(args)
  params = {"w": jnp.ones(3)}
  updates, state = tx.update({"w": jnp.ones(3)}, tx.init(params), params)
  updates, _ = tx.update({"w": jnp.ones(3)}, state, params)
  np.testing.assert_allclose(updates["w"], -0.1 * 1.9, rtol=1e-6)  # trace 1 + 0.9


def test_a_fraction_for_an_integer_names_the_flag_given(tmp_path):
  args = _args(tmp_path, "--optimizer", "shampoo", "--opt", "block_size=16.5")
  with pytest.raises(cli.UsageError, match=r"^--opt block_size=16.5: shampoo's block_size takes an"):
    optim.optimizer_kwargs(args, shardopt.contrib.shampoo)


def test_unknown_name_points_to_contrib():
  with pytest.raises(cli.UsageError, match="shardopt.contrib"):
    optim._alias("no_such_optimizer")


def _aliases():
  """Every name --optimizer accepts: shardopt's and shardopt.contrib's
  functions taking a learning rate."""
  names = set()
  for home in (shardopt, shardopt.contrib):
    for name in dir(home):
      try:
        optim._alias(name)
      except cli.UsageError:
        continue
      names.add(name)
  return sorted(names)


def test_aliases_are_optimizers_not_state_classes():
  names = _aliases()
  assert {"adamw", "rprop", "muon", "sophia"} <= set(names)
  assert "ScaleByZoomLinesearchState" not in names  # has a learning_rate field


@pytest.mark.parametrize("name", _aliases())
def test_every_alias_builds_with_the_jobs_learning_rate_and_plans_its_state(
    tmp_path, name):
  """The job's learning rate as the alias declares it: a schedule by
  default, the number --lr with --schedule constant where the alias takes
  no schedule (else a usage error saying so); its state initialises and
  has a memory plan (PRNG keys included). An alias with required arguments
  is a usage error naming them."""
  factory = optim._alias(name)
  default = _args(tmp_path, "--optimizer", name)
  required = [k for k, p in inspect.signature(factory).parameters.items()
              if p.default is p.empty and k != "learning_rate"
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  if name in optim.NOT_IN_THE_JOB:  # dpsgd: per-example gradients
    with pytest.raises(cli.UsageError, match=f"^--optimizer {name}: cannot train in this job: "):
      optim.build_optimizer(default)
    return
  if required:  # schedule_free's base optimizer (not a number: no flag gives it)
    with pytest.raises(cli.UsageError, match=f"needs {', '.join(required)}[;,] "):
      optim.build_optimizer(default)
    return
  if not optim.takes_schedule(factory):
    with pytest.raises(cli.UsageError, match=f"^--optimizer {name}: .*pass --schedule constant"):
      optim.build_optimizer(default)
    default = _args(tmp_path, "--optimizer", name, "--schedule", "constant")
  tx = optim.build_optimizer(default)
  params = {"w": jax.ShapeDtypeStruct((8, 16), jnp.float32),
            "b": jax.ShapeDtypeStruct((16,), jnp.float32)}
  state = jax.eval_shape(tx.init, params)
  plan = partitioning.memory_plan(params, state, num_devices=1)
  assert plan.state.total_bytes == sum(
      x.size * x.dtype.itemsize for x in jax.tree.leaves(state))


def test_rprop_starts_from_the_step_size_lr(tmp_path):
  args = _args(tmp_path, "--optimizer", "rprop", "--schedule", "constant",
               "--lr", "0.01", "--clip-norm", "0")
  state = optim.build_optimizer(args).init({"w": jnp.ones((4,))})
  np.testing.assert_array_equal(state[0].step_sizes["w"], np.full(4, 0.01, np.float32))


@pytest.mark.parametrize("given, message", [
    (["--opt", "nesterov=1"], None),
    (["--opt", "nesterov=0.5"], "--opt nesterov=0.5: adamw's nesterov takes 0 (false) or 1"),
    (["--opt", "state_bits=-8"], "--opt state_bits=-8: adamw's state_bits takes an integer >= 0"),
    (["--opt", "mu_dtype=1"], "--opt mu_dtype=1: adamw's mu_dtype is not a number (Any | None)"),
    (["--opt", "mask=0"], "--opt mask=0: adamw's mask is not a number"),
])
def test_keyword_values_take_the_keywords_type(tmp_path, given, message):
  """A number given for a keyword becomes what its annotation names: a bool (0 or 1), a
  count (an integer >= 0), a float; a keyword taking no number (a dtype, a mask) is refused."""
  args = _args(tmp_path, "--optimizer", "adamw", *given)
  if message is None:
    kwargs = optim.optimizer_kwargs(args, shardopt.adamw)
    assert kwargs == {"nesterov": True} and type(kwargs["nesterov"]) is bool
    return
  with pytest.raises(cli.UsageError, match="^" + re.escape(message)):
    optim.optimizer_kwargs(args, shardopt.adamw)


def _fails_with(*failing_args):
  """An attempt (as ``validation.blame_values`` takes one) that raises IndexError for the
  arguments in ``failing_args`` and returns "built" for any other."""
  def attempt(args):
    if any(vars(args) == vars(bad) for bad in failing_args):
      raise IndexError("out of range")
    return "built"
  return attempt


def test_the_values_given_are_blamed_only_where_the_defaults_work(tmp_path):
  """validation.blame_values decides by a second attempt with the optimizer's defaults, not by
  the error: the values are named (a UsageError, exit 2) only when the attempt fails with them
  and not with the defaults; a failure with the defaults too, or with no values given, is
  raised as it is (exit 1)."""
  given = _args(tmp_path, "--optimizer", "muon", "--b1", "0.5", "--opt", "ns_steps=0")
  defaults = validation.with_optimizer_defaults(given)
  assert (defaults.b1, defaults.opt) == (None, []) and defaults.optimizer == "muon"
  assert validation.blame_values(given, _fails_with(defaults)) == "built"
  with pytest.raises(cli.UsageError, match=re.escape(
      "--optimizer muon --b1 0.5 --opt ns_steps=0: muon fails with these values"
      " (IndexError: out of range), not with its defaults; change them")):
    validation.blame_values(given, _fails_with(given))
  with pytest.raises(IndexError):
    validation.blame_values(given, _fails_with(given, defaults))
  plain = _args(tmp_path, "--optimizer", "muon")
  with pytest.raises(IndexError):
    validation.blame_values(plain, _fails_with(plain))


def test_an_unannotated_keyword_takes_its_defaults_type():
  """optim._number_kind of a parameter without annotation: its default's type (bool, int,
  float), float without a default or with None, no number for any other default."""
  def factory(learning_rate, count=3, switch=True, rate=0.5, either=None, name="x", *, must):
    del learning_rate, count, switch, rate, either, name, must
  kinds = {k: optim._number_kind(p) for k, p in inspect.signature(factory).parameters.items()}
  assert kinds == {"learning_rate": float, "count": int, "switch": bool, "rate": float,
                   "either": float, "name": None, "must": float}
