"""The job's processes: joining them into one job (``init_distributed``) and the lines
process 0 alone prints (``say``). Imports jax: the caller sets XLA_FLAGS first.
"""

import argparse
import contextlib
import os
import socket
import sys
import threading

import jax

from launch import cli
from launch import exit_report

__all__ = ["init_distributed", "say"]


def init_distributed(args: argparse.Namespace) -> None:
  """Joins the multi-process job described by the arguments, if any. jax's preemption service
  is turned off first: its C++ SIGTERM handler would replace the job's (launch/stop.py), which
  stops every process at one step itself (``StopRequest.agreed``). Still joining --init-timeout
  seconds later, the process ends with one error line, exit 1 (``_ended_unless_joined``)."""
  if not (args.coordinator or args.auto_distributed):
    return
  jax.config.update("jax_enable_preemption_service", False)
  given = (dict(coordinator_address=args.coordinator, num_processes=args.num_processes,
                process_id=args.process_id) if args.coordinator else {})
  with _ended_unless_joined(args):
    jax.distributed.initialize(
        **given, initialization_timeout=args.init_timeout + _JAX_JOIN_SLACK_S,
        heartbeat_timeout_seconds=args.heartbeat_timeout)


# jax aborts a process whose peers have not all joined by its initialization_timeout (a C++
# check failure and its stack, exit 134): it gets this much more than --init-timeout.
_JAX_JOIN_SLACK_S = 30


@contextlib.contextmanager
def _ended_unless_joined(args: argparse.Namespace):
  """Ends the process (``_not_joined``) if the block still runs --init-timeout s after it began
  (jax's join releases the GIL, so a timer thread runs)."""
  timer = threading.Timer(args.init_timeout, _not_joined, (args,))
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    timer.cancel()


def _not_joined(args: argparse.Namespace) -> None:
  print(f"error: {_join_failure(args)}", file=sys.stderr, flush=True)
  exit_report.send(cli.EXIT_ERROR)
  os._exit(cli.EXIT_ERROR)


def _join_failure(args: argparse.Namespace) -> str:
  """What had not joined by --init-timeout: with --coordinator, for a process but 0, whether
  anything listens at the address at all."""
  waited = f"within --init-timeout {args.init_timeout} s"
  if not args.coordinator:
    return f"--auto-distributed: the processes jax detected did not all join {waited}"
  where, everyone = f"--coordinator {args.coordinator}", f"--num-processes {args.num_processes}"
  remedy = f"start every process with the same --coordinator and {everyone}"
  if args.process_id != 0:
    host, _, port = args.coordinator.rpartition(":")
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError as e:
      return (f"{where}: nothing listens there ({e.strerror or e}) after --init-timeout"
              f" {args.init_timeout} s: start process 0 (it serves the coordinator) or correct"
              " the address")
  return (f"{where}: not all of the {args.num_processes} processes ({everyone}) joined"
          f" {waited} (this is process {args.process_id}): {remedy}")


def say(*lines) -> None:
  """Prints ``lines`` on process 0 only (the job's own lines, once per job)."""
  if jax.process_index() == 0:
    print(*lines, sep="\n", flush=True)
