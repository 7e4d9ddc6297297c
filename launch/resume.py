"""Continuing a run from its checkpoints: compare the flags, restore, report.

The configuration saved with the newest checkpoint is compared with the
current flags before anything is read (``run_config``); the newest intact step
is restored (``CheckpointManager.restore_latest_valid``). Each newer, damaged
step it passed over is named in a one-line warning and renamed to
``<step>.damaged`` (kept for inspection, out of the way of the new save of
that step). Nothing else in the run folder changes here (but for ``--resume
auto`` with no intact step: a fresh start, the damaged steps and the metrics
set aside); the caller trims the metrics only after this succeeded.
"""

import logging
import os

import checkpoints
from launch import run_config
from launch import run_folder
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


def _shortened(reason: str, limit: int = 200) -> str:
  """The first line of ``reason`` without the checkpoints API hint (a CLI user
  cannot call it), at most ``limit`` characters."""
  line = (reason.strip().splitlines() or [""])[0].split(" restore_latest_valid")[0]
  line = line.split(" is damaged: ", 1)[-1]
  return line[:limit] + ("..." if len(line) > limit else "")


def _set_aside(directory, step: int, is_main: bool) -> str:
  """Renames a damaged step folder to ``<step>.damaged`` (or ``.damaged-N``)."""
  base = os.path.join(os.fspath(directory), str(step))
  for n in range(1, 1000):
    kept = f"{base}.damaged" + (f"-{n}" if n > 1 else "")
    if not os.path.exists(kept):
      if is_main:
        os.rename(base, kept)
      return os.path.basename(kept)
  raise UsageError(f"{base}: too many damaged copies kept beside it; remove some")


def _restore_newest_valid(manager, target):
  """``restore_latest_valid``, its log lines kept off the terminal (``restore``
  turns ``Restored.skipped`` into one-line warnings); None when no step is intact."""
  logger = logging.getLogger("checkpoints")
  silent, propagate = logging.NullHandler(), logger.propagate
  logger.addHandler(silent)
  logger.propagate = False
  try:
    return manager.restore_latest_valid(target)
  except checkpoints.NoCheckpointError:
    return None
  except checkpoints.StructureMismatchError as e:
    raise UsageError(f"--resume: the checkpoint does not fit this model and optimizer:"
                     f" {_first_line(e)}") from e
  finally:
    logger.removeHandler(silent)
    logger.propagate = propagate


def _none_intact(manager, steps: list[int], auto: bool, say, is_main: bool, out) -> None:
  """No step reads back: an error, or with ``auto`` a fresh start: the damaged
  steps and the run's metrics are set aside (kept under other names)."""
  where = str(manager.directory)
  if not auto:
    raise UsageError(f"--resume: no checkpoint in {where} reads back (steps {steps} are all"
                     " damaged); restore one from a copy, or start another --out")
  kept = [_set_aside(manager.directory, step, is_main) for step in steps]
  metrics = run_folder.set_aside_metrics(out, is_main)
  say(f"--resume auto: no checkpoint in {where} reads back: starting fresh (damaged steps kept"
      f" as {', '.join(kept)}" + (f"; earlier metrics as {metrics})" if metrics else ")"))


def restore(manager, target: dict, current_config: dict, steps_wanted: int, say=print,
            is_main: bool = True, auto: bool = False, out=None):
  """The restored state (``checkpoints.Restored``) of the newest intact step.

  Raises UsageError when the flags differ from the saved run's, when no step
  reads back (with ``auto``: every step and the metrics in ``out`` are set
  aside and None returned: start fresh), or when ``steps_wanted`` is below
  the restored step. When a step was set aside (``Restored.skipped`` or
  None), reopen the manager before saving.
  """
  steps = manager.all_steps()
  where = f"{manager.directory} (step {steps[-1]})"
  try:
    check_config(manager.metadata(steps[-1]), current_config, where, say)
  except checkpoints.CorruptCheckpointError:
    pass  # Checked below, on the step that reads back.
  restored = _restore_newest_valid(manager, target)
  if restored is None:
    return _none_intact(manager, steps, auto, say, is_main, out)
  if restored.skipped:
    check_config(restored.metadata, current_config, f"{manager.directory} (step {restored.step})",
                 lambda line: None)
  if steps_wanted < restored.step:
    raise UsageError(f"--steps {steps_wanted}: below the checkpoint's step {restored.step};"
                     f" pass --steps {restored.step} or more")
  for skipped in restored.skipped:
    kept = _set_aside(manager.directory, skipped.step, is_main)
    say(f"warning: checkpoint step {skipped.step} in {manager.directory} is damaged"
        f" ({_shortened(skipped.reason)}); resumed from step {restored.step} instead;"
        f" the damaged step is kept as {kept}")
  return restored
