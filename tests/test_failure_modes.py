"""Bad inputs and faults of the training job: the exit code, a message naming
the culprit, and what is kept (hashes of every file before and after).

Every case runs ``python -m launch.train`` (or the local launcher) in a
subprocess, as a user would. Cases that need a trained run copy one small run
(4 adam steps, checkpoints at steps 2 and 4) trained once in this process.
docs/failure-modes.md lists the same cases as a table.
"""

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import tomllib

import numpy as np
import pytest

from launch import cli
from launch import flags
from launch import path_checks
from launch import report
from launch import resume
from launch import run_claim
from launch import run_contents
from launch import run_folder
from launch import run_lock
from tests import launch_helpers as h

# The trained run's flags; a resume that repeats them may change only what
# run_config.MAY_CHANGE allows. A cosine schedule whose horizon (8) is kept
# apart from --steps, so runs may be extended to 8 steps.
UNKEPT_HORIZON = [*h.TINY, "--optimizer", "adam", "--lr", "0.003", "--schedule", "cosine",
                  "--checkpoint-every", "2", "--keep-checkpoints", "100"]
RUN = [*UNKEPT_HORIZON, "--schedule-steps", "8"]
TIMEOUT = 240


@dataclasses.dataclass
class Result:
  code: int
  out: str
  err: str


def job(log_dir: pathlib.Path, *args: str, module: str = "launch.train",
        cwd: pathlib.Path = h.ROOT, user: int | None = None) -> Result:
  log = log_dir / f"log-{time.monotonic_ns()}"
  code = h.run([module, *args], log, TIMEOUT, cwd=cwd, user=user)
  return Result(code, log.read_text(), pathlib.Path(f"{log}.stderr").read_text())


def usage_error(result: Result, *culprits: str) -> None:
  """Exit 2, one ``error:`` line on stderr naming every culprit, no traceback."""
  assert result.code == 2, (result.code, result.err[-2000:])
  lines = result.err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.err[-2000:]
  for culprit in culprits:
    assert culprit in lines[0], (culprit, lines[0])


def hashes(folder: pathlib.Path) -> dict[str, str]:
  """sha256 of every file under ``folder`` by relative path, but the job's log (library log
  lines of every attempt are appended to it: launch/job_log.py)."""
  return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "job.log"}


def step_files(folder: pathlib.Path, steps) -> dict[str, str]:
  """The hashes of the checkpoint files of ``steps``."""
  prefixes = tuple(f"checkpoints/{s}/" for s in steps)
  return {k: v for k, v in hashes(folder).items() if k.startswith(prefixes)}


def records(folder: pathlib.Path) -> list[dict]:
  """metrics.jsonl parsed as strict JSON (NaN or Infinity fail)."""
  def refuse(constant):
    raise AssertionError(f"non-strict JSON constant {constant} in metrics.jsonl")
  text = (folder / "metrics.jsonl").read_text()
  return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> pathlib.Path:
  out = tmp_path_factory.mktemp("trained") / "run"
  h.run_in_process(out, *RUN[len(h.TINY):], "--steps", "4")
  assert h.checkpoint_steps(out / "checkpoints") == [2, 4]
  return out


@pytest.fixture
def run(trained, tmp_path) -> pathlib.Path:
  """A private copy of the trained run."""
  return pathlib.Path(shutil.copytree(trained, tmp_path / "run"))


# Bad arguments: exit 2 before anything is created ---------------------------

ARGUMENT_CASES = [  # (id, arguments, what the message must name)
    ("lr_nan", ["--lr", "nan"], ["--lr nan"]),
    ("lr_negative", ["--lr", "-1"], ["--lr -1"]),
    ("lr_zero", ["--lr", "0"], ["--lr 0"]),
    ("lr_inf", ["--lr", "inf"], ["--lr inf", "must be a finite number > 0"]),
    ("lr_beyond_float32", ["--lr", "1e300"], ["--lr 1e+300", "the largest float32"]),
    ("lr_below_float32", ["--lr", "1e-50"], ["--lr 1e-50", "the smallest normal float32"]),
    ("lr_not_a_number", ["--lr", "fast"], ["--lr", "fast"]),
    ("steps_zero", ["--steps", "0"], ["--steps 0"]),
    ("batch_zero", ["--batch", "0"], ["--batch 0"]),
    ("seq_len_one", ["--seq-len", "1"], ["--seq-len 1"]),
    ("warmup_negative", ["--warmup-steps", "-1"], ["--warmup-steps -1"]),
    ("clip_norm_nan", ["--clip-norm", "nan"], ["--clip-norm nan"]),
    ("keep_no_checkpoints", ["--keep-checkpoints", "0"], ["--keep-checkpoints 0"]),
    ("log_every_zero", ["--log-every", "0"], ["--log-every 0"]),
    ("opt_not_name_number", ["--opt", "decay"], ["--opt", "decay"]),
    ("opt_nan", ["--opt", "decay_rate=nan"], ["--opt decay_rate=nan"]),
    ("b2_inf", ["--b2", "inf"], ["--b2 inf"]),
    ("unknown_flag", ["--learning-rate", "0.1"], ["--learning-rate"]),
    ("resume_bad_mode", ["--resume", "yes"], ["--resume", "yes"]),
    ("several_processes_without_out", ["--num-processes", "2"], ["--out"]),
    ("processes_without_coordinator", ["--out", "run", "--num-processes", "2"],
     ["--num-processes 2 needs --coordinator HOST:PORT", "or --auto-distributed"]),
    ("process_id_without_coordinator", ["--out", "run", "--process-id", "1"],
     ["--process-id 1 needs --coordinator HOST:PORT", "or --auto-distributed"]),
    ("profile_window_after_the_last_step", ["--profile-steps", "5:7"],
     ["--profile-steps 5:7: starts after the run's last step 2 (--steps)"]),
    # checked once jax knows the devices, still before anything is created:
    ("batch_not_divisible", ["--batch", "3"], ["--batch 3", "data=4"]),
    ("mesh_not_device_count", ["--mesh", "data=2,model=3"], ["--mesh data=2,model=3", "8"]),
    ("mesh_unknown_axis", ["--mesh", "batch=4,model=2"], ["--mesh batch=4,model=2", "data"]),
    ("mesh_syntax", ["--mesh", "data:4"], ["--mesh data:4"]),
    ("axis_types_unknown", ["--axis-types", "data=explicit,model=manual"],
     ["--axis-types data=explicit,model=manual", "type 'manual' of axis 'model'"]),
    ("axis_types_axis_left_out", ["--axis-types", "data=explicit"],
     ["--axis-types data=explicit", "no type to axis 'model'", "data=explicit,model=auto"]),
    ("heads_not_divisible", ["--heads", "3"], ["--mesh", "attn/query/kernel", "size 3"]),
    ("unknown_optimizer", ["--optimizer", "adamm"], ["--optimizer 'adamm'"]),
    ("optimizer_keyword", ["--optimizer", "sgd", "--b2", "0.9"], ["--optimizer sgd", "b2"]),
    ("batch_larger_than_held_out", ["--batch", "4096"], ["--batch 4096", "held-out"]),
    ("eps_negative", ["--eps", "-1"], ["--eps -1", ">= 0"]),
    ("b1_above_one", ["--b1", "1.5"], ["--b1 1.5", "from 0 to 1"]),
    ("opt_b1_above_one", ["--opt", "b1=1.5"], ["--opt b1=1.5", "from 0 to 1"]),
    ("opt_eps_negative", ["--opt", "eps=-1"], ["--opt eps=-1", ">= 0"]),
    ("opt_eps_root_negative", ["--opt", "eps_root=-1"], ["--opt eps_root=-1", ">= 0"]),
    ("warmup_beyond_the_horizon", ["--schedule", "warmup_cosine", "--warmup-steps", "500",
                                   "--steps", "200"], ["--warmup-steps 500", "horizon 200"]),
    ("opt_fraction_for_an_integer", ["--optimizer", "muon", "--opt", "ns_steps=2.5"],
     ["--opt ns_steps=2.5", "integer"]),
    ("opt_keyword_the_job_sets", ["--opt", "learning_rate=0.1"], ["--opt learning_rate", "--lr"]),
    ("opt_given_twice", ["--b1", "0.9", "--opt", "b1=0.8"],
     ["--opt b1=0.8: b1 is given twice (also by --b1 0.9)"]),
    ("opt_not_a_number", ["--optimizer", "adafactor", "--opt", "decay_rate=fast"],
     ["--opt", "'fast' is not a number"]),
    ("d_model_odd", ["--d-model", "63"], ["--d-model 63", "even"]),
    ("out_empty", ["--out", ""], ["--out ''", "empty path"]),
    ("checkpoint_dir_blank", ["--checkpoint-dir", " "], ["--checkpoint-dir ' '", "empty path"]),
    ("checkpoint_dir_the_run_folder", ["--out", "run", "--checkpoint-dir", "./run/"],
     ["--checkpoint-dir ./run/: the run folder (--out) itself", "--checkpoint-dir run/checkpoints"]),
    ("seq_len_beyond_the_corpus", ["--eval-every", "0", "--seq-len", "200000"],
     ["--seq-len 200000: at most 33760", "held-out slice"]),
    ("seed_negative", ["--seed", "-1"], ["--seed -1", "at least 0"]),
    ("seed_beyond_32_bits", ["--seed", "99999999999999999999999"],
     ["--seed 99999999999999999999999", "at most 4294967295"]),
    # the optimizer's keywords: checked, then the optimizer built and its update traced, all
    # before the run folder is settled:
    ("opt_negative_count", ["--optimizer", "muon", "--opt", "ns_steps=-1"],
     ["--opt ns_steps=-1", "integer >= 0"]),
    ("opt_values_the_optimizer_fails_with", ["--optimizer", "galore", "--opt", "rank=0"],
     ["--optimizer galore --opt rank=0: galore fails with these values", "ValueError",
      "not with its defaults"]),
    ("opt_keyword_that_is_not_a_number", ["--optimizer", "adamw", "--opt", "mu_dtype=1"],
     ["--opt mu_dtype=1", "not a number"]),
    ("opt_switch_neither_0_nor_1", ["--opt", "nesterov=2"], ["--opt nesterov=2", "0 (false) or 1"]),
    ("state_quantized_twice", ["--state-bits", "8", "--opt", "state_bits=8"],
     ["--state-bits 8 with --opt state_bits=8: both quantize the optimizer's state",
      "give one of them"]),
    ("optimizer_needing_what_no_flag_gives", ["--optimizer", "schedule_free"],
     ["--optimizer schedule_free", "base_optimizer", "not a number"]),
    ("coordinator_not_host_port", ["--out", "run", "--coordinator", "nonsense",
                                   "--num-processes", "2", "--process-id", "0"],
     ["--coordinator nonsense: not HOST:PORT"]),
    ("coordinator_port_not_a_number", ["--out", "run", "--coordinator", "127.0.0.1:abc",
                                       "--num-processes", "2", "--process-id", "0"],
     ["--coordinator 127.0.0.1:abc: the port must be a number from 1 to 65535"]),
    ("coordinator_port_out_of_range", ["--out", "run", "--coordinator", "127.0.0.1:70000",
                                       "--num-processes", "2", "--process-id", "0"],
     ["--coordinator 127.0.0.1:70000: the port must be a number from 1 to 65535"]),
    ("optimizer_the_job_cannot_train", ["--optimizer", "dpsgd", "--opt", "l2_norm_clip=1",
                                        "--opt", "noise_multiplier=0.1", "--opt", "seed=0"],
     ["--optimizer dpsgd: cannot train in this job", "gradient of each example"]),
]


@pytest.mark.parametrize("args,culprits", [c[1:] for c in ARGUMENT_CASES],
                         ids=[c[0] for c in ARGUMENT_CASES])
def test_bad_argument_creates_nothing(tmp_path, args, culprits):
  work = tmp_path / "work"
  work.mkdir()
  usage_error(job(tmp_path, *h.TINY, "--steps", "2", *args, cwd=work), *culprits)
  assert list(work.iterdir()) == []  # no runs/ folder


def test_a_printed_config_starts_the_run_of_the_command_that_printed_it(tmp_path):
  """Derived flags not given are comments: the file reads back (the shortened default warmup
  not pinned), and flags given with it derive --lr and --schedule-steps again."""
  printed = job(tmp_path, "--print-config", "--steps", "10")
  assert printed.code == 0, printed.err
  (tmp_path / "c.toml").write_text(printed.out)
  again = job(tmp_path, "--config", str(tmp_path / "c.toml"), "--print-config")
  assert (again.code, again.out) == (0, printed.out), again.err
  (tmp_path / "d.toml").write_text(job(tmp_path, "--print-config").out)
  flags_ = ["--steps", "1000", "--optimizer", "muon", "--print-config"]
  with_file = job(tmp_path, "--config", str(tmp_path / "d.toml"), *flags_)
  assert with_file.code == 0 and with_file.out == job(tmp_path, *flags_).out, with_file.err
  assert "# lr = 0.03  # muon's default" in with_file.out.splitlines()
  assert "# schedule_steps = 1000  # --steps" in with_file.out.splitlines()


def test_debug_shows_the_traceback(tmp_path):
  result = job(tmp_path, *h.TINY, "--lr", "nan", "--debug")
  assert result.code == 2 and "Traceback" in result.err
  assert result.err.strip().splitlines()[-1].startswith("error: --lr nan")


def test_out_that_is_a_file(tmp_path):
  (tmp_path / "taken").write_text("keep me")
  usage_error(job(tmp_path, *h.TINY, "--out", str(tmp_path / "taken")), "--out", "taken")
  assert (tmp_path / "taken").read_text() == "keep me"


@pytest.mark.parametrize("flag,path,culprits", [
    ("--out", "afile/sub", ["--out afile/sub: afile is a file, not a folder"]),
    ("--checkpoint-dir", "afile/ck", ["--checkpoint-dir afile/ck: afile is a file, not a folder"]),
    ("--out", "dangling", ["--out dangling: is a symbolic link to nowhere, which does not exist"]),
    ("--out", "dangling/sub", ["--out dangling/sub: dangling is a symbolic link to nowhere"]),
])
def test_a_path_through_a_file_or_a_dangling_link(tmp_path, flag, path, culprits):
  """No folder can be made there: exit 2 naming the part in the way (not an OSError of the
  lock code), and the working directory as it was."""
  work = tmp_path / "work"
  work.mkdir()
  (work / "afile").write_text("keep me")
  (work / "dangling").symlink_to("nowhere")
  usage_error(job(tmp_path, *h.TINY, "--steps", "2", flag, path, cwd=work), *culprits)
  assert sorted(p.name for p in work.iterdir()) == ["afile", "dangling"]
  assert (work / "afile").read_text() == "keep me" and not (work / "nowhere").exists()


@pytest.mark.parametrize("flags, culprit", [
    (["--checkpoint-dir", "gs:/b/c"], "--checkpoint-dir gs:/b/c: orbax reads 'gs:/'"),
    (["--out", "logs/gs:/run"], "--out logs/gs:/run: orbax reads 'gs:/'"),
])
def test_a_local_checkpoint_folder_orbax_would_write_elsewhere(tmp_path, flags, culprit):
  """A local path holding 'gs:/' (a bucket URL missing a slash) trained, then failed at the
  first save: orbax turns 'gs:/' into 'gs://' and tensorstore refuses the path. Now a usage
  error before anything is created."""
  work = tmp_path / "work"
  work.mkdir()
  usage_error(job(tmp_path, *h.TINY, "--steps", "2", *flags, cwd=work), culprit,
              "for a bucket write gs://")
  assert not list(work.iterdir())


def test_a_file_named_runs_where_new_run_folders_go(tmp_path):
  work = tmp_path / "work"
  work.mkdir()
  (work / "runs").write_text("keep me")
  usage_error(job(tmp_path, *h.TINY, "--steps", "2", cwd=work),
              "cannot create the run folder runs/lm-", "runs is a file, not a folder", "--out")
  assert [p.name for p in work.iterdir()] == ["runs"] and (work / "runs").read_text() == "keep me"


# Run folders and --resume --------------------------------------------------

def test_resume_with_no_runs_at_all(tmp_path):
  work = tmp_path / "work"
  work.mkdir()
  usage_error(job(tmp_path, *h.TINY, "--resume", cwd=work), "--resume", "no runs/lm-*")
  assert list(work.iterdir()) == []


def test_resume_lists_the_folders_it_found(tmp_path):
  """The issue's trap: an empty folder left by a failed start, taken as the run."""
  work = tmp_path / "work"
  failed = work / "runs" / "lm-20260101-000000"
  failed.mkdir(parents=True)
  (failed / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
  before = hashes(work)
  usage_error(job(tmp_path, *h.TINY, "--resume", cwd=work),
              "nothing to resume", "lm-20260101-000000", "no checkpoints",
              "metrics.jsonl with 1 records")
  assert hashes(work) == before


def test_resume_without_checkpoint_keeps_the_metrics(run, tmp_path):
  shutil.rmtree(run / "checkpoints")
  before = hashes(run)
  usage_error(job(tmp_path, *RUN, "--steps", "4", "--resume", "--out", str(run)),
              "--resume", str(run), "no checkpoints", "metrics.jsonl with 4 records")
  assert hashes(run) == before


def test_fresh_start_into_a_run_folder(run, tmp_path):
  before = hashes(run)
  usage_error(job(tmp_path, *RUN, "--steps", "4", "--out", str(run)),
              f"--out {run}", "checkpoint steps [2, 4]", "pass --resume")
  assert hashes(run) == before


def test_resume_with_changed_flags(run, tmp_path):
  before = hashes(run)
  usage_error(job(tmp_path, *RUN, "--steps", "4", "--resume", "--out", str(run),
                  "--lr", "0.1", "--seed", "7"),
              "--lr 0.003 -> 0.1", "--seed 0 -> 7", "step 4")
  assert hashes(run) == before


def test_resume_with_a_new_schedule_horizon(run, tmp_path):
  """--resume keeps the saved --schedule-steps unless given; a new one is refused."""
  before = hashes(run)
  usage_error(job(tmp_path, *UNKEPT_HORIZON, "--steps", "6", "--schedule-steps", "6",
                  "--resume", "--out", str(run)), "--schedule-steps 8 -> 6")
  assert hashes(run) == before


def test_resume_with_fewer_steps_than_the_checkpoint(run, tmp_path):
  before = hashes(run)
  usage_error(job(tmp_path, *RUN, "--steps", "3", "--resume", "--out", str(run)),
              "--steps 3", "step 4")
  assert hashes(run) == before


@contextlib.contextmanager
def read_only(folder: pathlib.Path):
  """``folder`` made read-only for this user: without write permission, or, for
  root (whom permissions do not stop), as a read-only bind mount of itself."""
  if os.geteuid() != 0:
    paths = [folder, *folder.rglob("*")]
    for path in paths:
      path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
      yield
    finally:
      for path in paths:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    return
  mount = subprocess.run(["mount", "--bind", str(folder), str(folder)],
                         check=False, capture_output=True)
  if mount.returncode:
    pytest.skip(f"root, and no bind mount to make a folder read-only: {mount.stderr!r}")
  try:
    subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)
    yield
  finally:
    subprocess.run(["umount", str(folder)], check=True)


def test_read_only_run_folder(run, tmp_path):
  before = hashes(run)
  with read_only(run):
    usage_error(job(tmp_path, *RUN, "--steps", "6", "--resume", "--out", str(run)),
                f"--out {run}", "not writable")
  assert hashes(run) == before


def test_launcher_resume_with_nothing_to_resume(tmp_path):
  work = tmp_path / "work"
  work.mkdir()
  result = job(tmp_path, "--", *h.TINY, "--resume", module="launch.local_multihost", cwd=work)
  assert result.code == 2 and result.err.startswith("error: --resume: nothing to resume")
  assert list(work.iterdir()) == []


@pytest.mark.parametrize("args,culprit", [
    (["--devices", "0"], "--devices 0: must be at least 1"),
    (["--timeout", "0"], "--timeout 0.0: must be a finite number of seconds > 0"),
    (["--grace", "-1"], "--grace -1.0: must be a finite number of seconds > 0"),
    (["--grace", "inf"], "--grace inf: must be a finite number of seconds > 0"),
    (["--timeout", "nan"], "--timeout nan: must be a finite number of seconds > 0"),
], ids=["devices", "timeout", "grace", "grace_infinite", "timeout_nan"])
def test_launcher_with_no_devices_or_no_time(tmp_path, args, culprit):
  work = tmp_path / "work"
  work.mkdir()
  result = job(tmp_path, *args, "--", *h.TINY, module="launch.local_multihost", cwd=work)
  usage_error(result, culprit)
  assert list(work.iterdir()) == []


@pytest.mark.parametrize("processes", ["0", "-1"])
def test_launcher_with_no_processes(tmp_path, processes):
  work = tmp_path / "work"
  work.mkdir()
  result = job(tmp_path, "--processes", processes, "--", *h.TINY, module="launch.local_multihost",
               cwd=work)
  usage_error(result, f"--processes {processes}", "at least 1")
  assert list(work.iterdir()) == []


@pytest.mark.parametrize("args,culprits", [
    (["--processes", "abc"], ["argument --processes: invalid int value: 'abc'",
                              "(see python -m launch.local_multihost --help)"]),
    (["--steps", "5"], ["unrecognized arguments: --steps",
                        "(see python -m launch.local_multihost --help)"]),
    (["--port", "70000"], ["--port 70000: must be at most 65535"]),
    (["--module", "nosuch.train"], ["--module nosuch.train: python -m cannot run it"
                                    " (ModuleNotFoundError: No module named 'nosuch')"]),
    (["--module", "launch"], ["--module launch: python -m cannot run it ('launch' is a package"
                              " with no __main__ module)"]),
], ids=["processes_not_a_number", "a_job_flag_before_the_dashes", "port_out_of_range",
        "no_such_module", "a_package_without_main"])
def test_launcher_usage_error_is_one_line(tmp_path, args, culprits):
  """argparse printed the launcher's usage text (7 lines); --port 70000 was accepted; a
  --module python -m cannot run started every process, each printing python's error, and the
  launcher exited 1."""
  work = tmp_path / "work"
  work.mkdir()
  result = job(tmp_path, *args, "--", *h.TINY, module="launch.local_multihost", cwd=work)
  usage_error(result, *culprits)
  assert list(work.iterdir()) == []


@pytest.mark.parametrize("job_flags,culprit", [
    (["--cpu-devices", "2"], "--cpu-devices after --: the launcher sets it for every process;"
                             " pass the launcher's --devices before -- instead"),
    (["--heartbeat-timeout=300"], "--heartbeat-timeout after --: the launcher sets it for every"
                                  " process; pass the launcher's --heartbeat-timeout before --"),
    (["--init", "5"], "--init-timeout after --: the launcher sets it for every process; pass the"
                      " launcher's --init-timeout before -- instead"),
    (["--num-processes", "2"], "--num-processes after --: the launcher sets it for every"
                               " process; pass the launcher's --processes before -- instead"),
    (["--coordinator", "127.0.0.1:5000"], "--coordinator after --: the launcher sets it for every"
                                          " process; pass the launcher's --port before --"),
    (["--process-id", "0"], "--process-id after --: the launcher sets it for every process;"
                            " leave it out"),
    (["--auto-distributed"], "--auto-distributed after --: the launcher sets it for every"
                             " process; leave it out"),
], ids=["cpu_devices", "heartbeat_timeout", "init_timeout", "num_processes", "coordinator",
        "process_id", "auto_distributed"])
def test_launcher_refuses_a_job_flag_it_sets_itself(tmp_path, job_flags, culprit):
  """The launcher put its own values after the job's arguments, so the job silently ran with
  them (--init-timeout 5 -> 60, --cpu-devices 2 -> 4, --heartbeat-timeout 300 -> 10). Now one
  line naming the launcher's flag; nothing started or created."""
  work = tmp_path / "work"
  work.mkdir()
  result = job(tmp_path, "--timeout", "60", "--", *h.TINY, "--steps", "1", *job_flags,
               module="launch.local_multihost", cwd=work)
  usage_error(result, culprit)
  assert result.out == "" and list(work.iterdir()) == []


def test_launcher_passes_the_processes_stderr_to_its_stderr(tmp_path):
  """A job's error line reached the launcher's stdout, its stderr left empty. Both processes
  refuse the flag; the launcher ends the other when the first exits, so the line of at least
  one of them (either) is there."""
  work = tmp_path / "work"
  work.mkdir()
  result = job(tmp_path, "--", *h.TINY, "--lr", "-1", module="launch.local_multihost",
               cwd=work)
  assert result.code == 2, result.err
  lines = result.err.strip().splitlines()
  assert {f"[{i}] error: --lr -1.0: must be a finite number > 0" for i in (0, 1)} & set(lines), (
      result.err)
  assert all(line.startswith(("[0] ", "[1] ")) for line in lines), result.err
  assert "error:" not in result.out
  assert list(work.iterdir()) == []


def test_the_launcher_names_the_process_that_failed_first_though_another_exits_first(tmp_path):
  """A process whose collective fails because another exited can be reaped before it: the
  launcher took the first exit for the cause (CI: exit 1, process 1's "Connection closed by
  peer", where process 0 had failed writing with 4). Here process 0 reports 4, then lets
  process 1 exit 1 at once and exits itself 2 s later: the launcher exits 4 naming process 0."""
  from launch import local_multihost
  failed = tmp_path / "process-0-failed"
  first = ("import os, time; from launch import exit_report; exit_report.send(4);"
           f" open({str(failed)!r}, 'w').close(); time.sleep(2); os._exit(4)")
  second = f"import os, time\nwhile not os.path.exists({str(failed)!r}): time.sleep(0.01)\nos._exit(1)"
  out, err = tmp_path / "out", tmp_path / "err"
  with open(out, "w") as out_file, open(err, "w") as err_file:
    code = local_multihost.run_processes([[sys.executable, "-c", first],
                                          [sys.executable, "-c", second]],
                                         timeout=60, grace=5, out=out_file, err=err_file)
  assert code == 4, (code, out.read_text(), err.read_text())
  assert out.read_text() == "[launcher] process 0 exited with 4: stopping the others\n"


def test_a_peers_report_read_after_a_process_was_killed_names_the_killed_one(tmp_path):
  """A process killed by SIGKILL reports nothing, and its peer's collective fails as the
  killed one's sockets close, a moment before the launcher reaps it: CI read process 0's
  report (exit 1) before process 1's exit and named process 0. Here process 1 is dead and
  not yet reaped when process 0's report is read: the launcher names process 1, 128 + 9."""
  import io
  import queue
  from launch import local_multihost
  alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    killed.kill()
    os.waitid(os.P_PID, killed.pid, os.WEXITED | os.WNOWAIT)  # dead, left for the launcher
    ended, out = queue.Queue(), io.StringIO()
    ended.put((0, 1))  # process 0's report, read first
    code = local_multihost._watch([alive, killed], ended, [], timeout=30, out=out)
  finally:
    alive.kill()
    alive.wait()
    killed.wait()
  assert (code, out.getvalue()) == (
      137, "[launcher] process 1 exited with -9: stopping the others\n")


def test_the_job_reports_its_exit_code_before_it_exits(tmp_path):
  """What the launcher reads (exit_report.ENV): the job's pid and code, one line."""
  from launch import exit_report
  reports, report_fd = os.pipe()
  env = {**h.child_env(), exit_report.ENV: exit_report.variable(report_fd)}
  proc = subprocess.Popen([sys.executable, "-m", "launch.train", "--lr", "-1"], cwd=tmp_path,
                          env=env, pass_fds=(report_fd,), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  os.close(report_fd)
  with os.fdopen(reports) as lines:
    assert lines.read() == f"{proc.pid} {cli.EXIT_USAGE}\n"
  assert proc.wait(timeout=60) == cli.EXIT_USAGE


def test_a_report_goes_only_to_the_launchers_pipe(tmp_path, monkeypatch):
  """A job's own children inherit the variable but not the descriptor: there its number may be
  another file or pipe of theirs, which must not get the line."""
  from launch import exit_report
  slot = 200  # the descriptor's number in the variable
  reports, write_end = os.pipe()
  os.dup2(write_end, slot)
  os.close(write_end)
  monkeypatch.setenv(exit_report.ENV, exit_report.variable(slot))
  other_reports, other_write_end = os.pipe()
  try:
    with open(tmp_path / "data", "wb") as data:
      os.dup2(data.fileno(), slot)  # a file where the launcher's pipe was
      exit_report.send(2)
    os.dup2(other_write_end, slot)  # another pipe there
    exit_report.send(2)
  finally:
    os.close(slot)
    os.close(other_write_end)
  assert (tmp_path / "data").read_bytes() == b""
  with os.fdopen(other_reports) as other, os.fdopen(reports) as ours:
    assert other.read() == ""
    assert ours.read() == ""


def test_the_launcher_passes_over_lines_not_of_a_report(tmp_path):
  from launch import exit_report
  reports, write_end = os.pipe()
  os.write(write_end, b"hello\n12 x\n99 3\n\xff\xfe\n12 4 5\n12 4\n")
  os.close(write_end)
  got = []
  exit_report.read(reports, {12: 1}, got.append)
  assert got == [(1, 4)]


@pytest.mark.parametrize("process_id", ["0", "1"])
def test_a_peer_that_never_joins(tmp_path, process_id):
  """Process 0 alone, or process 1 with no process 0: jax aborted after --init-timeout with a
  C++ check failure and its stack (exit 134); now one line naming what did not join."""
  from launch import local_multihost
  port = local_multihost.free_port()
  work = tmp_path / "work"
  work.mkdir()
  started = time.monotonic()
  result = job(tmp_path, *h.TINY, "--out", "run", "--coordinator", f"127.0.0.1:{port}",
               "--num-processes", "2", "--process-id", process_id, "--init-timeout", "5",
               cwd=work)
  took = time.monotonic() - started
  assert result.code == cli.EXIT_ERROR, (result.code, result.err[-2000:])
  lines = result.err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.err[-2000:]
  assert f"127.0.0.1:{port}" in lines[0] and "--init-timeout 5" in lines[0], lines[0]
  assert ("nothing listens there" if process_id == "1" else
          "not all of the 2 processes (--num-processes 2) joined") in lines[0], lines[0]
  assert took < 30, took
  assert list(work.iterdir()) == []


def test_a_folder_in_use_is_refused_at_once_naming_the_holder(run, tmp_path):
  before = hashes(run)
  held = run_lock.RunLock.acquire(run)  # this test process holds the run
  try:
    started = time.monotonic()
    result = job(tmp_path, *RUN, "--steps", "6", "--resume", "--out", str(run))
    elapsed = time.monotonic() - started
  finally:
    held.release()
  usage_error(result, f"--out {run} is in use by another run", f"pid {os.getpid()}", "since",
              f"host {held.holder.host}")
  assert elapsed < 5, elapsed  # before jax is imported
  assert hashes(run) == before


def _without_jax_imported(stderr: str) -> list[str]:
  """The lines of a job's stderr run with PYTHONPROFILEIMPORTTIME, asserting its imports (the
  'import time:' lines) hold no jax; the other lines."""
  imports = [line for line in stderr.splitlines() if line.startswith("import time:")]
  assert imports and not any(re.search(r"\|\s+jax$", line) for line in imports)
  return [line for line in stderr.splitlines() if not line.startswith("import time:")]


def test_an_auto_distributed_process_refuses_a_folder_in_use_before_importing_jax(tmp_path):
  """Under --auto-distributed (the SLURM and TPU scripts) no process knows its index before
  jax joins them, and only process 0 checked the folder at once: each went on to import jax
  and join. Each checks it now (none of the run holds the lock before all have joined)."""
  out = tmp_path / "run"
  out.mkdir()
  held = run_lock.RunLock.acquire(out)  # this test process holds the run
  env = {**h.child_env(), "PYTHONPATH": str(h.ROOT), "PYTHONPROFILEIMPORTTIME": "1"}
  try:
    result = subprocess.run(
        [sys.executable, "-m", "launch.train", *h.TINY, "--auto-distributed", "--out", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT)
  finally:
    held.release()
  lines = _without_jax_imported(result.stderr)
  assert result.returncode == 2, result.stderr[-2000:]
  assert len(lines) == 1 and lines[0].startswith(f"error: --out {out} is in use by another run"
                                                   f" (host "), lines


@pytest.mark.parametrize("resume", [[], ["--resume"]], ids=["fresh", "resume"])
def test_a_folder_a_live_run_holds_is_in_use_whatever_it_holds(tmp_path, resume):
  """A live run that started a moment ago holds the folder and has written its first metrics
  (no checkpoint yet): the check after jax (or a multi-process job's, which takes its lock only
  then) says the folder is in use. It said 'already holds a run ...: pass --resume' (or, with
  --resume, 'nothing to resume'): advice to resume onto the live run."""
  out = tmp_path / "run"
  out.mkdir()
  report.append_metrics(out / "metrics.jsonl", {"step": 1, "loss": 6.0})
  held = run_lock.RunLock.acquire(out)
  try:
    for stack in (None, contextlib.ExitStack()):
      with pytest.raises(cli.UsageError, match=f"^--out {out} is in use by another run .*pid"
                         f" {os.getpid()}.*choose another --out$"):
        run_folder.prepare(cli.parse_args(["--out", str(out), *resume]), held=stack)
  finally:
    held.release()
  assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


@pytest.mark.slow
def test_two_jobs_started_together_on_one_out(tmp_path):
  """Started at the same moment: one trains, the other exits 2 before importing jax (its
  imports, PYTHONPROFILEIMPORTTIME, hold no jax), within 5 s, naming the first. It was refused
  only after importing jax (~8 s on a loaded machine): a single-process run took its lock only
  then; it takes it first now (run_folder.take)."""
  out = tmp_path / "run"
  env = {**h.child_env(), "PYTHONPATH": str(h.ROOT), "PYTHONPROFILEIMPORTTIME": "1"}
  command = [sys.executable, "-m", "launch.train", *h.TINY, "--steps", "2", "--out", str(out)]
  logs = [(open(tmp_path / f"out-{i}", "w"), open(tmp_path / f"err-{i}", "w")) for i in range(2)]
  started = time.monotonic()
  jobs = [subprocess.Popen(command, cwd=h.ROOT, env=env, stdout=out_log, stderr=err_log)
          for out_log, err_log in logs]
  ended = {}
  try:
    while len(ended) < 2 and time.monotonic() - started < TIMEOUT:
      for i, proc in enumerate(jobs):
        if i not in ended and proc.poll() is not None:
          ended[i] = time.monotonic() - started
      time.sleep(0.02)
  finally:
    for proc, files in zip(jobs, logs):
      h.stop(proc)
      for f in files:
        f.close()
  said = [((tmp_path / f"out-{i}").read_text(), (tmp_path / f"err-{i}").read_text())
          for i in range(2)]
  codes = sorted(proc.returncode for proc in jobs)
  assert codes == [0, 2], (codes, [err[-2000:] for _, err in said])
  winner, refused = (0, 1) if jobs[0].returncode == 0 else (1, 0)
  lines = _without_jax_imported(said[refused][1])
  assert len(lines) == 1 and lines[0].startswith(f"error: --out {out} is in use by another run"
                                                   f" (host "), lines
  assert f"pid {jobs[winner].pid}" in lines[0]
  assert ended[refused] < 5, ended
  assert [r["step"] for r in records(out)] == [1, 2]


@pytest.mark.parametrize("resume", [[], ["auto"]], ids=["required", "auto"])
def test_resume_without_out_of_a_newest_run_in_use_names_resume(run, tmp_path, resume):
  """--resume without --out, the newest run (which --resume picks) held by a live job: exit 2
  naming --resume's choice and --out as the remedy, not a --out the user never passed; the
  run as it was and no new run folder."""
  work = tmp_path / "work"
  newest = work / "runs" / "lm-20260101-000000"
  newest.parent.mkdir(parents=True)
  run.rename(newest)
  before = hashes(work)
  held = run_lock.RunLock.acquire(newest)
  try:
    result = job(tmp_path, *RUN, "--steps", "6", "--resume", *resume, cwd=work)
  finally:
    held.release()
  usage_error(result, "--resume: the newest run runs/lm-20260101-000000 is in use by another"
              " run", f"pid {os.getpid()}", "pass --out naming the run to resume")
  assert "--out runs/" not in result.err
  assert hashes(work) == before


def test_resume_without_out_of_a_newest_run_locked_meanwhile_names_resume(
    run, tmp_path, monkeypatch):
  """The same once the run holds its locks (the other job took the newest run's lock after
  the check before jax)."""
  monkeypatch.chdir(tmp_path)
  newest = pathlib.Path("runs") / "lm-20260101-000000"
  newest.parent.mkdir()
  run.rename(newest)
  args = flags.resolve([*RUN, "--steps", "6", "--resume"])
  assert args.out == str(newest) and args.out_is_newest_run
  held = run_lock.RunLock.acquire(newest)
  try:
    with contextlib.ExitStack() as stack, pytest.raises(
        cli.UsageError, match=f"^--resume: the newest run {newest} is in use by another run"
        f" .*pid {os.getpid()}.*pass --out naming the run to resume"):
      run_folder.prepare(args, held=stack)
  finally:
    held.release()


@pytest.mark.parametrize("inside", ["checkpoints", "."])
@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_a_checkpoint_dir_inside_a_running_jobs_folder_is_refused(run, tmp_path, inside, resume):
  """Another --out with a --checkpoint-dir in (or at) the folder of a running job: exit 2 at
  once naming the holder; its checkpoints stay as they are, the other --out is not created."""
  before = hashes(run)
  checkpoint_dir = os.path.normpath(run / inside)
  held = run_lock.RunLock.acquire(run)
  try:
    started = time.monotonic()
    result = job(tmp_path, *RUN, "--steps", "6", *resume, "--out", str(tmp_path / "other"),
                 "--checkpoint-dir", checkpoint_dir)
    elapsed = time.monotonic() - started
  finally:
    held.release()
  usage_error(result, f"--checkpoint-dir {checkpoint_dir} is in use by another run",
              f"pid {os.getpid()}", f"lock {run / run_lock.LOCK_NAME}")
  assert elapsed < 5, elapsed  # before jax is imported
  assert hashes(run) == before and not (tmp_path / "other").exists()


@pytest.mark.parametrize("flags", [["--out", "other"], []], ids=["out", "no_out"])
def test_a_folder_under_a_lock_taken_meanwhile_is_refused_and_left_as_it_was(
    tmp_path, monkeypatch, flags):
  """The check once the run holds its locks (a job that took its lock after the check before
  jax): nothing of the refused run is left, not even the folders it created (its new run
  folder and ``runs`` too, with --checkpoint-dir alone; the checkpoint folder's parents)."""
  monkeypatch.chdir(tmp_path)
  running = tmp_path / "running"
  running.mkdir()
  checkpoint_dir = running / "sub" / "checkpoints"
  held = run_lock.RunLock.acquire(running)
  try:
    args = cli.parse_args([*flags, "--checkpoint-dir", str(checkpoint_dir)])
    with contextlib.ExitStack() as stack, pytest.raises(
        cli.UsageError, match=f"^--checkpoint-dir {checkpoint_dir} is in use by another"
        f" run .*pid {os.getpid()}"):
      run_folder.prepare(args, held=stack)
  finally:
    held.release()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["running"]
  assert list(running.iterdir()) == []


def _runs_in_a_running_folder(tmp_path: pathlib.Path, how: str) -> pathlib.Path:
  """The working directory whose ``runs`` lies in the folder ``tmp_path/running``: that
  folder itself (``inside``), or one whose ``runs`` is a symbolic link into it (``link``)."""
  running = tmp_path / "running"
  running.mkdir()
  if how == "inside":
    return running
  (running / "kept").mkdir()
  work = tmp_path / "work"
  work.mkdir()
  (work / "runs").symlink_to(running / "kept")
  return work


_RUNS_IN_USE = "runs (where a run without --out goes) is in the folder of another run"


@pytest.mark.parametrize("how", ["inside", "link"])
@pytest.mark.parametrize("flags", [[], ["--resume", "auto"], ["--checkpoint-dir", "ck"]],
                         ids=["fresh", "resume_auto", "checkpoint_dir"])
def test_no_out_where_runs_is_in_a_running_jobs_folder(tmp_path, how, flags):
  """No --out, and ``runs`` (where the new run folder would go) in a running job's folder: exit
  2 at once naming ``runs`` and the holder, not a --out the user never passed; nothing
  created in that folder."""
  work = _runs_in_a_running_folder(tmp_path, how)
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  held = run_lock.RunLock.acquire(tmp_path / "running")
  try:
    started = time.monotonic()
    result = job(tmp_path, *h.TINY, "--steps", "2", *flags, cwd=work)
    elapsed = time.monotonic() - started
  finally:
    held.release()
  usage_error(result, _RUNS_IN_USE, f"pid {os.getpid()}", f"lock {held.path}",
              "pass --out naming a folder outside it")
  assert elapsed < 5, elapsed  # before jax is imported
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")
                if not p.name.startswith("log-")) == before


@pytest.mark.parametrize("how", ["inside", "link"])
@pytest.mark.parametrize("flags", [[], ["--checkpoint-dir", "ck"]], ids=["fresh", "checkpoint_dir"])
def test_no_out_where_runs_is_in_a_folder_locked_meanwhile(tmp_path, monkeypatch, how, flags):
  """The same once the run holds its locks (the other run took its lock after the check
  before jax): the new run folder, and ``runs``, are removed again."""
  work = _runs_in_a_running_folder(tmp_path, how)
  monkeypatch.chdir(work)
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  held = run_lock.RunLock.acquire(tmp_path / "running")
  try:
    with contextlib.ExitStack() as stack, pytest.raises(
        cli.UsageError, match=f"^{re.escape(_RUNS_IN_USE)} .*lock {held.path}"):
      run_folder.prepare(cli.parse_args(flags), held=stack)
  finally:
    held.release()
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_of_two_runs_whose_folders_nest_the_later_to_lock_is_refused(tmp_path):
  """A run (``--out X``) that takes its lock after another (``--checkpoint-dir X/ck``) took
  its own, which saw no lock above: refused once it holds its lock, naming the lock under X,
  and nothing of it left. The other order is test_a_folder_under_a_lock_taken_meanwhile_..."""
  outer = tmp_path / "x"
  (outer / "ck").mkdir(parents=True)
  inner = run_lock.RunLock.acquire(outer / "ck", "--checkpoint-dir")
  try:
    with contextlib.ExitStack() as stack, pytest.raises(
        cli.UsageError, match=f"^--out {outer} holds the folder of another run .*pid"
        f" {os.getpid()}.*lock {inner.path}\\): wait for it to end, or choose another --out"):
      run_folder.prepare(cli.parse_args(["--out", str(outer)]), held=stack)
  finally:
    inner.release()
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == [
      pathlib.Path("x"), pathlib.Path("x/ck")]


def test_a_folder_holding_a_running_jobs_folder_is_refused_at_once(run, tmp_path):
  """--out of a folder in which a running job's checkpoint folder lies: exit 2 at once (before
  jax) naming that job's lock; its checkpoints stay as they are."""
  before = hashes(run)
  held = run_lock.RunLock.acquire(run / "checkpoints", "--checkpoint-dir")
  try:
    started = time.monotonic()
    result = job(tmp_path, *RUN, "--steps", "6", "--resume", "--out", str(run))
    elapsed = time.monotonic() - started
  finally:
    held.release()
  usage_error(result, f"--out {run} holds the folder of another run", f"pid {os.getpid()}",
              f"lock {held.path}")
  assert elapsed < 5, elapsed
  assert hashes(run) == before


def test_a_lock_above_or_below_a_folder_is_its_holders(tmp_path):
  """run_lock.refuse_if_held: the folder, or any folder above it, locked by a live run (in
  use), or a folder under it (it holds that run's folder); a lock of this run's (``own``) or
  of a run that is gone does not count."""
  outer = tmp_path / "a"
  deep = outer / "b" / "c"
  deep.mkdir(parents=True)
  lock = run_lock.RunLock.acquire(outer)
  try:
    for folder in (outer, deep, outer / "not-yet"):
      with pytest.raises(cli.UsageError, match=f"in use by another run.*lock {lock.path}"):
        run_lock.refuse_if_held("--checkpoint-dir", str(folder))
    run_lock.refuse_if_held("--out", str(deep), own=[lock.path])
    with pytest.raises(cli.UsageError, match=f"^--out {tmp_path} holds the folder of another"
                       f" run .*lock {lock.path}"):
      run_lock.refuse_if_held("--out", str(tmp_path))
    run_lock.refuse_if_held("--out", str(tmp_path), own=[lock.path])
  finally:
    lock.release()
  dead = subprocess.Popen(["true"])
  dead.wait()
  _write_lock(outer, pid=dead.pid)
  run_lock.refuse_if_held("--out", str(deep))
  run_lock.refuse_if_held("--out", str(tmp_path))


def _write_lock(folder: pathlib.Path, **fields) -> pathlib.Path:
  holder = {"host": run_lock.socket.gethostname(), "pid": os.getpid(), "started": None,
            "since": time.time(), **fields}
  path = folder / run_lock.LOCK_NAME
  path.write_text(json.dumps(holder))
  return path


def test_run_lock_takes_over_a_lock_whose_holder_is_gone(tmp_path):
  dead = subprocess.Popen(["true"])  # a pid that has ended
  dead.wait()
  warnings = []
  _write_lock(tmp_path, pid=dead.pid)
  lock = run_lock.RunLock.acquire(tmp_path, warn=warnings.append)
  assert len(warnings) == 1 and f"pid {dead.pid}" in warnings[0] and "gone" in warnings[0]
  assert json.loads((tmp_path / run_lock.LOCK_NAME).read_text())["pid"] == os.getpid()
  with pytest.raises(cli.UsageError, match=f"pid {os.getpid()}"):
    run_lock.RunLock.acquire(tmp_path)  # held by a live process (this one)
  lock.release()
  assert not (tmp_path / run_lock.LOCK_NAME).exists()


def test_run_lock_of_another_host_is_stale_only_without_heartbeat(tmp_path):
  path = _write_lock(tmp_path, host="elsewhere", pid=1)
  with pytest.raises(cli.UsageError, match="host elsewhere, pid 1"):
    run_lock.RunLock.acquire(tmp_path)
  old = time.time() - run_lock.STALE_AFTER_S - 5
  os.utime(path, (old, old))
  warnings = []
  run_lock.RunLock.acquire(tmp_path, warn=warnings.append).release()
  assert len(warnings) == 1 and "no heartbeat" in warnings[0]
  (tmp_path / run_lock.LOCK_NAME).write_text("{not json")
  warnings.clear()
  run_lock.RunLock.acquire(tmp_path, warn=warnings.append).release()
  assert len(warnings) == 1 and "unreadable" in warnings[0]


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  when = time.time()
  (first, made_first), (second, made_second) = (
      run_claim.claim_new(run_claim.new_name(now=when)) for _ in range(2))
  assert first != second and first.is_dir() and second.is_dir()
  assert second.name == first.name + "-2"
  assert made_first == ["runs", str(first)] and made_second == [str(second)]


def test_shared_checkpoint_dir_without_out(tmp_path, monkeypatch):
  """--checkpoint-dir alone (as the SLURM script's shared one): it decides."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "shared" / "7").mkdir(parents=True)
  resumed = cli.parse_args(["--resume", "--checkpoint-dir", "shared"])
  assert run_folder.prepare(resumed) == (True, None) and resumed.out.startswith("runs/lm-")
  with pytest.raises(cli.UsageError, match=r"--checkpoint-dir shared already holds a run"
                     r" \(checkpoint steps \[7\]\): pass --resume"):  # no run folder's metrics
    run_folder.prepare(cli.parse_args(["--checkpoint-dir", "shared"]))
  with pytest.raises(cli.UsageError, match="nothing to resume: empty"):
    run_folder.prepare(cli.parse_args(["--resume", "--checkpoint-dir", "empty"]))
  assert len(list((tmp_path / "runs").iterdir())) == 1  # only the resumed run's folder


def test_cluster_scripts_resume_auto():
  for script in ("slurm.sbatch", "k8s-indexed-job.yaml", "tpu_pod.sh"):
    command = (h.ROOT / "launch" / "scripts" / script).read_text()
    assert "launch.train" in command and "--resume auto" in command, script


def test_the_tpu_script_installs_what_its_bucket_needs():
  """tpu_pod.sh keeps the checkpoints in a gs:// bucket: it installs the gcs extra, which names
  the package the job needs for gs:// (path_checks.url_packages); it installed neither."""
  extras = tomllib.loads((h.ROOT / "pyproject.toml").read_text())["project"][
      "optional-dependencies"]
  assert path_checks.url_packages("gs")[0] in extras["gcs"]
  script = (h.ROOT / "launch" / "scripts" / "tpu_pod.sh").read_text()
  assert 'OUT="${OUT:-gs://' in script and "pip install -q -e '.[gcs]'" in script


def _tpu_script_command(tmp_path, args: list[str], **env: str) -> list[str]:
  """The words of the command tpu_pod.sh would run on every worker, given ``args`` and the
  variables ``env`` (a fake gcloud on PATH writes it down)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "gcloud"
  fake.write_text('#!/usr/bin/env bash\nwhile (( $# )); do [[ $1 == --command ]] &&'
                  f' printf %s "$2" > {tmp_path / "command"}; shift; done\n')
  fake.chmod(0o755)
  env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TPU_NAME": "pod",
         "ZONE": "z", **env}
  subprocess.run(["bash", str(h.ROOT / "launch" / "scripts" / "tpu_pod.sh"), *args],
                 env=env, check=True, timeout=60)
  return shlex.split((tmp_path / "command").read_text())


@pytest.mark.parametrize("args", [[], ["--mesh", "data=-1,model=4", "--config", "my run.toml"]],
                         ids=["no_arguments", "arguments"])
def test_the_tpu_script_passes_its_arguments_to_every_worker(tmp_path, args):
  """With no arguments the script passed an empty one (printf '%q ' of nothing is ''): every
  worker's job exited 2 ('unrecognized arguments')."""
  command = _tpu_script_command(tmp_path, args)
  job_args = command[command.index("launch.train") + 1:]
  assert job_args[job_args.index("--resume"):] == ["--resume", "auto", *args]


@pytest.mark.parametrize("bucket", ["gs://b/run-1", "gs://b/run 2's"], ids=["plain", "quoted"])
def test_the_tpu_script_keeps_a_run_folder_per_bucket_path(tmp_path, bucket):
  """Every run used /tmp/shardopt-run: a run for another $OUT met the first run's metrics there
  and was refused ('already holds a run'). The run folder now follows $OUT, and both paths
  reach the job as one argument each."""
  command = _tpu_script_command(tmp_path, [], OUT=bucket)
  out = command[command.index("--out") + 1]
  assert command[command.index("--checkpoint-dir") + 1] == f"{bucket}/checkpoints"
  assert out == "/tmp/shardopt-runs/" + re.sub(r"[^A-Za-z0-9._-]", "_", bucket)


def test_the_slurm_script_runs_one_task_per_gpu():
  """jax.distributed gives each SLURM process the one GPU of its SLURM_LOCALID: with one task
  per node, 7 of every node's 8 GPUs stood idle."""
  script = (h.ROOT / "launch" / "scripts" / "slurm.sbatch").read_text()
  tasks = re.search(r"^#SBATCH --ntasks-per-node=(\d+)$", script, re.M)
  gpus = re.search(r"^#SBATCH --gpus-per-node=(\d+)$", script, re.M)
  assert tasks and gpus and tasks.group(1) == gpus.group(1)
  assert '--out "runs/${SLURM_JOB_NAME}" --resume auto' in script  # one folder per job name


def test_metrics_are_strict_json(tmp_path):
  path = tmp_path / "metrics.jsonl"
  report.append_metrics(path, {"step": 1, "loss": math.nan, "lr": math.inf})
  assert path.read_text() == '{"step": 1, "loss": null, "lr": null}\n'


# Jobs that train ------------------------------------------------------------

@pytest.mark.slow
def test_resume_auto_starts_fresh_and_says_so(tmp_path):
  out = tmp_path / "new"
  result = job(tmp_path, *RUN, "--steps", "1", "--resume", "auto", "--out", str(out))
  assert result.code == 0, result.err[-2000:]
  assert f"--resume auto: no checkpoint in {out}/checkpoints: starting fresh" in result.out
  assert [r["step"] for r in records(out)] == [1]


@pytest.mark.slow
@pytest.mark.parametrize("resume,earlier", [
    (["--resume", "auto"], ["metrics.jsonl", "samples.jsonl"]), ([], ["samples.jsonl"])],
    ids=["resume_auto", "fresh"])
def test_a_fresh_start_keeps_every_log_file_of_an_earlier_one(tmp_path, resume, earlier):
  """A fresh start (--resume auto finding no checkpoint, or a run without --resume) in a folder
  holding an earlier start's log files sets each aside as <name>.before-1.jsonl, byte for byte
  (samples.jsonl was truncated to the new run's records while metrics.jsonl was kept)."""
  out = tmp_path / "run"
  out.mkdir()
  for name in earlier:
    report.append_metrics(out / name, {"step": 1, "loss": 6.0, "prompt": "a", "continuation": "b"})
    report.append_metrics(out / name, {"step": 2, "loss": 5.0, "prompt": "a", "continuation": "c"})
  before = {name: (out / name).read_bytes() for name in earlier}
  result = job(tmp_path, *RUN, "--steps", "1", *resume, "--out", str(out))
  assert result.code == 0, result.err[-2000:]
  kept = [name.replace(".jsonl", ".before-1.jsonl") for name in earlier]
  assert f"(the earlier run's log files kept as {', '.join(kept)})" in result.out, result.out
  for name, new in zip(earlier, kept):
    assert (out / new).read_bytes() == before[name]
  assert [r["step"] for r in records(out)] == [1]
  assert [r["step"] for r in report.read_metrics(out / "samples.jsonl")] == [1]


@pytest.mark.slow
def test_a_resume_entering_the_profile_window_partway_traces_from_its_first_step(run, tmp_path):
  """Resumed at step 4 with --profile-steps 3:6: steps 5-6 are traced and the folder named;
  a resume past its window (2:3 from step 6) says so in one line and writes no trace."""
  result = job(tmp_path, *RUN, "--steps", "6", "--resume", "--out", str(run),
               "--profile-steps", "3:6")
  assert result.code == 0, result.err[-2000:]
  traces = list((run / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and f"profile of steps 5-6: {traces[0].parent}" in result.out
  result = job(tmp_path, *RUN, "--steps", "7", "--resume", "--out", str(run),
               "--profile-steps", "2:3")
  assert result.code == 0, result.err[-2000:]
  assert ("warning: --profile-steps 2:3: this invocation starts at step 7, after the window:"
          " no trace") in result.out.splitlines()
  assert list((run / "plugins" / "profile").glob("*/*.xplane.pb")) == traces


@pytest.mark.slow
def test_resume_onto_another_mesh_is_allowed_and_printed(run, tmp_path):
  """Equal to the uninterrupted run within float32 rounding (not bit for bit)."""
  shutil.rmtree(run / "checkpoints" / "4")  # resume at 2: steps 3-4 have a reference
  kept, first = step_files(run, [2]), records(run)
  result = job(tmp_path, *RUN, "--steps", "4", "--resume", "auto", "--out", str(run),
               "--mesh", "data=8,model=1")
  assert result.code == 0, result.err[-2000:]
  changes = [line for line in result.out.splitlines() if line.startswith("resume: changed")]
  assert len(changes) == 1 and "--mesh data=4,model=2 -> data=8,model=1" in changes[0]
  assert "resumed from step 2" in result.out
  assert step_files(run, [2]) == kept
  now = records(run)
  assert now[:2] == first[:2] and [r["step"] for r in now] == [1, 2, 3, 4]
  np.testing.assert_array_max_ulp(np.float32([r["loss"] for r in now[2:]]),
                                  np.float32([r["loss"] for r in first[2:]]), maxulp=2)


@pytest.mark.slow
def test_deleted_step_folder_resumes_from_the_one_before(run, tmp_path):
  shutil.rmtree(run / "checkpoints" / "4")
  kept, first = step_files(run, [2]), records(run)
  result = job(tmp_path, *RUN, "--steps", "3", "--resume", "--out", str(run))
  assert result.code == 0, result.err[-2000:]
  assert "resumed from step 2" in result.out
  assert step_files(run, [2]) == kept
  now = records(run)
  assert now[:2] == first[:2] and [r["step"] for r in now] == [1, 2, 3]
  assert now[2]["loss"] == first[2]["loss"]  # same mesh: bit-identical to the first run


def _damage_newest(run: pathlib.Path) -> dict[pathlib.Path, bytes]:
  """Flips 64 bytes in the middle of every array data file of step 4 (not
  every data file holds bytes the restore reads); returns the damaged bytes."""
  damaged = {}
  for path in (run / "checkpoints" / "4" / "state").rglob("d/*"):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    path.write_bytes(bytes(data))
    damaged[path.relative_to(run / "checkpoints" / "4")] = bytes(data)
  assert damaged
  return damaged


def test_every_checkpoint_damaged(run, tmp_path):
  for step in (2, 4):
    shutil.rmtree(run / "checkpoints" / str(step) / "state")
  before = hashes(run)
  usage_error(job(tmp_path, *RUN, "--steps", "6", "--resume", "--out", str(run)),
              "--resume: no checkpoint in", "reads back", "step 4:", "step 2:",
              "nothing was changed")
  assert hashes(run) == before


def test_resume_auto_with_the_data_files_of_every_step_missing_changes_nothing(run, tmp_path):
  """A filesystem that lags or is not mounted: no fresh start over the run. Missing files are
  waited for (resume.RETRY_MISSING_S) before the verdict."""
  for path in (run / "checkpoints").glob("*/state/**/d/*"):
    path.unlink()
  before = hashes(run)
  start = time.monotonic()
  result = job(tmp_path, *RUN, "--steps", "6", "--resume", "auto", "--out", str(run))
  usage_error(result, "--resume auto: no checkpoint in", "step 4:", "step 2:", "nothing was changed")
  assert "trying again" in result.out and time.monotonic() - start > sum(resume.RETRY_MISSING_S)
  assert hashes(run) == before  # nothing renamed, no metrics set aside, nothing trained


@pytest.mark.slow
def test_corrupt_newest_checkpoint_falls_back_with_a_warning(run, tmp_path):
  damaged = _damage_newest(run)
  kept, first = step_files(run, [2]), records(run)
  result = job(tmp_path, *RUN, "--steps", "5", "--resume", "--out", str(run))
  assert result.code == 0, result.err[-2000:]
  warnings = [line for line in result.out.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and "checkpoint step 4" in warnings[0], result.out[-3000:]
  assert "resumed from step 2" in warnings[0] and "kept as 4.damaged" in warnings[0]
  assert "restore_latest_valid" not in warnings[0]  # an API the CLI user cannot call
  assert "Traceback" not in result.err
  assert step_files(run, [2]) == kept and records(run)[:2] == first[:2]
  for path, data in damaged.items():
    assert (run / "checkpoints" / "4.damaged" / path).read_bytes() == data
  assert h.checkpoint_steps(run / "checkpoints") == [2, 4, 5]  # step 4 trained and saved again
  assert [r["step"] for r in records(run)] == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_non_finite_loss_stops_with_exit_3_and_saves_nothing_of_it(tmp_path):
  out = tmp_path / "run"
  result = job(tmp_path, *RUN, "--optimizer", "sgd", "--lr", "1e30", "--clip-norm", "0",
               "--steps", "8", "--checkpoint-every", "1", "--out", str(out))
  assert result.code == 3, result.err[-2000:]
  message = result.err.strip().splitlines()[-1]
  assert message.startswith("error: non-finite") and "--skip-nonfinite" in message
  bad_step = int(re.search(r"(?:at|after) step (\d+):", message).group(1))
  assert all(math.isfinite(r["loss"]) for r in records(out))
  assert all(step < bad_step for step in h.checkpoint_steps(out / "checkpoints"))


def test_a_non_finite_state_after_a_finite_loss_is_not_saved(tmp_path):
  """--eps 0: Adam's first update divides 0 by 0 where a gradient is 0 (the embedding rows of
  bytes not in the batch), so the params after step 1 hold NaN while step 1's loss is finite:
  the check of the state before the save stops the job (launch/validation.py's check_state)."""
  out = tmp_path / "run"
  result = job(tmp_path, *h.TINY, "--optimizer", "adam", "--lr", "0.001", "--eps", "0",
               "--steps", "3", "--checkpoint-every", "1", "--eval-every", "0", "--out", str(out))
  assert result.code == 3, result.err[-2000:]
  message = result.err.strip().splitlines()[-1]
  assert message.startswith("error: non-finite params or optimizer state after step 1: stopped"
                            " without saving it"), message
  metrics = records(out)  # strict JSON: the non-finite norms are null
  assert [r["step"] for r in metrics] == [1] and math.isfinite(metrics[0]["loss"])
  assert h.checkpoint_steps(out / "checkpoints") == []


@pytest.mark.slow
def test_skip_nonfinite_counts_skipped_steps(tmp_path):
  out = tmp_path / "run"
  result = job(tmp_path, *RUN, "--optimizer", "sgd", "--lr", "1e30", "--clip-norm", "0",
               "--steps", "4", "--skip-nonfinite", "--out", str(out))
  assert result.code == 0, result.err[-2000:]
  metrics = records(out)  # strict JSON: the non-finite losses are null
  skipped = [r["step"] for r in metrics if r["skipped"]]
  assert skipped and all(r["loss"] is None for r in metrics if r["skipped"])
  assert metrics[-1]["skipped_steps"] == len(skipped)
  assert h.checkpoint_steps(out / "checkpoints") == [2, 4]


@pytest.mark.slow
def test_sigkill_during_a_save_then_a_full_restart(tmp_path):
  out, log = tmp_path / "run", tmp_path / "log"
  proc = h.start(["launch.train", *RUN, "--steps", "60", "--checkpoint-every", "1",
                  "--out", str(out)], log)
  try:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
      saving = run_contents.unfinished_saves(out / "checkpoints")
      if saving and len(run_contents.finalized_steps(out / "checkpoints")) >= 2:
        os.killpg(proc.pid, signal.SIGKILL)
        break
      time.sleep(0.005)
    assert proc.wait(timeout=60) == -signal.SIGKILL, "no save was in flight to kill"
  finally:
    h.stop(proc)
  done = run_contents.finalized_steps(out / "checkpoints")
  kept, first = step_files(out, done), records(out)
  result = job(tmp_path, *RUN, "--steps", str(done[-1] + 1), "--resume", "--out", str(out))
  assert result.code == 0, result.err[-2000:]
  assert f"resumed from step {done[-1]}" in result.out
  assert step_files(out, done) == kept
  now = records(out)
  assert now[:done[-1]] == first[:done[-1]] and now[-1]["step"] == done[-1] + 1


def _metrics_without_time(folder: pathlib.Path) -> list[dict]:
  """The records, without the fields that measure time (step time, tokens/s, MFU, wall time)."""
  timing = {"time", "step_time", "tokens_per_s", "mfu"}
  return [{k: v for k, v in r.items() if k not in timing} for r in records(folder)]


@pytest.mark.slow
def test_two_jobs_on_one_out(trained, tmp_path):
  """The second exits 2 at once, naming the first; the first's run is that of a run alone."""
  out = tmp_path / "run"  # the same folder name as the trained run: the plot's title holds it
  first = h.start(["launch.train", *RUN, "--steps", "4", "--out", str(out)], tmp_path / "first")
  try:
    deadline = time.monotonic() + TIMEOUT
    while not (out / run_lock.LOCK_NAME).exists():
      assert first.poll() is None and time.monotonic() < deadline, "the first job never started"
      time.sleep(0.05)
    started = time.monotonic()
    second = job(tmp_path, *RUN, "--steps", "4", "--out", str(out))
    elapsed = time.monotonic() - started
    assert first.wait(timeout=TIMEOUT) == 0
  finally:
    h.stop(first)
  usage_error(second, f"--out {out} is in use by another run", f"pid {first.pid}", "since")
  assert elapsed < 5, elapsed
  assert _metrics_without_time(out) == _metrics_without_time(trained)
  assert h.checkpoint_steps(out / "checkpoints") == h.checkpoint_steps(trained / "checkpoints")
  assert (out / "loss.png").read_bytes() == (trained / "loss.png").read_bytes()
  assert not (out / run_lock.LOCK_NAME).exists()


@pytest.mark.slow
def test_a_torn_last_metrics_line_is_set_aside_and_the_resume_proceeds(run, tmp_path):
  """A crash while a line was written (a full disk): it is kept beside the file, not parsed."""
  torn = b'{"step": 5, "loss": 3.1537744998931'
  whole = (run / "metrics.jsonl").read_bytes()
  with open(run / "metrics.jsonl", "ab") as f:
    f.write(torn)
  result = job(tmp_path, *RUN, "--steps", "5", "--resume", "--out", str(run))
  assert result.code == 0, result.err[-2000:]
  warnings = [line for line in result.out.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and "torn line" in warnings[0] and "metrics.jsonl.torn-1" in warnings[0]
  assert (run / "metrics.jsonl.torn-1").read_bytes() == torn
  assert [r["step"] for r in records(run)] == [1, 2, 3, 4, 5]  # each step once
  assert (run / "metrics.jsonl").read_bytes().startswith(whole)


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before_the_run_started", "before_step_1"])
def test_a_signal_before_step_1_leaves_nothing_the_run_created(tmp_path, when):
  """SIGTERM before step 1 of a new run whose --out and --checkpoint-dir are new folders in new
  folders: all of them are removed (the run folder was, its parents and the checkpoint folder
  were left). Sent as soon as the run folder exists (a single-process run creates it before it
  imports jax), or once the job has printed its header (the folder settled)."""
  out, checkpoint_dir = tmp_path / "np" / "sub" / "run", tmp_path / "ck" / "a"
  log = tmp_path / "log"
  proc = h.start(["launch.train", *RUN, "--steps", "4", "--out", str(out), "--checkpoint-dir",
                  str(checkpoint_dir)], log)
  ready = ((lambda: out.exists()) if when == "before_the_run_started" else
           (lambda: "per-device memory plan" in log.read_text()))
  try:
    deadline = time.monotonic() + TIMEOUT
    while not ready():  # step 1 is seconds away (it compiles)
      assert proc.poll() is None and time.monotonic() < deadline, "the job never started"
      time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=TIMEOUT) == 0
  finally:
    h.stop(proc)
  said = log.read_text().strip().splitlines()[-1]
  removed = (f"stopped by signal 15 before step 1: nothing trained; removed the new run folder"
             f" {out} and the folders created for it: {checkpoint_dir}, {checkpoint_dir.parent},"
             f" {out.parent}, {out.parent.parent}")
  if when == "before_step_1":
    assert said == removed, said
  else:  # most likely still importing jax
    assert said in (removed, "stopped by signal 15 before the run started: nothing was created")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["log", "log.stderr"]


@pytest.mark.slow
def test_a_second_signal_stops_at_once_and_says_so(tmp_path):
  out, log = tmp_path / "run", tmp_path / "log"
  proc = h.start(["launch.train", *RUN, "--steps", "400", "--checkpoint-every", "1", "--out",
                  str(out)], log)
  try:
    h.wait_for_steps(out, 2, proc, TIMEOUT)
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.3)  # two signals pending at once are one to Python
    os.killpg(proc.pid, signal.SIGTERM)
    code = proc.wait(timeout=TIMEOUT)
  finally:
    h.stop(proc)
  err = pathlib.Path(f"{log}.stderr").read_text().strip().splitlines()
  assert code == 128 + signal.SIGTERM, (code, err[-5:])
  assert len(err) == 1 and err[0].startswith("error: stopped at once by a second signal (SIGTERM)")
  assert not (out / run_lock.LOCK_NAME).exists()  # released on the way out


@contextlib.contextmanager
def small_filesystem(where: pathlib.Path, size: str):
  """A tmpfs of ``size`` mounted at ``where`` (root only; else the test is skipped)."""
  where.mkdir()
  mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         check=False, capture_output=True)
  if mount.returncode:
    pytest.skip(f"no tmpfs to fill: {mount.stderr!r}")
  try:
    yield where
  finally:
    subprocess.run(["umount", "-l", str(where)], check=True)


def _fill(disk: pathlib.Path, leave: int) -> None:
  """Writes ``disk/filler`` until less than ``leave`` bytes are free (the job writes too)."""
  with open(disk / "filler", "wb") as f:
    while True:
      stats = os.statvfs(disk)
      if stats.f_bavail * stats.f_frsize < leave:
        return
      try:
        f.write(b"\0" * (32 * 1024))
        f.flush()
      except OSError:
        return


@pytest.mark.slow
def test_a_disk_filled_mid_run_stops_with_one_line_and_resume_continues(tmp_path):
  """The tmpfs is filled while the job trains: one error line naming the path and the newest
  complete checkpoint (exit 4); after space is freed, --resume recomputes the steps after it
  bit for bit (their losses were written before the failure)."""
  with small_filesystem(tmp_path / "disk", "48m") as disk:
    out, log = disk / "run", tmp_path / "log"
    proc = h.start(["launch.train", *RUN, "--steps", "400", "--checkpoint-every", "1",
                    "--out", str(out)], log)
    try:
      h.wait_for_steps(out, 2, proc, TIMEOUT)
      # Saves are asynchronous: on a loaded machine step 2 can be logged before any is final.
      h.wait_for_checkpoint(out / "checkpoints", proc, TIMEOUT)
      _fill(disk, leave=128 * 1024)  # room for a few metrics lines, not for a checkpoint
      code = proc.wait(timeout=TIMEOUT)
    finally:
      h.stop(proc)
    err = pathlib.Path(f"{log}.stderr").read_text().strip().splitlines()
    done = h.checkpoint_steps(out / "checkpoints")
    assert code == 4, (code, err[-5:])
    assert len(err) == 1 and err[0].startswith("error: "), err[-10:]
    assert str(out) in err[0] and f"newest complete checkpoint is step {done[-1]}" in err[0]
    logged = [r for r in records(out) if r["step"] > done[-1]]
    (disk / "filler").unlink()
    result = job(tmp_path, *RUN, "--steps", str(logged[-1]["step"]) if logged else str(done[-1] + 1),
                 "--resume", "--out", str(out))
    assert result.code == 0, result.err[-2000:]
    assert f"resumed from step {done[-1]}" in result.out
    again = {r["step"]: r["loss"] for r in records(out)}
    assert logged and all(again[r["step"]] == r["loss"] for r in logged)


def test_a_lock_that_is_a_folder_is_refused_and_left_as_it_is(tmp_path):
  """A run.lock that no run wrote (a folder): exit 2, one line naming it, the folder as it was
  (it was exit 1, a raw IsADirectoryError, with the folder renamed to .run.lock.stale.<uuid>)."""
  out = tmp_path / "run"
  (out / run_lock.LOCK_NAME).mkdir(parents=True)
  (out / run_lock.LOCK_NAME / "kept").write_text("the user's")
  before = hashes(out)
  usage_error(job(tmp_path, *h.TINY, "--steps", "2", "--out", str(out)),
              f"--out {out}: its lock {out / run_lock.LOCK_NAME} is a folder, not a lock file")
  assert hashes(out) == before and sorted(p.name for p in out.iterdir()) == [run_lock.LOCK_NAME]


def test_a_full_disk_when_the_lock_is_created_stops_with_exit_4_leaving_nothing(tmp_path):
  """The disk is full when the run folder's lock file is written: exit 4 (a file of the run
  could not be written), one line naming the lock file; the folders made for it are removed
  and no draft of the lock is left (it was exit 1, `error: OSError: [Errno 28] ...`, with an
  empty .run.lock.<uuid> in the new folder)."""
  with small_filesystem(tmp_path / "disk", "1m") as disk:
    _fill(disk, leave=1)
    out = disk / "new" / "run"
    result = job(tmp_path, *h.TINY, "--steps", "2", "--out", str(out))
    lines = result.err.strip().splitlines()
    assert result.code == 4, (result.code, lines[-5:])
    assert len(lines) == 1 and lines[0].startswith(
        f"error: --out {out}: cannot write its lock file {out / run_lock.LOCK_NAME} (No space"
        " left on device)"), lines
    assert sorted(p.name for p in disk.iterdir()) == ["filler"]


@pytest.mark.slow
def test_a_disk_filled_before_any_checkpoint_advises_what_works(tmp_path):
  """The disk fills before the first checkpoint: the line says there is no complete checkpoint
  and advises --resume auto (it advised --resume, which then failed with 'nothing to resume');
  after space is freed that command starts afresh, the metrics written kept beside."""
  with small_filesystem(tmp_path / "disk", "48m") as disk:
    out, log = disk / "run", tmp_path / "log"
    flags = [*h.TINY, "--checkpoint-every", "1000", "--out", str(out)]
    proc = h.start(["launch.train", *flags, "--steps", "400"], log)
    try:
      h.wait_for_steps(out, 2, proc, TIMEOUT)
      _fill(disk, leave=1)
      code = proc.wait(timeout=TIMEOUT)
    finally:
      h.stop(proc)
    err = pathlib.Path(f"{log}.stderr").read_text().strip().splitlines()
    assert code == 4, (code, err[-5:])
    assert len(err) == 1 and "there is no complete checkpoint" in err[0], err
    assert err[0].endswith("then run again with --resume auto to start afresh in it (there is"
                           " nothing to resume; the metrics and samples written are kept as"
                           " *.before-N.jsonl)"), err[0]
    written = (out / "metrics.jsonl").read_bytes()
    (disk / "filler").unlink()
    result = job(tmp_path, *flags, "--steps", "2", "--resume", "auto")
    assert result.code == 0, result.err[-2000:]
    assert "starting fresh" in result.out
    assert (out / "metrics.before-1.jsonl").read_bytes() == written
    assert [r["step"] for r in records(out)] == [1, 2]
