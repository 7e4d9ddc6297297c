"""optax.tree_utils's names: tree utilities spelled ``tree_*``.

The same functions as ``shardopt.tree`` (whose short names follow
``optax.tree``); ``tree_vdot`` here is optax's (complex for complex leaves),
``shardopt.tree.tree_vdot`` its real part.

optax 0.2.8's deprecated names (``tree_l1_norm``, ``tree_l2_norm``,
``tree_linf_norm``, ``tree_scalar_mul``, ``tree_add_scalar_mul``) are served
as optax serves them: on access, after a ``DeprecationWarning``.
"""

import functools as _functools
import warnings as _warnings

from shardopt._src.tree_dtypes_random import tree_dtype
from shardopt._src.tree_dtypes_random import tree_random_like
from shardopt._src.tree_dtypes_random import tree_split_key_like
from shardopt._src.tree_dtypes_random import tree_unwrap_random_key_data
from shardopt._src.tree_map_params import tree_map_params
from shardopt._src.tree_math import bias_correction as tree_bias_correction
from shardopt._src.tree_math import tree_add
from shardopt._src.tree_math import tree_add_scale
from shardopt._src.tree_math import tree_batch_shape
from shardopt._src.tree_math import tree_cast
from shardopt._src.tree_math import tree_cast_like
from shardopt._src.tree_math import tree_clip
from shardopt._src.tree_math import tree_conj
from shardopt._src.tree_math import tree_div
from shardopt._src.tree_math import tree_full_like
from shardopt._src.tree_math import tree_inner_product as tree_vdot
from shardopt._src.tree_math import tree_mul
from shardopt._src.tree_math import tree_ones_like
from shardopt._src.tree_math import tree_real
from shardopt._src.tree_math import tree_scale
from shardopt._src.tree_math import tree_sub
from shardopt._src.tree_math import tree_where
from shardopt._src.tree_math import tree_zeros_like
from shardopt._src.tree_math import update_infinity_moment as tree_update_infinity_moment
from shardopt._src.tree_math import update_moment as tree_update_moment
from shardopt._src.tree_math import update_moment_per_elem_norm as tree_update_moment_per_elem_norm
from shardopt._src.tree_paths import NamedTupleKey
from shardopt._src.tree_paths import tree_get
from shardopt._src.tree_paths import tree_get_all_with_path
from shardopt._src.tree_paths import tree_set
from shardopt._src.tree_reductions import tree_allclose
from shardopt._src.tree_reductions import tree_max
from shardopt._src.tree_reductions import tree_min
from shardopt._src.tree_reductions import tree_norm
from shardopt._src.tree_reductions import tree_size
from shardopt._src.tree_reductions import tree_sum

__all__ = [
    "NamedTupleKey", "tree_add", "tree_add_scale", "tree_allclose", "tree_batch_shape",
    "tree_bias_correction", "tree_cast", "tree_cast_like", "tree_clip", "tree_conj",
    "tree_div", "tree_dtype", "tree_full_like", "tree_get", "tree_get_all_with_path",
    "tree_map_params", "tree_max", "tree_min", "tree_mul", "tree_norm", "tree_ones_like",
    "tree_random_like", "tree_real", "tree_scale", "tree_set", "tree_size",
    "tree_split_key_like", "tree_sub", "tree_sum", "tree_unwrap_random_key_data",
    "tree_update_infinity_moment", "tree_update_moment", "tree_update_moment_per_elem_norm",
    "tree_vdot", "tree_where", "tree_zeros_like",
]

# Deprecated name -> (its replacement, as the warning names it; the function).
_DEPRECATED = {
    "tree_l1_norm": ("tree_norm(..., ord=1)", _functools.partial(tree_norm, ord=1)),
    "tree_l2_norm": ("tree_norm", _functools.partial(tree_norm, ord=2)),
    "tree_linf_norm": ("tree_norm(..., ord=jnp.inf)",
                       _functools.partial(tree_norm, ord="inf")),
    "tree_scalar_mul": ("tree_scale", tree_scale),
    "tree_add_scalar_mul": ("tree_add_scale", tree_add_scale),
}


def __getattr__(name):
  """Serves a deprecated name after a ``DeprecationWarning``."""
  if name not in _DEPRECATED:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  replacement, fn = _DEPRECATED[name]
  _warnings.warn(f"shardopt.tree_utils.{name} is deprecated (as in optax "
                f"0.2.8): use shardopt.tree_utils.{replacement}.",
                DeprecationWarning, stacklevel=2)
  return fn
