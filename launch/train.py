"""The main job: ``python -m launch.train --help`` lists every option.

Trains a byte-level transformer LM (launch/model.py) on a shipped text corpus
with sharded params and sharded optimizer state on a device mesh, printing the
mesh, the partition-rule table and the per-device memory plan first, then a
progress line, and writing OUT/metrics.jsonl, OUT/loss.png and checkpoints.

Exit codes: ``cli.EXIT_CODES``, what each means (``--help`` lists them,
docs/failure-modes.md explains them). Library log lines go to OUT/job.log, not
the terminal.
"""

import os
import sys
import traceback

from launch import arg_checks
from launch import cli
from launch import exit_report
from launch import flags
from launch import folder_checks
from launch import run_config
from launch import run_folder
from launch.errors import EXIT_DONE
from launch.errors import EXIT_ERROR
from launch.errors import EXIT_NONFINITE
from launch.errors import EXIT_STORAGE
from launch.errors import EXIT_USAGE
from launch.stop import StopRequest


def _error(error: Exception, debug: bool, named: bool) -> None:
  if debug:
    traceback.print_exception(error, file=sys.stderr)
  lines = str(error).strip().splitlines() or [""]
  what = f"{type(error).__name__}: " if named else ""
  hint = "" if debug else " (--debug shows the traceback)" if named else ""
  print(f"error: {what}{lines[0]}{hint}", file=sys.stderr, flush=True)


def _run(args, stop: StopRequest) -> int:
  claim = None
  if not arg_checks.several_processes(args):  # its one process owns the folder: taken before jax
    claim = run_folder.take(args)
    stop.on_abort(claim.abort)  # a second signal before step 1 leaves nothing either
  elif args.process_id in (0, None):  # process 0 takes the lock once the processes are joined
    # At once, before jax is imported: process 0, or under --auto-distributed every process
    # (none knows its index yet, and none of this run holds the lock before all have joined).
    folder_checks.refuse_if_in_use(args)
  try:
    cli.set_cpu_devices(args.cpu_devices)
    restore_stdout = None
    if arg_checks.several_processes(args):  # gloo's collectives print connection lines to stdout
      from launch import quiet_stdout  # pylint: disable=import-outside-toplevel
      restore_stdout = quiet_stdout.python_only()
    try:
      from launch import job  # Imports jax, so only after XLA_FLAGS is set.
      return job.run(args, stop, claim)
    finally:
      if restore_stdout is not None:
        restore_stdout()
  finally:
    if claim is not None:
      claim.end()  # (done already where the job ran: it ends the claim itself)


def _print_config(args) -> int:
  """Prints the flags as TOML once they pass the checks a run makes of the flags alone
  (``validation.checked_flags``; the mesh and the run folder are the run's)."""
  cli.set_cpu_devices(args.cpu_devices)
  from launch import validation  # Imports jax, so only after XLA_FLAGS is set.
  validation.checked_flags(args)
  print(run_config.to_toml(args), end="", flush=True)
  return EXIT_DONE


def main(argv=None) -> int:
  debug = "--debug" in (sys.argv[1:] if argv is None else argv)
  stop = StopRequest()  # first: every signal is answered, from here on
  try:
    args = flags.resolve(argv)
    if args.print_config:
      return _print_config(args)
    return _run(args, stop)
  except cli.UsageError as e:
    _error(e, debug, named=False)
    return EXIT_USAGE
  except cli.NonFiniteError as e:
    _error(e, debug, named=False)
    return EXIT_NONFINITE
  except cli.StorageError as e:
    _error(e, debug, named=False)
    return EXIT_STORAGE
  except Exception as e:  # noqa: BLE001  (any other error: one line, exit 1)
    _error(e, debug, named=True)
    return EXIT_ERROR
  finally:
    stop.restore()


def _leave(code: int) -> None:
  """Ends the process with ``code``. A process of a multi-process job that failed ends at once
  (os._exit): at a normal exit jax waits in a shutdown barrier for every process, up to 300 s,
  while the others may wait for this one in a collective; theirs fails when it is gone. The
  code is reported to the launcher first (``exit_report``), as that failure comes after it;
  the output is flushed before, as the launcher then stops every process."""
  sys.stdout.flush()
  sys.stderr.flush()
  exit_report.send(code)
  if code != EXIT_DONE and "jax" in sys.modules:  # else no process was joined
    import jax  # pylint: disable=import-outside-toplevel
    if jax.distributed.is_initialized():
      os._exit(code)
  sys.exit(code)


if __name__ == "__main__":
  _leave(main())
