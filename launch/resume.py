"""Continuing a run from its checkpoints: compare the flags, restore, report.

The configuration saved with the newest checkpoint is compared with the
current flags before any array is read (``run_config``), and the changes that
may be made are printed as they differ from the step restored; the newest intact step
is restored (``CheckpointManager.restore_latest_valid``). Each newer, damaged
step it passed over is named in a one-line warning and renamed to
``<step>.damaged`` (kept for inspection, out of the way of the new save of
that step). While files of a step are missing rather than damaged, the
restore is tried again for ``sum(RETRY_MISSING_S)`` seconds before any such
verdict (a shared filesystem that lags). When no step reads back, nothing is
renamed, with ``--resume auto`` too: the job stops, listing each step and why
(it starts fresh only where there is no step at all: launch/run_folder.py).
Quantized state saved in other blocks (another device count, ``--rules`` or
ZeRO setting, or blocks that fit one mesh alone) is re-encoded on restore, or
decoded where this mesh keeps the leaf in float, and the leaves are named.
Nothing else in the run folder changes here; the caller checks the log files'
lines first (``check_lines``), and sets a torn last line aside
(``set_aside_torn_line``) and trims the metrics only once a new step is trained.
"""

import json
import logging
import os
import pathlib
import time
from typing import NoReturn

import checkpoints
from launch import run_config
from launch.errors import UsageError

__all__ = ["RETRY_MISSING_S", "check_config", "check_lines", "restore", "set_aside_torn_line"]

RETRY_MISSING_S = (1, 2, 4, 8)  # waits between tries while checkpoint files are missing


def set_aside_torn_line(path: pathlib.Path, say, is_main: bool = True) -> None:
  """A JSON-lines file (metrics.jsonl, samples.jsonl) whose last line is torn (no newline, or
  not a JSON object: a crash while it was written) loses that line to ``<name>.torn-<n>``
  beside it, with one warning; the rest is rewritten atomically (only ``is_main`` writes). A
  bad line before the last one is an error naming the file and the line (nothing changed)."""
  path = pathlib.Path(path)
  lines, tail, last_whole_is_torn = check_lines(path)
  if not tail and not last_whole_is_torn:
    return
  keep = b"".join(line + b"\n" for line in (lines[:-1] if last_whole_is_torn else lines))
  torn = lines[-1] + b"\n" if last_whole_is_torn else tail
  kept = next(path.with_name(f"{path.name}.torn-{n}") for n in range(1, 10**6)
              if not path.with_name(f"{path.name}.torn-{n}").exists())
  if is_main:
    kept.write_bytes(torn)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(keep)
    os.replace(partial, path)
  say(f"warning: {path} ended in a torn line (a crash while it was written): moved to"
      f" {kept.name}; the {len(lines) - last_whole_is_torn} whole lines before it are kept")


def check_lines(path) -> tuple[list[bytes], bytes, bool]:
  """(the whole lines of a JSON-lines file, the bytes after its last newline, whether its last
  whole line is torn: not a JSON object, with nothing after it); raises UsageError naming the
  file and the line where another whole line is not a JSON object (a torn last line is
  ``set_aside_torn_line``'s). Reads only; a missing file has no lines."""
  path = pathlib.Path(path)
  if not path.exists():
    return [], b"", False
  body, newline, tail = path.read_bytes().rpartition(b"\n")
  lines = body.split(b"\n") if newline else []
  bad = [number for number, line in enumerate(lines, 1) if not _json_object(line)]
  last_whole_is_torn = not tail and bad == [len(lines)]
  if bad and not last_whole_is_torn:
    raise UsageError(f"{path}: line {bad[0]} is not a JSON record ({lines[bad[0] - 1][:60]!r});"
                     " fix or remove it, then resume")
  return lines, tail, last_whole_is_torn


def _json_object(line: bytes) -> bool:
  try:
    return isinstance(json.loads(line), dict)
  except ValueError:
    return False


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


def _restore_once(manager, target):
  """``restore_latest_valid``, its log lines kept off the terminal (``restore``
  turns ``Restored.skipped`` into one-line warnings): (restored or None, the steps that
  failed and why)."""
  logger = logging.getLogger("checkpoints")
  silent, propagate = logging.NullHandler(), logger.propagate
  logger.addHandler(silent)
  logger.propagate = False
  try:
    restored = manager.restore_latest_valid(target)
    return restored, restored.skipped
  except checkpoints.NoCheckpointError as e:
    return None, e.skipped
  except checkpoints.StructureMismatchError as e:
    raise UsageError(f"--resume: the checkpoint does not fit this model and optimizer:"
                     f" {_first_line(e)}") from e
  finally:
    logger.removeHandler(silent)
    logger.propagate = propagate


def _restore_newest_valid(manager, target, say):
  """The newest step that reads back (None when none does), and the newer steps that failed.
  While files of a step are missing (not damaged), waits ``RETRY_MISSING_S`` between tries
  before any verdict: a shared filesystem may show them late."""
  for delay in (*RETRY_MISSING_S, None):
    restored, skipped = _restore_once(manager, target)
    missing = [s.step for s in skipped if s.missing]
    if not missing or delay is None:
      return restored, skipped
    if delay == RETRY_MISSING_S[0]:
      say(f"checkpoint files missing in step(s) {missing} of {manager.directory}: trying again"
          f" for up to {sum(RETRY_MISSING_S):g} s (a shared filesystem may show them late)")
    time.sleep(delay)


def _none_intact(manager, skipped, auto: bool) -> NoReturn:
  """No step reads back: an error listing each step and why; nothing is renamed or started."""
  flag = "--resume auto" if auto else "--resume"
  reasons = "; ".join(f"step {s.step}: {_shortened(s.reason, 150)}" for s in skipped)
  raise UsageError(f"{flag}: no checkpoint in {manager.directory} reads back ({reasons});"
                   " nothing was changed. Bring the files back (is the filesystem mounted?),"
                   " or start another --out")


def restore(manager, target: dict, current_config: dict, steps_wanted: int, say=print,
            is_main: bool = True, auto: bool = False):
  """The restored state (``checkpoints.Restored``) of the newest intact step.

  Raises UsageError when the flags differ from the saved run's, when no step
  reads back (listing each step and why; ``auto`` only names the flag), or
  when ``steps_wanted`` is below the restored step. When a step was set aside
  (``Restored.skipped``), reopen the manager before saving.
  """
  steps = manager.all_steps()
  try:  # refused before any array is read; what may change is said of the step restored
    check_config(manager.metadata(steps[-1]), current_config,
                 f"{manager.directory} (step {steps[-1]})", lambda line: None)
  except checkpoints.CorruptCheckpointError:
    pass  # Checked below, on the step that reads back.
  restored, failed = _restore_newest_valid(manager, target, say)
  if restored is None:
    _none_intact(manager, failed, auto)
  check_config(restored.metadata, current_config, f"{manager.directory} (step {restored.step})",
               say)
  if steps_wanted < restored.step:
    raise UsageError(f"--steps {steps_wanted}: below the checkpoint's step {restored.step};"
                     f" pass --steps {restored.step} or more")
  for skipped in restored.skipped:
    kept = _set_aside(manager.directory, skipped.step, is_main)
    say(f"warning: checkpoint step {skipped.step} in {manager.directory} is damaged"
        f" ({_shortened(skipped.reason)}); resumed from step {restored.step} instead;"
        f" the damaged step is kept as {kept}")
  if restored.retiled:
    say(f"re-encoded {len(restored.retiled)} quantized state leaves in this mesh's blocks,"
        f" or in float where this mesh keeps them so (each value within one quantization"
        f" step of the saved one):"
        f" {', '.join(restored.retiled)}")
  return restored
