"""The job's flags as resolved: the parser's defaults, then (with --resume)
the flags saved with the run's newest checkpoint whose metadata is intact (the
step the restore starts from: ``run_contents.saved_config``), then a --config file, then
the command line. No jax imported (the resolved --cpu-devices must be set
first).

A resume finds its run as the job will (--checkpoint-dir, else where --out's run
keeps its checkpoints: ``run_contents.checkpoints_of``, else the newest resumable
``runs/lm-*``, whose folder then becomes --out) and takes back what
``run_config.inherited`` keeps; flags given again are compared with the saved ones
when the checkpoint is restored (``resume.check_config``).
"""

import argparse

from launch import cli
from launch import path_checks
from launch import run_config
from launch import run_contents

__all__ = ["given_flags", "resolve"]


def _resumed_run(given: dict) -> tuple[dict, list]:
  """The flags saved with the run a --resume continues, with --out when it is
  the newest resumable run and --checkpoint-dir where the run recorded one
  ({} when none is found: ``run_folder.prepare`` then reports it, or --resume
  auto starts fresh); and the names of the flags that run was given (saved
  with it since they are: else none)."""
  found = {}
  if given.get("checkpoint_dir") is None and given.get("out") is None:
    try:
      found["out"] = str(run_contents.newest_resumable())
    except cli.UsageError:
      return {}, []
  checkpoint_dir = given.get("checkpoint_dir")
  if checkpoint_dir is None:
    out = given.get("out") or found["out"]
    checkpoint_dir = run_contents.checkpoints_of(out)
    if checkpoint_dir != run_contents.checkpoints_in(out):
      found["checkpoint_dir"] = checkpoint_dir
  saved = run_contents.saved_config(checkpoint_dir)
  if saved:
    _refuse_changes(saved[0], given, f"{checkpoint_dir} (step {saved[1]})")
  if not saved:
    return found, []
  return {**run_config.inherited(saved[0]), **found}, saved[0].get("given", [])


def _refuse_changes(saved: dict, given: dict, where: str) -> None:
  """Raises UsageError when a flag given again differs from the run's where
  it defines the run (``run_config.compare``), before the flags are merged
  and checked together: a changed --param-dtype is reported as itself, not
  as the saved --correction-bits it no longer fits. The restore compares all
  flags again (``resume.check_config``)."""
  again = run_config.flags_of(argparse.Namespace(
      **{k: v for k, v in given.items() if k in saved}))
  refused, _ = run_config.compare(saved, again)
  if refused:
    raise cli.UsageError(run_config.describe_changes(refused, where))


def given_flags(argv=None) -> dict:
  """The flags ``argv`` gives, as the job's parser reads them, over those of its --config file
  (no defaults, nothing checked but their form)."""
  given = cli.explicit_flags(argv)
  if given.get("config"):
    given = {**run_config.read_file(given["config"]), **given}
  return given


def resolve(argv=None) -> argparse.Namespace:
  """The checked flags of this invocation (see the module docstring)."""
  given = given_flags(argv)
  path_checks.check_paths(given)  # before a --resume reads the folders
  saved, given_before = _resumed_run(given) if given.get("resume") else ({}, [])
  args = cli.finish({**saved, **given}, given, given_before)
  args.out_is_newest_run = "out" in saved  # never inherited: found by --resume
  return args
