"""The sharding layer: optimizer-state shardings derived from the params', and the sharded step.

``plan_state_shardings`` traces a transformation's ``init`` on the sharded params
(no hand-kept table) and says, leaf by leaf, which param each state leaf follows
and what ZeRO did; ``make_sharded_optimizer`` compiles ``init`` and ``update``
with those shardings, and ``ShardedOptimizer.train_step`` compiles a whole
training step (loss, gradients, update) as one program. optax has no counterpart of this namespace.
"""

from shardopt.sharding._derivation import plan_state_shardings
from shardopt.sharding._derivation import state_shardings
from shardopt.sharding._layouts import in_layout
from shardopt.sharding._plan import LeafPlan
from shardopt.sharding._plan import ReplicatedStateWarning
from shardopt.sharding._plan import StatePlan
from shardopt.sharding._step import ShardedInit
from shardopt.sharding._step import ShardedOptimizer
from shardopt.sharding._step import ShardedUpdate
from shardopt.sharding._step import make_sharded_optimizer
from shardopt.sharding._step import sharded_init
from shardopt.sharding._step import sharded_update
from shardopt.sharding._step import with_update_layout
from shardopt.sharding._train_step import TrainStep
from shardopt.sharding._train_step import global_norms

__all__ = [
    "LeafPlan", "ReplicatedStateWarning", "ShardedInit", "ShardedOptimizer", "ShardedUpdate",
    "StatePlan", "TrainStep", "global_norms", "in_layout", "make_sharded_optimizer",
    "plan_state_shardings", "sharded_init", "sharded_update", "state_shardings", "with_update_layout",
]
