"""What run folders hold, read without changing them: a checkpoint folder's steps, a run's
metrics records, the flags saved with its newest step, where a run keeps its checkpoints,
which run to resume; and the one note a run writes about its folders: where its checkpoints
are when not in the default folder (``record_checkpoint_dir``).

Nothing here imports jax or orbax, so the local launcher and the flags
(launch/flags.py) can use it. A step of a checkpoint folder is finalized when
its directory has an integer name (Orbax writes into
``<step>.orbax-checkpoint-tmp-*`` and renames it when the save is complete).
"""

import json
import os
import pathlib

from etils import epath

from checkpoints import digest
from launch import path_checks
from launch.errors import UsageError

__all__ = ["CHECKPOINT_DIR_RECORD", "LOGS", "RUNS", "checkpoints_in", "checkpoints_of",
           "contents", "describe", "finalized_steps", "inside", "last_metrics_step",
           "metrics_records", "newest_finalized", "newest_resumable", "record_checkpoint_dir",
           "recorded_checkpoint_dir", "refuse_a_record_that_is_no_file", "same_folder",
           "saved_config", "unfinished_saves"]

RUNS = pathlib.Path("runs")
LOGS = ("metrics.jsonl", "samples.jsonl")  # a run's own log files: set aside by a fresh start
# In a run folder whose checkpoints are not in ``checkpoints_in``: where they are.
CHECKPOINT_DIR_RECORD = "checkpoint_dir.txt"


def checkpoints_in(out) -> str:
  """Where a run whose folder is ``out`` keeps its checkpoints unless --checkpoint-dir says
  otherwise: ``out/checkpoints``."""
  return os.path.join(os.fspath(out), "checkpoints")


def inside(checkpoint_dir: str, out) -> bool:
  """Whether the local folder ``checkpoint_dir`` is ``out`` or lies under it, symbolic links
  resolved."""
  checkpoint_dir, out = os.path.realpath(checkpoint_dir), os.path.realpath(out)
  return checkpoint_dir == out or checkpoint_dir.startswith(out + os.sep)


def same_folder(a: str, b: str) -> bool:
  """Whether two checkpoint folders are one: URLs as written, local paths resolved."""
  if "://" in a or "://" in b:
    return a == b
  return os.path.realpath(a) == os.path.realpath(b)


def refuse_a_record_that_is_no_file(out) -> None:
  """Raises UsageError where something other than a file takes the place of the run's record
  of its checkpoint folder (``CHECKPOINT_DIR_RECORD``): reading a pipe there would wait for
  ever, and a run would train, then fail to write its record."""
  record = os.path.join(out, CHECKPOINT_DIR_RECORD)
  if os.path.lexists(record) and not os.path.isfile(record):
    raise UsageError(f"--out {out}: {record} is not a file; the run records its checkpoint"
                     " folder there: remove it, or choose another --out")


def recorded_checkpoint_dir(out) -> str | None:
  """The checkpoint folder the run in ``out`` recorded (``record_checkpoint_dir``): a URL or
  absolute path as recorded, a relative one under ``out``; None where there is no record.
  Raises UsageError naming the record where it is not a file holding one line of a path."""
  refuse_a_record_that_is_no_file(out)
  record = pathlib.Path(out) / CHECKPOINT_DIR_RECORD
  try:
    text = record.read_text()
  except FileNotFoundError:
    return None
  except (OSError, UnicodeDecodeError) as e:
    raise UsageError(f"{record}: cannot read it ({getattr(e, 'strerror', None) or e}); the"
                     " run records its checkpoint folder there: remove it, or pass"
                     " --checkpoint-dir naming the run's checkpoints") from None
  where = text.removesuffix("\n")
  if not where.strip() or not where.isprintable():
    raise UsageError(f"{record}: not a checkpoint folder's path (one line: the run records its"
                     " checkpoint folder there); remove it, or pass --checkpoint-dir naming the"
                     " run's checkpoints")
  return where if "://" in where or os.path.isabs(where) else os.path.join(out, where)


def checkpoints_of(out) -> str:
  """Where the run in ``out`` keeps its checkpoints: the folder it recorded (a run given
  --checkpoint-dir), checked as a given --checkpoint-dir is (``path_checks.check_paths``, a
  failure naming the record), else ``checkpoints_in(out)``."""
  recorded = recorded_checkpoint_dir(out)
  if recorded is None:
    return checkpoints_in(out)
  try:
    path_checks.check_paths({"checkpoint_dir": recorded})
  except UsageError as e:
    record = os.path.join(out, CHECKPOINT_DIR_RECORD)
    raise UsageError(f"{record} (the run's checkpoint folder, recorded): {e}") from None
  return recorded


def record_checkpoint_dir(out, checkpoint_dir: str) -> None:
  """Notes in the run folder ``out`` where its checkpoints are, unless at the default
  ``checkpoints_in(out)`` (then removes the note), so a --resume naming only ``out`` finds
  them, also after ``out`` is moved: a folder inside ``out`` relative to it, any other local
  folder absolute with symbolic links resolved, a URL as written. Written whole or not at
  all (a new file renamed over the old)."""
  path = pathlib.Path(out) / CHECKPOINT_DIR_RECORD
  if "://" in checkpoint_dir:
    where = checkpoint_dir
  elif inside(checkpoint_dir, out):
    where = os.path.relpath(os.path.realpath(checkpoint_dir), os.path.realpath(out))
  else:
    where = os.path.realpath(checkpoint_dir)
  if where == os.path.basename(checkpoints_in(out)):
    path.unlink(missing_ok=True)
    return
  draft = path.with_name(f".{path.name}.{os.getpid()}")
  try:
    draft.write_text(where + "\n")
    os.replace(draft, path)
  finally:
    draft.unlink(missing_ok=True)


def finalized_steps(checkpoint_dir) -> list[int]:
  """Steps of the finalized checkpoints in ``checkpoint_dir``, ascending."""
  path = epath.Path(checkpoint_dir)  # also gs:// and other URLs
  if not path.is_dir():
    return []
  return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit() and p.is_dir())


def newest_finalized(checkpoint_dir) -> tuple[int | None, bool]:
  """(the newest finalized step in ``checkpoint_dir``, whether the folder could be listed):
  (None, False) where it is gone or unreadable (a filesystem gone mid-run)."""
  try:
    if epath.Path(checkpoint_dir).is_dir():
      steps_there = finalized_steps(checkpoint_dir)
      return (steps_there[-1] if steps_there else None), True
  except OSError:
    pass
  return None, False


def saved_config(checkpoint_dir) -> tuple[dict, int] | None:
  """(the flags saved with the newest finalized step whose record vouches for its metadata,
  that step), or None when no step has any: read from the step's JSON items
  (``<step>/layout/metadata``, ``<step>/metadata/metadata``) and checked against the record's
  digest (``checkpoints.digest``) without jax; a step that fails is passed over, as the
  restore passes over it."""
  for step in reversed(finalized_steps(checkpoint_dir)):
    folder = epath.Path(checkpoint_dir) / str(step)
    try:
      metadata = json.loads((folder / "metadata" / "metadata").read_text())
      digest.check(json.loads((folder / "layout" / "metadata").read_text()), metadata)
    except (OSError, ValueError):
      continue
    if isinstance(metadata, dict) and isinstance(metadata.get("config"), dict):
      return metadata["config"], step
  return None


def unfinished_saves(checkpoint_dir) -> list[str]:
  """Names of the temporary folders of saves that never finished."""
  path = epath.Path(checkpoint_dir)
  if not path.is_dir():
    return []
  return sorted(p.name for p in path.iterdir() if "tmp" in p.name)


def _metrics_lines(folder) -> list[bytes]:
  """The lines of ``folder/metrics.jsonl`` as bytes (none if it is no file): read as bytes, a
  line that is not UTF-8 is one more line, not an error."""
  path = pathlib.Path(folder) / "metrics.jsonl"
  return path.read_bytes().splitlines() if path.is_file() else []


def metrics_records(folder) -> int:
  """How many lines ``folder/metrics.jsonl`` has (0 if none)."""
  return len(_metrics_lines(folder))


def last_metrics_step(folder) -> int | None:
  """The largest step of ``folder/metrics.jsonl``'s records (lines that are not a record with
  an integer step passed over), or None when it has none."""
  steps = []
  for line in _metrics_lines(folder):
    try:
      record = json.loads(line)
    except ValueError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int):
      steps.append(record["step"])
  return max(steps, default=None)


def contents(folder: pathlib.Path, checkpoint_dir, run_folder: bool) -> str:
  """The checkpoints' steps and, in a run folder (not a bare --checkpoint-dir),
  its metrics records."""
  steps, unfinished = finalized_steps(checkpoint_dir), unfinished_saves(checkpoint_dir)
  parts = [f"checkpoint steps {steps}" if steps else "no checkpoints"]
  if unfinished:
    parts.append(f"unfinished saves {', '.join(unfinished)}")
  if run_folder:
    parts.append(f"metrics.jsonl with {metrics_records(folder)} records")
  return "; ".join(parts)


def describe(folder, checkpoint_dir=None, run_folder: bool = True) -> str:
  """What a run folder (or, not ``run_folder``, a bare --checkpoint-dir)
  holds, in a few words (for error messages)."""
  folder = pathlib.Path(folder)
  if checkpoint_dir is None:
    try:
      checkpoint_dir = checkpoints_of(folder)
    except UsageError:  # an unreadable record: described by what the folder itself holds
      checkpoint_dir = checkpoints_in(folder)
  if not folder.exists() and not epath.Path(checkpoint_dir).exists():
    return f"{folder} (does not exist)"
  return f"{folder} ({contents(folder, checkpoint_dir, run_folder)})"


def _resumable(folder: pathlib.Path) -> bool:
  """Whether the run in ``folder`` has a finalized checkpoint; True where its record of its
  checkpoint folder does not read, so that the resume reports the record (``checkpoints_of``)
  rather than pass over the run."""
  try:
    return bool(finalized_steps(checkpoints_of(folder)))
  except UsageError:
    return True


def newest_resumable(root: pathlib.Path = RUNS) -> pathlib.Path:
  """The newest ``root/lm-*`` folder whose run has a finalized checkpoint (``_resumable``).

  Raises UsageError listing every run folder found when none has one.
  """
  folders = sorted(p for p in root.glob("lm-*") if p.is_dir())  # names start with the time
  for folder in reversed(folders):
    if _resumable(folder):
      return folder
  found = "; ".join(describe(f) for f in folders) if folders else f"no {root}/lm-* folders"
  raise UsageError(f"--resume: nothing to resume in {os.path.abspath(root)}: found {found}."
                   " Start without --resume, name the run with --out, or use --resume auto"
                   " to start fresh when there is nothing to resume")
