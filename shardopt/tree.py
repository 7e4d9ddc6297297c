"""Tree utilities: arithmetic on pytrees of arrays that keeps shapes and shardings.

The names of ``optax.tree`` (``add``, ``vdot``, ``norm``, ``get``, ...), with
optax's semantics, and shardopt's own ``tree_*`` spellings (also in
``shardopt.tree_utils``). ``tree_vdot`` is the real part of ``vdot``: the
real inner product that line searches and L-BFGS use; ``vdot`` is complex
for complex leaves, as optax's. Both contract in place, so they work on
meshes whose axes are all Explicit.
"""

from shardopt._src.tree_dtypes_random import tree_dtype as dtype
from shardopt._src.tree_dtypes_random import tree_random_like as random_like
from shardopt._src.tree_dtypes_random import tree_split_key_like as split_key_like
from shardopt._src.tree_dtypes_random import tree_unwrap_random_key_data as unwrap_random_key_data
from shardopt._src.tree_map_params import tree_map_params
from shardopt._src.tree_map_params import tree_map_params as map_params
from shardopt._src.tree_math import apply_updates
from shardopt._src.tree_math import bias_correction
from shardopt._src.tree_math import global_norm
from shardopt._src.tree_math import tree_add
from shardopt._src.tree_math import tree_add as add
from shardopt._src.tree_math import tree_add_scale as add_scale
from shardopt._src.tree_math import tree_batch_shape as batch_shape
from shardopt._src.tree_math import tree_cast
from shardopt._src.tree_math import tree_cast as cast
from shardopt._src.tree_math import tree_cast_like
from shardopt._src.tree_math import tree_cast_like as cast_like
from shardopt._src.tree_math import tree_clip as clip
from shardopt._src.tree_math import tree_conj as conj
from shardopt._src.tree_math import tree_div as div
from shardopt._src.tree_math import tree_full_like
from shardopt._src.tree_math import tree_full_like as full_like
from shardopt._src.tree_math import tree_inner_product as vdot
from shardopt._src.tree_math import tree_mul as mul
from shardopt._src.tree_math import tree_ones_like as ones_like
from shardopt._src.tree_math import tree_real as real
from shardopt._src.tree_math import tree_scale
from shardopt._src.tree_math import tree_scale as scale
from shardopt._src.tree_math import tree_sub
from shardopt._src.tree_math import tree_sub as sub
from shardopt._src.tree_math import tree_vdot
from shardopt._src.tree_math import tree_where
from shardopt._src.tree_math import tree_where as where
from shardopt._src.tree_math import tree_zeros_like
from shardopt._src.tree_math import tree_zeros_like as zeros_like
from shardopt._src.tree_math import update_infinity_moment
from shardopt._src.tree_math import update_moment
from shardopt._src.tree_math import update_moment_per_elem_norm
from shardopt._src.tree_paths import tree_get as get
from shardopt._src.tree_paths import tree_get_all_with_path as get_all_with_path
from shardopt._src.tree_paths import tree_set as set
from shardopt._src.tree_reductions import tree_allclose as allclose
from shardopt._src.tree_reductions import tree_max as max
from shardopt._src.tree_reductions import tree_min as min
from shardopt._src.tree_reductions import tree_norm as norm
from shardopt._src.tree_reductions import tree_size as size
from shardopt._src.tree_reductions import tree_sum
from shardopt._src.tree_reductions import tree_sum as sum

__all__ = [
    "add", "add_scale", "allclose", "apply_updates", "batch_shape", "bias_correction",
    "cast", "cast_like", "clip", "conj", "div", "dtype", "full_like", "get",
    "get_all_with_path", "global_norm", "map_params", "max", "min", "mul", "norm",
    "ones_like", "random_like", "real", "scale", "set", "size", "split_key_like", "sub",
    "sum", "tree_add", "tree_cast", "tree_cast_like", "tree_full_like", "tree_map_params",
    "tree_scale", "tree_sub", "tree_sum", "tree_vdot", "tree_where", "tree_zeros_like",
    "unwrap_random_key_data", "update_infinity_moment", "update_moment",
    "update_moment_per_elem_norm", "vdot", "where", "zeros_like",
]
