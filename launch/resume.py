"""Continuing a run from its checkpoints: compare the flags, restore, report.

The configuration saved with the newest checkpoint is compared with the
current flags before anything is read (``run_config``); the newest step that
reads back is restored (``CheckpointManager.restore_latest_valid``) and each
newer step it skipped is named in a one-line warning. Nothing in the run
folder changes here; the caller trims the metrics only after this succeeded.
"""

import logging

import checkpoints
from launch import run_config
from launch.cli import UsageError

__all__ = ["check_config", "restore"]


def _first_line(error: Exception) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"


def check_config(saved: dict, current: dict, where: str, say) -> None:
  """Raises UsageError listing the changed flags that define the run; prints
  the ones that may change."""
  if "config" not in saved:
    say(f"warning: {where} has no saved configuration: flags not compared")
    return
  refused, allowed = run_config.compare(saved["config"], current)
  if refused:
    raise UsageError(run_config.describe_changes(refused, where))
  if allowed:
    say(f"resume: changed {'; '.join(allowed)}")


class _Collect(logging.Handler):
  """Keeps the checkpoints package's log records instead of printing them."""

  def __init__(self, records: list):
    super().__init__(logging.WARNING)
    self.records = records

  def emit(self, record):
    self.records.append(record)


def _reason(records: list) -> str:
  """The first line of the first skip the manager logged, shortened."""
  if not records:
    return ""
  line = records[0].getMessage().strip().splitlines()[0]
  return f" ({line[:200]}{'...' if len(line) > 200 else ''})"


def _restore_newest_valid(manager, target, collected: list):
  logger = logging.getLogger("checkpoints")
  collect, propagate = _Collect(collected), logger.propagate
  logger.addHandler(collect)
  logger.propagate = False
  try:
    return manager.restore_latest_valid(target)
  except checkpoints.NoCheckpointError as e:
    raise UsageError(f"--resume: no checkpoint in {manager.directory} reads back"
                     f" ({_first_line(e)}); restore one, or start another --out") from e
  except checkpoints.StructureMismatchError as e:
    raise UsageError(f"--resume: the checkpoint does not fit this model and optimizer:"
                     f" {_first_line(e)}") from e
  finally:
    logger.removeHandler(collect)
    logger.propagate = propagate


def restore(manager, target: dict, current_config: dict, steps_wanted: int, say=print):
  """The restored state (``checkpoints.Restored``) of the newest valid step.

  Raises UsageError when the flags differ from the saved run's, when no step
  reads back, or when ``steps_wanted`` is below the restored step.
  """
  steps = manager.all_steps()
  where = f"{manager.directory} (step {steps[-1]})"
  try:
    check_config(manager.metadata(steps[-1]), current_config, where, say)
  except checkpoints.CorruptCheckpointError:
    pass  # Checked below, on the step that reads back.
  collected = []
  restored = _restore_newest_valid(manager, target, collected)
  if restored.step != steps[-1]:
    check_config(restored.metadata, current_config, f"{manager.directory} (step {restored.step})",
                 lambda line: None)
    skipped = ", ".join(str(s) for s in steps if s > restored.step)
    say(f"warning: checkpoint step {skipped} in {manager.directory} is unreadable"
        f"{_reason(collected)}; resumed from step {restored.step} instead")
  if steps_wanted < restored.step:
    raise UsageError(f"--steps {steps_wanted}: below the checkpoint's step {restored.step};"
                     f" pass --steps {restored.step} or more")
  return restored
