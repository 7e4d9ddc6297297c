"""The run's configuration, stored with every checkpoint and compared on resume.

Every flag is stored. On resume, a flag outside ``MAY_CHANGE`` must have the
value it had when the checkpoint was written: the model, the data order, the
optimizer and the learning-rate schedule (``--schedule-steps``, its horizon,
included) define the run. The flags in ``MAY_CHANGE`` only say where and how
the run is laid out, saved and reported (the mesh, the process count, ...), or
how far it goes (``--steps``), and are printed when they differ.
(``--skip-nonfinite`` wraps the optimizer, so its state, and must match.)
"""

import argparse
import json

from launch import cli

__all__ = ["MAY_CHANGE", "compare", "config_of", "describe_changes"]

MAY_CHANGE = frozenset({
    "steps", "mesh", "rules", "zero", "out", "checkpoint_dir", "checkpoint_every",
    "keep_checkpoints", "log_every", "resume", "debug", "cpu_devices",
    "coordinator", "num_processes", "process_id", "auto_distributed", "init_timeout",
    "heartbeat_timeout", "process_count", "device_count",
})


def config_of(args: argparse.Namespace, process_count: int, device_count: int) -> dict:
  """Every flag as JSON values, plus the process and device counts.

  A constant schedule has no horizon, so its ``schedule_steps`` is None.
  """
  config = json.loads(json.dumps(vars(args)))
  if args.schedule == "constant":
    config["schedule_steps"] = None
  config.update(process_count=process_count, device_count=device_count)
  return config


def _default(name: str):
  value = cli.parser().get_default(name)
  return json.loads(json.dumps(value))


def compare(saved: dict, current: dict) -> tuple[list[str], list[str]]:
  """(changes not allowed, allowed changes), each as ``--flag old -> new``.

  A flag missing from ``saved`` (added to the job later) counts as its default.
  """
  refused, allowed = [], []
  for name in sorted(current):
    old = saved.get(name, _default(name))
    new = current[name]
    if old == new:
      continue
    label = name.replace("_", " ") if name in ("process_count", "device_count") else (
        "--" + name.replace("_", "-"))
    change = f"{label} {_show(old)} -> {_show(new)}"
    (allowed if name in MAY_CHANGE else refused).append(change)
  return refused, allowed


def _show(value) -> str:
  return "(unset)" if value is None else json.dumps(value) if isinstance(value, list) else str(value)


def describe_changes(refused: list[str], where: str) -> str:
  """The one-line error for flags that differ from the run being resumed."""
  hint = ""
  if any(c.startswith("--schedule-steps") for c in refused):
    hint = (" (--steps sets the schedule horizon unless --schedule-steps is given: pass"
            " --schedule-steps with the old value to train longer on the same schedule)")
  return (f"--resume: the flags differ from the run in {where}: {'; '.join(refused)}{hint}."
          " Give the earlier values, or a new --out to start another run")
