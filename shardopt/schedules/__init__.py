"""Schedules: functions of the step count giving a hyperparameter's value.

Same names, signatures and values as ``optax.schedules`` (which also holds
the hyperparameter-injection wrappers and schedule types, re-exported here).
"""

from shardopt._src.base import Schedule
from shardopt._src.base import StatefulSchedule
from shardopt._src.wrappers.inject_hyperparams import inject_hyperparams
from shardopt._src.wrappers.inject_hyperparams import InjectHyperparamsState
from shardopt._src.wrappers.inject_hyperparams import inject_stateful_hyperparams
from shardopt._src.wrappers.inject_hyperparams import InjectStatefulHyperparamsState
from shardopt._src.wrappers.inject_hyperparams import WrappedSchedule

from shardopt.schedules._decay import constant_schedule
from shardopt.schedules._decay import cosine_decay_schedule
from shardopt.schedules._decay import exponential_decay
from shardopt.schedules._decay import join_schedules
from shardopt.schedules._decay import linear_schedule
from shardopt.schedules._decay import piecewise_constant_schedule
from shardopt.schedules._decay import piecewise_interpolate_schedule
from shardopt.schedules._decay import polynomial_schedule
from shardopt.schedules._warmup_and_restarts import cosine_onecycle_schedule
from shardopt.schedules._warmup_and_restarts import linear_onecycle_schedule
from shardopt.schedules._warmup_and_restarts import sgdr_schedule
from shardopt.schedules._warmup_and_restarts import warmup_constant_schedule
from shardopt.schedules._warmup_and_restarts import warmup_cosine_decay_schedule
from shardopt.schedules._warmup_and_restarts import warmup_exponential_decay_schedule

__all__ = [
    "InjectHyperparamsState", "InjectStatefulHyperparamsState", "Schedule", "StatefulSchedule",
    "WrappedSchedule", "inject_hyperparams", "inject_stateful_hyperparams",
    "constant_schedule", "cosine_decay_schedule", "cosine_onecycle_schedule",
    "exponential_decay", "join_schedules", "linear_onecycle_schedule", "linear_schedule",
    "piecewise_constant_schedule", "piecewise_interpolate_schedule", "polynomial_schedule",
    "sgdr_schedule", "warmup_constant_schedule", "warmup_cosine_decay_schedule",
    "warmup_exponential_decay_schedule",
]
