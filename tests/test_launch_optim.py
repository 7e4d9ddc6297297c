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
               "--opt", "max_shards=2", "--opt", "eps=1e-4")
  kwargs = optim.optimizer_kwargs(args, shardopt.contrib.shampoo)
  assert kwargs == {"block_size": 16, "max_shards": 2, "eps": 1e-4}
  assert [type(kwargs[k]) for k in ("block_size", "max_shards", "eps")] == [int, int, float]


def test_unknown_name_points_to_contrib():
  with pytest.raises(ValueError, match="shardopt.contrib"):
    optim._alias("no_such_optimizer")
