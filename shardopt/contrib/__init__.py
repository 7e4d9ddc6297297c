"""Optimizers beyond optax's core.

trax's formulations of Adam, momentum, RMSProp, Adafactor and SM3 (also at the
top level, where they have always been).
"""

from shardopt._src.trax.adafactor import trax_adafactor, TraxAdafactorState
from shardopt._src.trax.optimizers import trax_adam, trax_momentum, trax_rmsprop
from shardopt._src.trax.sm3 import MomentumType, trax_sm3, TraxSM3State
from shardopt.contrib._acprop import acprop, scale_by_acprop
from shardopt.contrib._ademamix import (
    ademamix, scale_by_ademamix, scale_by_simplified_ademamix, ScaleByAdemamixState,
    ScaleBySimplifiedAdEMAMixState, simplified_ademamix,
)
from shardopt.contrib._adopt import adopt, scale_by_adopt
from shardopt.contrib._cocob import cocob, COCOBState, scale_by_cocob
from shardopt.contrib._dadapt_adamw import dadapt_adamw, DAdaptAdamWState
from shardopt.contrib._dog import dog, DoGState, dowg, DoWGState
from shardopt.contrib._madgrad import madgrad, MadgradState, scale_by_madgrad
from shardopt.contrib._mechanic import MechanicState, mechanize
from shardopt.contrib._momo import momo, momo_adam, MomoAdamState, MomoState
from shardopt.contrib._prodigy import prodigy, ProdigyState
from shardopt.contrib._muon import MuonDimensionNumbers, MuonState, muon, scale_by_muon
from shardopt.contrib._complex_valued import (
    split_real_and_imaginary, SplitRealAndImaginaryState,
)
from shardopt.contrib._galore import (
    galore, GaLoreDimensionNumbers, GaLoreState, scale_by_galore,
)
from shardopt.contrib._privacy import (
    differentially_private_aggregate, DifferentiallyPrivateAggregateState, dpsgd,
)
from shardopt.contrib._reduce_on_plateau import reduce_on_plateau, ReduceLROnPlateauState
from shardopt.contrib._sam import normalize, NormalizeState, sam, SAMState
from shardopt.contrib._schedule_free import (
    schedule_free, schedule_free_adamw, schedule_free_eval_params, schedule_free_sgd,
    ScheduleFreeState,
)
from shardopt.contrib._sophia import (
    hutchinson_estimator_diag_hessian, HutchinsonState, sophia, SophiaState,
)
from shardopt.contrib._blocking import BlockLayout, block_layout
from shardopt.contrib._shampoo import ShampooState, scale_by_shampoo, shampoo
from shardopt.contrib._soap import SoapState, scale_by_soap, soap

__all__ = [
    "acprop", "ademamix", "adopt", "cocob", "COCOBState", "dadapt_adamw",
    "DAdaptAdamWState", "dog", "DoGState", "dowg", "DoWGState", "madgrad", "MadgradState",
    "mechanize", "MechanicState", "momo", "momo_adam", "MomoAdamState", "MomoState",
    "prodigy", "ProdigyState", "scale_by_acprop", "scale_by_ademamix", "scale_by_adopt",
    "scale_by_cocob", "scale_by_madgrad", "scale_by_simplified_ademamix",
    "ScaleByAdemamixState", "ScaleBySimplifiedAdEMAMixState",
    "simplified_ademamix",
    "MomentumType", "TraxAdafactorState", "TraxSM3State", "trax_adafactor", "trax_adam",
    "trax_momentum", "trax_rmsprop", "trax_sm3",
    "MuonDimensionNumbers", "MuonState", "muon", "scale_by_muon",
    "split_real_and_imaginary", "SplitRealAndImaginaryState",
    "galore", "GaLoreDimensionNumbers", "GaLoreState", "scale_by_galore",
    "differentially_private_aggregate", "DifferentiallyPrivateAggregateState", "dpsgd",
    "reduce_on_plateau", "ReduceLROnPlateauState",
    "normalize", "NormalizeState", "sam", "SAMState",
    "schedule_free", "schedule_free_adamw", "schedule_free_eval_params", "schedule_free_sgd",
    "ScheduleFreeState",
    "hutchinson_estimator_diag_hessian", "HutchinsonState", "sophia", "SophiaState",
    "BlockLayout", "block_layout", "ShampooState", "scale_by_shampoo", "shampoo",
    "SoapState", "scale_by_soap", "soap",
]
