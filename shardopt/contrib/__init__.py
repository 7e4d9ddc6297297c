"""Optimizers beyond optax's core.

trax's formulations of Adam, momentum, RMSProp, Adafactor and SM3 (also at the
top level, where they have always been).
"""

from shardopt._src.trax.adafactor import trax_adafactor, TraxAdafactorState
from shardopt._src.trax.optimizers import trax_adam, trax_momentum, trax_rmsprop
from shardopt._src.trax.sm3 import MomentumType, trax_sm3, TraxSM3State

__all__ = [
    "MomentumType", "TraxAdafactorState", "TraxSM3State", "trax_adafactor", "trax_adam",
    "trax_momentum", "trax_rmsprop", "trax_sm3",
]
