"""``shardopt.assignment``: optax's ``optax.assignment`` (the linear
assignment problem)."""

from shardopt._src.assignment import base_hungarian_algorithm
from shardopt._src.assignment import hungarian_algorithm

__all__ = ["base_hungarian_algorithm", "hungarian_algorithm"]
