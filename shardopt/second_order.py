"""``shardopt.second_order``: optax's ``optax.second_order`` (Hessian-vector
products, Hessian and Fisher diagonals), deprecated as in optax 0.2.8: each
function warns (``DeprecationWarning``) whenever it is called."""

from shardopt._src.second_order import fisher_diag
from shardopt._src.second_order import hessian_diag
from shardopt._src.second_order import hvp

__all__ = ["fisher_diag", "hessian_diag", "hvp"]
