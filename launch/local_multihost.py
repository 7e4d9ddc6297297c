"""Runs a job as N processes on this machine, joined into one global mesh.

    python -m launch.local_multihost --processes 2 --devices 4 -- --steps 50

starts ``python -m launch.train`` N times, each with K simulated CPU devices,
``--coordinator 127.0.0.1:PORT --num-processes N --process-id i`` (a free
port), so ``jax.distributed.initialize`` joins them into one N*K-device job
(``--init-timeout`` and ``--heartbeat-timeout`` passed on too): those job flags
are the launcher's, refused after ``--`` (``SET_BY_LAUNCHER``).
Every output line is prefixed with its process index: the processes' stdout
on the launcher's stdout, their stderr on its stderr.

Failure handling: when a process fails (or is killed), the others get SIGTERM
and, after ``--grace`` seconds, SIGKILL (a process stuck in a collective ignores
SIGTERM); the launcher then exits with the code of the first process to fail
(128 + signal for a killed one). The job reports its code before it exits
(``launch/exit_report.py``), so a process whose collective failed because
another exited is not taken for the cause, though it may exit first; a process
killed by a signal cannot report, so one already dead when a report is read counts
as the first; a module that reports nothing is judged by its exits. After ``--timeout``
seconds everything is stopped the same way and the exit code is 124. SIGTERM,
SIGINT (Ctrl-C) or SIGHUP to the launcher is forwarded to every process as
SIGTERM: the job saves a checkpoint and exits 0. On Linux each process gets
SIGKILL when the launcher dies, however it dies (its parent-death signal), so
none is left behind. A usage error is one ``error: ...`` line on stderr, exit 2.
"""

import argparse
import contextlib
import ctypes
import importlib.util
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from launch import cli
from launch import exit_report
from launch import flags
from launch import folder_checks
from launch import run_claim
from launch import run_contents

__all__ = ["SET_BY_LAUNCHER", "check_args", "free_port", "main", "parse_args", "process_commands",
           "run_processes"]

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # to every process as SIGTERM


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _write(out, text: str) -> None:
  """Writes and flushes ``text``; an output that is gone (a terminal hung up) loses it but
  neither stops the launcher nor leaves a process's pipe undrained."""
  with contextlib.suppress(OSError):
    out.write(text)
    out.flush()


def _pump(index: int, stream, out) -> None:
  for line in iter(stream.readline, ""):
    _write(out, f"[{index}] {line}")


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


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _killed_with_launcher():
  """A ``preexec_fn`` (None off Linux): the process gets SIGKILL when the launcher's thread
  that started it ends, however (prctl PR_SET_PDEATHSIG, kept across exec); at once if the
  launcher is already gone."""
  if not sys.platform.startswith("linux"):
    return None
  prctl, launcher = ctypes.CDLL(None, use_errno=True).prctl, os.getpid()

  def set_signal() -> None:
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != launcher:
      os.kill(os.getpid(), signal.SIGKILL)

  return set_signal


def _start(commands: list[list[str]], report_fd: int) -> list[subprocess.Popen]:
  # stdout and stderr on pipes of their own, each read by whole lines: C++
  # logging (gloo, XLA) on a shared pipe could split a line of the job's output.
  env = {**os.environ, exit_report.ENV: exit_report.variable(report_fd)}
  return [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, pass_fds=(report_fd,), start_new_session=True,
                           preexec_fn=_killed_with_launcher())
          for cmd in commands]


def _threads(procs, out, err, reports: int, ended: queue.Queue) -> list[threading.Thread]:
  """Started threads: a pump per output stream, a reader of the exit codes the processes
  report on the pipe ``reports`` before they exit, and a waiter per process; each puts (a
  process's index, its code) in ``ended``: a process's report comes before its exit, and
  before every failure its exit causes."""
  threads = [threading.Thread(target=_pump, args=(i, stream, to), daemon=True)
             for i, p in enumerate(procs) for stream, to in ((p.stdout, out), (p.stderr, err))]
  index_of_pid = {p.pid: i for i, p in enumerate(procs)}
  threads.append(threading.Thread(target=exit_report.read,
                                  args=(reports, index_of_pid, ended.put), daemon=True))
  threads += [threading.Thread(target=lambda i=i, p=p: ended.put((i, p.wait())), daemon=True)
              for i, p in enumerate(procs)]
  for t in threads:
    t.start()
  return threads


def _exit_status_now(proc: subprocess.Popen) -> int | None:
  """``proc``'s return code if it has ended (reaped or not), else None; never reaps it, so its
  waiter thread still sees its exit."""
  if proc.returncode is not None:
    return proc.returncode
  try:
    ended = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
  except ChildProcessError:  # its waiter reaped it a moment ago
    return proc.wait()
  if ended is None:
    return None
  killed = ended.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
  return -ended.si_status if killed else ended.si_status


def _killed_before(procs) -> tuple[int, int] | None:
  """(index, code) of a process already ended by a signal, if any, else None.

  A process killed by a signal reports nothing, and its peers' collectives fail as its
  sockets close, a moment before the launcher can see its exit: a peer's report of that
  failure can come first. A process that reports has not yet exited, so no peer has failed
  because of its exit: a death by a signal already seen when a failure is read came first."""
  for index, proc in enumerate(procs):
    code = _exit_status_now(proc)
    if code is not None and code < 0:
      return index, code
  return None


def _watch(procs, ended: queue.Queue, interrupted: list, timeout: float, out) -> int:
  """Waits for the job's outcome: 0 once every process exited 0, the code of the first to fail
  otherwise (by its report, else by its exit), 124 after ``timeout`` s; forwards the signals
  in ``interrupted`` as SIGTERM."""
  deadline, exited = time.monotonic() + timeout, 0
  while True:
    if interrupted:
      _write(out, f"[launcher] {signal.Signals(interrupted[0]).name}: asking every process to"
                  " stop (SIGTERM)\n")
      for p in procs:
        if p.poll() is None:
          p.send_signal(signal.SIGTERM)
      interrupted.clear()
    try:
      index, returncode = ended.get(timeout=0.1)
    except queue.Empty:
      if time.monotonic() > deadline:
        _write(out, f"[launcher] timeout after {timeout:.0f} s: stopping every process\n")
        return 124
      continue
    if returncode != 0:
      index, returncode = _killed_before(procs) or (index, returncode)
      _write(out, f"[launcher] process {index} exited with {returncode}: stopping the others\n")
      return _exit_code(returncode)
    exited += 1
    if exited == len(procs):
      return 0


def run_processes(commands: list[list[str]], *, timeout: float, grace: float,
                  out=sys.stdout, err=sys.stderr) -> int:
  """Runs the commands concurrently, prefixing their stdout on ``out``, their stderr on
  ``err``; returns the job's exit code."""
  reports, report_fd = os.pipe()
  try:
    procs = _start(commands, report_fd)
  except BaseException:
    os.close(reports)
    raise
  finally:
    os.close(report_fd)  # the processes hold it: the reader sees the end once all have exited
  ended, interrupted = queue.Queue(), []
  threads = _threads(procs, out, err, reports, ended)
  forward = lambda signum, frame: interrupted.append(signum)
  previous = {s: signal.signal(s, forward) for s in _FORWARDED}
  try:
    return _watch(procs, ended, interrupted, timeout, out)
  finally:
    _stop(procs, grace)
    for s, handler in previous.items():
      signal.signal(s, handler)
    for t in threads:
      t.join(timeout=2)


class _Parser(argparse.ArgumentParser):
  """argparse whose errors are a UsageError (one line), not usage text and exit."""

  def error(self, message):
    raise cli.UsageError(f"{message} (see python -m launch.local_multihost --help)")


def _parser() -> argparse.ArgumentParser:
  p = _Parser(
      prog="python -m launch.local_multihost",
      description="Run python -m launch.train (or --module) as N local processes"
      " joined by jax.distributed. Arguments after -- go to every process.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--processes", type=int, default=2, help="processes to start")
  p.add_argument("--devices", type=int, default=4, help="simulated CPU devices per process")
  p.add_argument("--module", default="launch.train",
                 help="the module every process runs (python -m MODULE)")
  p.add_argument("--port", type=int, default=0, help="coordinator port; 0 picks a free one")
  p.add_argument("--timeout", type=float, default=900, help="seconds for the whole job")
  p.add_argument("--grace", type=float, default=10,
                 help="seconds between SIGTERM and SIGKILL when stopping processes")
  p.add_argument("--heartbeat-timeout", type=int, default=10,
                 help="seconds before jax aborts a process whose peer went silent")
  p.add_argument("--init-timeout", type=int, default=60,
                 help="seconds a process waits for the others to join")
  p.add_argument("job_args", nargs=argparse.REMAINDER)
  return p


def parse_args(argv=None) -> argparse.Namespace:
  return _parser().parse_args(argv)


def _default_out(given: dict) -> str:
  """The run folder every process shares when the job's flags ``given`` (``flags.given_flags``)
  name none, the one the job alone would take: with --resume (and no --checkpoint-dir) the
  newest one holding a checkpoint (``--resume auto``: else a new one; one a live run holds is
  refused as the job refuses it: '--resume: the newest run ... is in use'), otherwise a new
  name unique to this launcher (the job creates it)."""
  fresh = str(run_claim.new_name(tag=str(os.getpid())))
  if not given.get("resume") or given.get("checkpoint_dir") is not None:
    return fresh
  try:
    newest = str(run_contents.newest_resumable())
  except cli.UsageError:
    if given["resume"] == "auto":
      return fresh
    raise
  folder_checks.refuse_if_in_use(argparse.Namespace(  # named as the job alone names it
      out=newest, checkpoint_dir=None, out_is_newest_run=True))
  return newest


# The main job's flags the launcher gives every process (after the arguments after --, so its
# values would win), and the launcher's flag that sets each (None: not the user's to set).
SET_BY_LAUNCHER = {"cpu_devices": "--devices", "coordinator": "--port",
                   "num_processes": "--processes", "process_id": None, "auto_distributed": None,
                   "init_timeout": "--init-timeout", "heartbeat_timeout": "--heartbeat-timeout"}


def _refuse_flags_set_by_launcher(job_args: list[str]) -> None:
  """Raises UsageError naming the first flag of ``SET_BY_LAUNCHER`` that ``job_args`` give, as
  the job's parser reads them (a --config file's values for them are replaced silently)."""
  given = cli.explicit_flags(job_args)
  for name, instead in SET_BY_LAUNCHER.items():
    if name in given:
      remedy = f"pass the launcher's {instead} before -- instead" if instead else "leave it out"
      raise cli.UsageError(f"--{name.replace('_', '-')} after --: the launcher sets it for every"
                           f" process; {remedy}")


def _job_args(args: argparse.Namespace) -> list[str]:
  """The arguments after --; for the main job, checked not to give a flag the launcher sets
  (``SET_BY_LAUNCHER``), and one --out shared by every process unless its flags (read by its
  own parser) name one."""
  job_args = args.job_args[1:] if args.job_args[:1] == ["--"] else args.job_args
  if args.module != "launch.train":
    return job_args
  _refuse_flags_set_by_launcher(job_args)
  given = flags.given_flags(job_args)
  if given.get("out") is None:
    job_args = [*job_args, "--out", _default_out(given)]
  return job_args


def process_commands(args: argparse.Namespace, port: int) -> list[list[str]]:
  """One command line per process, joined through 127.0.0.1:``port``."""
  job_args = _job_args(args)
  return [[sys.executable, "-u", "-m", args.module, *job_args,
           "--cpu-devices", str(args.devices),
           "--coordinator", f"127.0.0.1:{port}",
           "--num-processes", str(args.processes), "--process-id", str(i),
           "--init-timeout", str(args.init_timeout),
           "--heartbeat-timeout", str(args.heartbeat_timeout)]
          for i in range(args.processes)]


def _unrunnable(module: str) -> str | None:
  """Why ``python -m module`` cannot start, or None: the module (a package's ``__main__``)
  looked up as ``-m`` looks it up, its parent packages imported."""
  try:
    spec = importlib.util.find_spec(module)
    if spec is None:
      return f"no module named {module!r}"
    if spec.submodule_search_locations is not None and not importlib.util.find_spec(
        f"{module}.__main__"):
      return f"{module!r} is a package with no __main__ module"
  except Exception as e:  # noqa: BLE001  (a parent package missing or failing to import)
    return f"{type(e).__name__}: {e}"
  return None


def check_args(args: argparse.Namespace) -> None:
  """Raises UsageError naming the first launcher flag whose value cannot work."""
  for flag, value, low in (("--processes", args.processes, 1), ("--devices", args.devices, 1),
                           ("--port", args.port, 0), ("--init-timeout", args.init_timeout, 1),
                           ("--heartbeat-timeout", args.heartbeat_timeout, 1)):
    if value < low:
      raise cli.UsageError(f"{flag} {value}: must be at least {low}")
  if args.port > 65535:
    raise cli.UsageError(f"--port {args.port}: must be at most 65535")
  for flag, value in (("--timeout", args.timeout), ("--grace", args.grace)):
    if not 0 < value < math.inf:
      raise cli.UsageError(f"{flag} {value}: must be a finite number of seconds > 0")
  why = _unrunnable(args.module)
  if why:
    raise cli.UsageError(f"--module {args.module}: python -m cannot run it ({why})")


def main(argv=None) -> int:
  try:
    args = parse_args(argv)
    check_args(args)
    commands = process_commands(args, args.port or free_port())
  except cli.UsageError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return run_processes(commands, timeout=args.timeout, grace=args.grace)


if __name__ == "__main__":
  sys.exit(main())
