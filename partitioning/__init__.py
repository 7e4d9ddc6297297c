"""Device meshes, partition rules, Flax partitioning metadata, spec validation and memory plans.

Depends on jax alone; Flax metadata is read by duck typing.
"""

from partitioning.flax_metadata import *  # noqa: F401,F403
from partitioning.memory_plan import *  # noqa: F401,F403
from partitioning.mesh import *  # noqa: F401,F403
from partitioning.presets import *  # noqa: F401,F403
from partitioning.rules import *  # noqa: F401,F403
from partitioning.shardings import *  # noqa: F401,F403
from partitioning.specs import *  # noqa: F401,F403
from partitioning.validation import *  # noqa: F401,F403
