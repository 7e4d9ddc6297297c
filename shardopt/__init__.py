"""shardopt: optax-style gradient transformations with sharded optimizer state.

``import shardopt as optax`` keeps optax code working; every transformation's
state is built from the params so its shardings can be derived (see
``shardopt.state_shardings``).
"""

from shardopt.base import *  # noqa: F401,F403
from shardopt.numerics import abs_sq, safe_increment, safe_int32_increment, safe_norm, safe_root_mean_squares  # noqa: F401
from shardopt.tree import apply_updates, bias_correction, global_norm, update_infinity_moment, update_moment, update_moment_per_elem_norm  # noqa: F401

# One module per concern; each defines __all__. Add a new module's line here.
from shardopt.scaling import *  # noqa: F401,F403
from shardopt.accumulation import *  # noqa: F401,F403
from shardopt.adaptive import *  # noqa: F401,F403
from shardopt.clipping import *  # noqa: F401,F403
from shardopt.constraints import *  # noqa: F401,F403
from shardopt.perturbation import *  # noqa: F401,F403
from shardopt.weight_decay import *  # noqa: F401,F403
from shardopt.block_scaling import *  # noqa: F401,F403
from shardopt.factorized import *  # noqa: F401,F403
from shardopt.sm3 import *  # noqa: F401,F403
from shardopt.schedules import *  # noqa: F401,F403
from shardopt.alias import *  # noqa: F401,F403
from shardopt.combine import *  # noqa: F401,F403
from shardopt.masking import *  # noqa: F401,F403
from shardopt.conditional import *  # noqa: F401,F403
from shardopt.gradient_accumulation import *  # noqa: F401,F403
from shardopt.state_sharding import *  # noqa: F401,F403
from shardopt.step import *  # noqa: F401,F403
from shardopt.adaptive_variants import *  # noqa: F401,F403
from shardopt.sign_methods import *  # noqa: F401,F403
from shardopt.direction_rules import *  # noqa: F401,F403
from shardopt.precision import *  # noqa: F401,F403
from shardopt.inject import *  # noqa: F401,F403
from shardopt.trax_optimizers import *  # noqa: F401,F403
from shardopt.per_example_clipping import *  # noqa: F401,F403
from shardopt.unitwise_clipping import *  # noqa: F401,F403
from shardopt.monitoring import *  # noqa: F401,F403
from shardopt.linesearch import *  # noqa: F401,F403
from shardopt.zoom_linesearch import *  # noqa: F401,F403
from shardopt.quasi_newton import *  # noqa: F401,F403
from shardopt.alias_adaptive import *  # noqa: F401,F403
from shardopt.layerwise_adaptive import *  # noqa: F401,F403
from shardopt.alias_sign_and_search import *  # noqa: F401,F403
from shardopt.lookahead import *  # noqa: F401,F403
from shardopt.param_copies import *  # noqa: F401,F403
from shardopt.layouts import *  # noqa: F401,F403
from shardopt.gradient_scaling import *  # noqa: F401,F403
from shardopt.alias_optimistic import *  # noqa: F401,F403
from shardopt.distance_over_gradients import *  # noqa: F401,F403
from shardopt.inject_stateful import *  # noqa: F401,F403
from shardopt.state_mapping import *  # noqa: F401,F403
