"""The main job: ``python -m launch.train --help`` lists every option.

Trains a byte-level transformer LM (launch/model.py) on a shipped text corpus
with sharded params and sharded optimizer state on a device mesh, printing the
mesh, the partition-rule table and the per-device memory plan first, then a
progress line, and writing OUT/metrics.jsonl, OUT/loss.png and checkpoints.

Exit codes: 0 done, or stopped by SIGTERM/SIGINT with a checkpoint saved;
2 a bad argument or a run folder that does not fit them (one ``error: ...``
line on stderr, nothing created or changed); 3 a non-finite loss or state
(no checkpoint of it written); 1 any other error (one line; ``--debug``
shows the traceback).
"""

import sys
import traceback

from launch import cli
from launch import flags
from launch import run_config

EXIT_USAGE, EXIT_NONFINITE, EXIT_ERROR = 2, 3, 1


def _error(error: Exception, debug: bool, named: bool) -> None:
  if debug:
    traceback.print_exception(error, file=sys.stderr)
  lines = str(error).strip().splitlines() or [""]
  what = f"{type(error).__name__}: " if named else ""
  hint = "" if debug else " (--debug shows the traceback)" if named else ""
  print(f"error: {what}{lines[0]}{hint}", file=sys.stderr, flush=True)


def _run(args) -> int:
  cli.set_cpu_devices(args.cpu_devices)
  restore_stdout = None
  if cli.several_processes(args):  # gloo's collectives print connection lines to stdout
    from launch import quiet_stdout  # pylint: disable=import-outside-toplevel
    restore_stdout = quiet_stdout.python_only()
  try:
    from launch import job  # Imports jax, so only after XLA_FLAGS is set.
    return job.run(args)
  finally:
    if restore_stdout is not None:
      restore_stdout()


def main(argv=None) -> int:
  debug = "--debug" in (sys.argv[1:] if argv is None else argv)
  try:
    args = flags.resolve(argv)
    if args.print_config:
      print(run_config.to_toml(args), end="", flush=True)
      return 0
    return _run(args)
  except cli.UsageError as e:
    _error(e, debug, named=False)
    return EXIT_USAGE
  except cli.NonFiniteError as e:
    _error(e, debug, named=False)
    return EXIT_NONFINITE
  except Exception as e:  # noqa: BLE001  (any other error: one line, exit 1)
    _error(e, debug, named=True)
    return EXIT_ERROR


if __name__ == "__main__":
  sys.exit(main())
