"""Optimizers beyond optax's core.

trax's formulations of Adam, momentum, RMSProp, Adafactor and SM3 (also at the
top level, where they have always been).
"""

from shardopt._src.trax.adafactor import trax_adafactor, TraxAdafactorState
from shardopt._src.trax.optimizers import trax_adam, trax_momentum, trax_rmsprop
from shardopt._src.trax.sm3 import MomentumType, trax_sm3, TraxSM3State
from shardopt.contrib._blocking import BlockLayout, block_layout
from shardopt.contrib._shampoo import ShampooState, scale_by_shampoo, shampoo
from shardopt.contrib._soap import SoapState, scale_by_soap, soap

__all__ = [
    "MomentumType", "TraxAdafactorState", "TraxSM3State", "trax_adafactor", "trax_adam",
    "trax_momentum", "trax_rmsprop", "trax_sm3",
    "BlockLayout", "block_layout", "ShampooState", "scale_by_shampoo", "shampoo",
    "SoapState", "scale_by_soap", "soap",
]
