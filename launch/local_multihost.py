"""Runs a job as N processes on this machine, joined into one global mesh.

    python -m launch.local_multihost --processes 2 --devices 4 -- --steps 50

starts ``python -m launch.train`` N times, each with K simulated CPU devices,
``--coordinator 127.0.0.1:PORT --num-processes N --process-id i`` (a free
port), so ``jax.distributed.initialize`` joins them into one N*K-device job.
Every output line is prefixed with its process index.

Failure handling: if a process exits non-zero (or is killed), the others get
SIGTERM and, after ``--grace`` seconds, SIGKILL (a process stuck in a
collective ignores SIGTERM); the launcher then exits with that process's code
(128 + signal for a killed one). After ``--timeout`` seconds everything is
stopped the same way and the exit code is 124. SIGTERM or Ctrl-C to the
launcher is forwarded to every process as SIGTERM: the job saves a checkpoint
and exits 0.
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from launch import cli
from launch import run_folder

__all__ = ["check_args", "free_port", "main", "parse_args", "process_commands", "run_processes"]


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _pump(index: int, stream, out) -> None:
  for line in iter(stream.readline, ""):
    out.write(f"[{index}] {line}")
    out.flush()


def _exit_code(returncode: int) -> int:
  return 128 - returncode if returncode < 0 else returncode


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
  """SIGTERM every live process, then SIGKILL (by PID) whatever outlives ``grace``."""
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + grace
  for p in procs:
    with contextlib.suppress(subprocess.TimeoutExpired):
      p.wait(timeout=max(0.0, deadline - time.monotonic()))
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def run_processes(commands: list[list[str]], *, timeout: float, grace: float,
                  out=sys.stdout) -> int:
  """Runs the commands concurrently, prefixing output; returns the job's exit code."""
  # stdout and stderr on pipes of their own, each read by whole lines: C++
  # logging (gloo, XLA) on a shared pipe could split a line of the job's output.
  procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True) for cmd in commands]
  pumps = [threading.Thread(target=_pump, args=(i, stream, out), daemon=True)
           for i, p in enumerate(procs) for stream in (p.stdout, p.stderr)]
  for t in pumps:
    t.start()
  interrupted = []
  forward = lambda signum, frame: interrupted.append(signum)
  previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  deadline, code = time.monotonic() + timeout, None
  try:
    while code is None:
      if interrupted:
        out.write(f"[launcher] signal {interrupted[0]}: asking every process to stop\n")
        for p in procs:
          if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        interrupted.clear()
      failed = [p for p in procs if p.poll() not in (None, 0)]
      if failed:
        code = _exit_code(failed[0].returncode)
        out.write(f"[launcher] process {procs.index(failed[0])} exited with"
                  f" {failed[0].returncode}: stopping the others\n")
      elif all(p.poll() == 0 for p in procs):
        code = 0
      elif time.monotonic() > deadline:
        code = 124
        out.write(f"[launcher] timeout after {timeout:.0f} s: stopping every process\n")
      else:
        time.sleep(0.1)
  finally:
    _stop(procs, grace)
    for s, handler in previous.items():
      signal.signal(s, handler)
    for t in pumps:
      t.join(timeout=2)
  return code


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m launch.local_multihost",
      description="Run python -m launch.train (or --module) as N local processes"
      " joined by jax.distributed. Arguments after -- go to every process.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--processes", type=int, default=2)
  p.add_argument("--devices", type=int, default=4, help="simulated CPU devices per process")
  p.add_argument("--module", default="launch.train")
  p.add_argument("--port", type=int, default=0, help="coordinator port; 0 picks a free one")
  p.add_argument("--timeout", type=float, default=900, help="seconds for the whole job")
  p.add_argument("--grace", type=float, default=10,
                 help="seconds between SIGTERM and SIGKILL when stopping processes")
  p.add_argument("--heartbeat-timeout", type=int, default=10,
                 help="seconds before jax aborts a process whose peer went silent")
  p.add_argument("job_args", nargs=argparse.REMAINDER)
  return p


def parse_args(argv=None) -> argparse.Namespace:
  return _parser().parse_args(argv)


def _default_out(job_args: list[str]) -> str:
  """The run folder every process shares when --out is not given: with
  --resume the newest one holding a checkpoint (``--resume auto``: else a new
  one), otherwise a new name unique to this launcher (the job creates it)."""
  fresh = str(run_folder.new_name(tag=str(os.getpid())))
  if "--resume" not in job_args:
    return fresh
  try:
    return str(run_folder.newest_resumable())
  except cli.UsageError:
    at = job_args.index("--resume") + 1
    if job_args[at:at + 1] == ["auto"]:
      return fresh
    raise


def _job_args(args: argparse.Namespace) -> list[str]:
  """The arguments after --; for the main job, one --out shared by every process."""
  job_args = args.job_args[1:] if args.job_args[:1] == ["--"] else args.job_args
  names_out = any(a == "--out" or a.startswith("--out=") for a in job_args)
  if args.module == "launch.train" and not names_out:
    job_args = [*job_args, "--out", _default_out(job_args)]
  return job_args


def process_commands(args: argparse.Namespace, port: int) -> list[list[str]]:
  """One command line per process, joined through 127.0.0.1:``port``."""
  job_args = _job_args(args)
  return [[sys.executable, "-u", "-m", args.module, *job_args,
           "--cpu-devices", str(args.devices),
           "--coordinator", f"127.0.0.1:{port}",
           "--num-processes", str(args.processes), "--process-id", str(i),
           "--init-timeout", "60", "--heartbeat-timeout", str(args.heartbeat_timeout)]
          for i in range(args.processes)]


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError naming the first launcher flag whose value cannot work."""
  for flag, value, low in (("--processes", args.processes, 1), ("--devices", args.devices, 1),
                           ("--port", args.port, 0), ("--heartbeat-timeout", args.heartbeat_timeout, 1)):
    if value < low:
      raise cli.UsageError(f"{flag} {value}: must be at least {low}")
  for flag, value in (("--timeout", args.timeout), ("--grace", args.grace)):
    if not value > 0:
      raise cli.UsageError(f"{flag} {value}: must be a number of seconds > 0")


def main(argv=None) -> int:
  args = parse_args(argv)
  try:
    check_args(args)
    commands = process_commands(args, args.port or free_port())
  except cli.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return run_processes(commands, timeout=args.timeout, grace=args.grace)


if __name__ == "__main__":
  sys.exit(main())
