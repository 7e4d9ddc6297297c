"""launch/optim.py: --optimizer names in shardopt and shardopt.contrib, --opt types."""

import pytest

from launch import cli
from launch import optim
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


def test_unknown_name_points_to_contrib():
  with pytest.raises(ValueError, match="shardopt.contrib"):
    optim._alias("no_such_optimizer")
