"""``shardopt.projections``: optax's ``optax.projections`` (Euclidean
projections of pytrees onto convex sets)."""

from shardopt._src.projections import projection_box
from shardopt._src.projections import projection_halfspace
from shardopt._src.projections import projection_hypercube
from shardopt._src.projections import projection_hyperplane
from shardopt._src.projections import projection_l1_ball
from shardopt._src.projections import projection_l1_sphere
from shardopt._src.projections import projection_l2_ball
from shardopt._src.projections import projection_l2_sphere
from shardopt._src.projections import projection_linf_ball
from shardopt._src.projections import projection_non_negative
from shardopt._src.projections import projection_simplex
from shardopt._src.projections import projection_vector

__all__ = [
    "projection_box", "projection_halfspace", "projection_hypercube",
    "projection_hyperplane", "projection_l1_ball", "projection_l1_sphere",
    "projection_l2_ball", "projection_l2_sphere", "projection_linf_ball",
    "projection_non_negative", "projection_simplex", "projection_vector",
]
