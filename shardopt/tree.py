"""Tree utilities: arithmetic on pytrees of arrays that keeps shapes and shardings.
"""

from shardopt._src.tree_math import (
    apply_updates, bias_correction, global_norm, tree_add, tree_cast, tree_cast_like,
    tree_full_like, tree_scale, tree_sub, tree_sum, tree_vdot, tree_where, tree_zeros_like,
    update_infinity_moment, update_moment, update_moment_per_elem_norm,
)
from shardopt._src.tree_map_params import tree_map_params

__all__ = [
    "apply_updates", "bias_correction", "global_norm", "tree_add", "tree_cast",
    "tree_cast_like", "tree_full_like", "tree_map_params", "tree_scale", "tree_sub", "tree_sum",
    "tree_vdot", "tree_where", "tree_zeros_like", "update_infinity_moment", "update_moment",
    "update_moment_per_elem_norm",
]
