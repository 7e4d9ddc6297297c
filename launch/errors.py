"""The job's errors, the exit code each ends the job with (``EXIT_CODES``: what
each code means, which --help lists), and how a usage error names a flag (``flag``).
Imports nothing of the job, so every module of launch/ can raise them.
"""

__all__ = ["EXIT_CODES", "EXIT_DONE", "EXIT_ERROR", "EXIT_NONFINITE", "EXIT_STORAGE",
           "EXIT_USAGE", "NonFiniteError", "StorageError", "UsageError", "flag"]

EXIT_DONE, EXIT_ERROR, EXIT_USAGE, EXIT_NONFINITE, EXIT_STORAGE = 0, 1, 2, 3, 4
EXIT_CODES = {  # the job's exit codes and what each means (--help lists them)
    str(EXIT_DONE): "done, or stopped by SIGTERM/SIGINT (with a checkpoint saved, or before step"
                    " 1 with nothing left behind)",
    str(EXIT_USAGE): "a bad argument, or a run folder that does not fit them or is in use by"
                     " another run (one error: line, nothing created or changed)",
    str(EXIT_NONFINITE): "a non-finite loss or state (no checkpoint of it written)",
    str(EXIT_STORAGE): "a file of the run could not be written: disk full, permission lost,"
                       " filesystem gone (one line naming the path and the newest complete"
                       " checkpoint)",
    "128 + N": "stopped at once by a second signal N (launch/stop.py)",
    str(EXIT_ERROR): "any other error (one line; --debug shows the traceback)",
}


class UsageError(Exception):
  """A bad argument or a state of the run folder the arguments do not fit (exit 2)."""


class NonFiniteError(Exception):
  """The loss or the training state became non-finite (exit 3)."""


class StorageError(Exception):
  """Writing the run's files failed: disk full, permission lost, filesystem gone (exit 4)."""


def flag(name: str) -> str:
  """The flag of the argument ``name`` as the user writes it: ``checkpoint_dir`` is
  ``--checkpoint-dir``."""
  return "--" + name.replace("_", "-")
