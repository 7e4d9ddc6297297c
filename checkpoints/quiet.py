"""Keeps Orbax/asyncio noise after a failed read or write off the user's terminal.

When a read fails, Orbax closes its event loop while TensorStore still
completes the other reads: their callbacks print "RuntimeError: Event loop is
closed" tracebacks from background threads, and never-awaited read coroutines
print "Exception ignored in" tracebacks when collected, thousands of lines for
a large state; when a write fails (a full disk), asyncio reports every other
write task of the step as "exception was never retrieved". The error that
matters is raised by the restore or the save itself. These
hooks (and a filter on the ``asyncio`` and ``concurrent.futures`` loggers)
send exactly those reports to the ``checkpoints.orbax_noise`` logger at DEBUG
level and pass everything else on unchanged.
"""

import logging
import sys
import threading

from checkpoints import failures

__all__ = ["install"]

_ABANDONED_READ = "Encountered error while reading array index"
_NEVER_RETRIEVED = "exception was never retrieved"

_log = logging.getLogger("checkpoints.orbax_noise")
_installed = False


def _is_loop_closed(exc: BaseException | None) -> bool:
  return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


def _is_noise(exc: BaseException | None) -> bool:
  return _is_loop_closed(exc) or (exc is not None and str(exc).startswith(_ABANDONED_READ))


def _is_abandoned_write(record: logging.LogRecord) -> bool:
  """asyncio's report of a write task whose failure the manager raised already (a full disk:
  every other write of the step fails too, and their tasks are never awaited)."""
  exc = record.exc_info[1] if record.exc_info else None
  return (exc is not None and _NEVER_RETRIEVED in record.getMessage()
          and failures.write_failure(exc) is not None)


def _is_orbax_coroutine(obj) -> bool:
  code = getattr(obj, "cr_code", None)
  return code is not None and "orbax" in code.co_filename


def _wrap_excepthook(previous):
  def hook(exc_type, exc, tb):
    if _is_loop_closed(exc):
      _log.debug("Background read finished after its event loop closed", exc_info=(exc_type, exc, tb))
      return
    previous(exc_type, exc, tb)
  return hook


def _wrap_threading_excepthook(previous):
  def hook(args):
    if _is_loop_closed(args.exc_value):
      _log.debug("Background read finished after its event loop closed",
                 exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
      return
    previous(args)
  return hook


def _wrap_unraisablehook(previous):
  def hook(unraisable):
    if _is_orbax_coroutine(unraisable.object) or _is_noise(unraisable.exc_value):
      _log.debug("Orbax read abandoned after another read failed",
                 exc_info=(unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback))
      return
    previous(unraisable)
  return hook


class _DemoteNoise(logging.Filter):
  """On the ``asyncio`` and ``concurrent.futures`` loggers: reports of abandoned reads go to DEBUG."""

  def filter(self, record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if _is_noise(exc) or _is_abandoned_write(record):
      _log.debug("%s", record.getMessage(), exc_info=record.exc_info)
      return False
    return True


def install() -> None:
  """Installs the hooks once per process (idempotent)."""
  global _installed  # pylint: disable=global-statement
  if _installed:
    return
  sys.excepthook = _wrap_excepthook(sys.excepthook)
  threading.excepthook = _wrap_threading_excepthook(threading.excepthook)
  sys.unraisablehook = _wrap_unraisablehook(sys.unraisablehook)
  for name in ("asyncio", "concurrent.futures"):
    logging.getLogger(name).addFilter(_DemoteNoise())
  _installed = True
