"""Resumes that must take their flags from, and leave their folders as, the step and run they
name: damaged metadata of the newest step, --checkpoint-dir elsewhere than --out, errors found
after the restore, signals before step 1, keyword order. Each case runs the job in a
subprocess (tests/test_failure_modes.py's harness) on a copy of its small run: 4 steps,
checkpoints 2 and 4, a horizon of 8 so a resume may go to 8 steps."""

import json
import os
import pathlib
import shutil
import signal
import time

import pytest

from launch import run_config
from launch import run_contents
from tests import launch_helpers as h
from tests.test_failure_modes import RUN, TIMEOUT, _damage_newest, hashes, job, usage_error
from tests.test_failure_modes import run, trained  # noqa: F401  (fixtures: a copy of one run)


def _edit_saved_config(run: pathlib.Path, step: int, **changes) -> None:
  """Rewrites fields of the config saved with ``step`` (its digest left as it was: damage)."""
  path = run / "checkpoints" / str(step) / "metadata" / "metadata"
  metadata = json.loads(path.read_text())
  metadata["config"].update(changes)
  path.write_text(json.dumps(metadata))


@pytest.mark.parametrize("field,value", [("seed", 1), ("mesh", "data=8,model=1"),
                                         ("keep_checkpoints", 1)])
def test_damaged_metadata_of_the_newest_step_gives_no_flags(run, field, value):
  """The flags a resume takes come from the newest step whose metadata its record vouches for:
  a changed seed, mesh or keep_checkpoints in step 4's metadata leaves step 2's."""
  _edit_saved_config(run, 4, **{field: value})
  config, step = run_contents.saved_config(run / "checkpoints")
  assert step == 2 and config[field] != value


@pytest.mark.parametrize("resume", [["--resume"], ["--resume", "auto"]], ids=["required", "auto"])
def test_a_resume_passes_over_a_newest_step_whose_metadata_is_damaged(run, tmp_path, resume):
  """A flipped seed in step 4's metadata (was: exit 2, '--seed 0 -> 1', a flag never given):
  step 4 is set aside with one warning and the run resumes from step 2 with step 2's flags."""
  _edit_saved_config(run, 4, seed=1, keep_checkpoints=1)
  result = job(tmp_path, "--out", str(run), *resume, "--steps", "6")
  assert result.code == 0, result.err[-2000:]
  assert "resumed from step 2" in result.out
  assert "the damaged step is kept as 4.damaged" in result.out
  assert "--seed" not in result.out + result.err
  changed = [line for line in result.out.splitlines() if line.startswith("resume: changed")]
  assert len(changed) == 1 and "--steps 4 -> 6" in changed[0], changed
  assert h.checkpoint_steps(run / "checkpoints") == [2, 4, 6]  # keep_checkpoints 100, not 1


def test_opt_keywords_in_another_order_are_no_change():
  """The same --opt keywords in another order (was refused: '--opt [[..]] -> [[..]]')."""
  saved = {"opt": [["decay_rate", 0.9], ["clipping_threshold", 2.0]]}
  swapped = {"opt": [["clipping_threshold", 2.0], ["decay_rate", 0.9]]}
  assert run_config.compare(saved, swapped) == ([], [])
  refused, _ = run_config.compare(saved, {"opt": [["clipping_threshold", 3.0],
                                                  ["decay_rate", 0.9]]})
  assert refused == ["--opt decay_rate=0.9,clipping_threshold=2.0 ->"
                     " clipping_threshold=3.0,decay_rate=0.9"]  # was JSON: [["decay_rate", 0.9], ...]
  assert run_config.compare({"opt": []}, {"opt": [["b1", 0.8]]})[0] == ["--opt (none) -> b1=0.8"]


def test_the_coordinator_address_is_not_a_change_of_the_run():
  """The local launcher picks a new port each time: every resume listed 'resume: changed
  --coordinator 127.0.0.1:P1 -> 127.0.0.1:P2'."""
  saved = {"coordinator": "127.0.0.1:41001", "process_id": 0, "init_timeout": 60,
           "heartbeat_timeout": 10, "num_processes": 2}
  current = {**saved, "coordinator": "127.0.0.1:52002", "init_timeout": 30}
  assert run_config.compare(saved, current) == ([], [])


def test_a_bad_metrics_line_is_refused_before_a_damaged_step_is_set_aside(run, tmp_path):
  """A bad line 2 in metrics.jsonl and damaged step-4 data (was: step 4 renamed to 4.damaged,
  'resumed from step 2', then exit 2 naming the line): exit 2 with nothing changed."""
  _damage_newest(run)
  lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
  lines[1] = "not json\n"
  (run / "metrics.jsonl").write_text("".join(lines))
  before = hashes(run)
  result = job(tmp_path, "--out", str(run), "--resume", "--steps", "6")
  usage_error(result, "metrics.jsonl: line 2 is not a JSON record")
  assert "resumed from" not in result.out
  assert hashes(run) == before


def _signal_once_printed(args: list[str], log: pathlib.Path, text: str, again: bool) -> int:
  """Starts the job, sends SIGTERM once ``text`` is in its output (and, with ``again``, a
  second one 0.1 s later); its exit code."""
  proc = h.start(["launch.train", *args], log)
  try:
    deadline = time.monotonic() + TIMEOUT
    while text not in log.read_text():
      assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
      time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    if again:
      time.sleep(0.1)  # two signals pending at once are one to Python
      os.killpg(proc.pid, signal.SIGTERM)
    return proc.wait(timeout=TIMEOUT)
  finally:
    h.stop(proc)


def test_a_resume_stopped_before_its_first_step_leaves_the_folder_as_it_was(run, tmp_path):
  """Records past the newest checkpoint (a run killed after step 4, whose checkpoint 4 is gone),
  SIGTERM as the resume says 'resumed from step 2' (was: 'RUN is as it was' while
  metrics.jsonl had been cut to 2 records and a new event file written)."""
  shutil.rmtree(run / "checkpoints" / "4")
  before = hashes(run)
  log = tmp_path / "log"
  code = _signal_once_printed([*RUN, "--out", str(run), "--resume", "--steps", "6"], log,
                              "resumed from step 2", again=False)
  assert code == 0, pathlib.Path(f"{log}.stderr").read_text()[-2000:]
  said = log.read_text().strip().splitlines()[-1]
  assert said == (f"stopped by signal 15 before step 3: nothing trained or saved; {run} is as it"
                  " was (step 2)"), said
  assert hashes(run) == before


def test_a_signal_before_step_1_in_a_folder_given_leaves_it_as_it_was(tmp_path):
  """SIGTERM before step 1 of a new run in an existing --out (was: an empty checkpoints/ left
  in it, which this invocation had made): exit 0, the folder as it was, the line saying so."""
  out, log = tmp_path / "R", tmp_path / "log"
  out.mkdir()
  (out / "notes.txt").write_text("the user's")
  code = _signal_once_printed([*RUN, "--steps", "50", "--out", str(out)], log,
                              "per-device memory plan", again=False)
  assert code == 0, pathlib.Path(f"{log}.stderr").read_text()[-2000:]
  said = log.read_text().strip().splitlines()[-1]
  assert said == (f"stopped by signal 15 before step 1: nothing trained; {out} holds no run (no"
                  f" checkpoint, no metrics): a later run may use it; removed the folders created"
                  f" for it: {out / 'checkpoints'}"), said
  assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_second_signal_before_step_1_removes_what_the_run_created(tmp_path):
  """Two SIGTERMs before step 1 of a new run in new folders (was: exit 143, empty
  np/sub/RUN and ck left, nothing said): exit 143, one line saying what was removed."""
  out, checkpoint_dir, log = tmp_path / "np" / "sub" / "RUN", tmp_path / "ck", tmp_path / "log"
  code = _signal_once_printed([*RUN, "--steps", "50", "--out", str(out), "--checkpoint-dir",
                               str(checkpoint_dir)], log, "per-device memory plan", again=True)
  err = pathlib.Path(f"{log}.stderr").read_text().strip().splitlines()
  assert code == 128 + signal.SIGTERM, (code, err[-5:])
  assert len(err) == 1 and err[0] == (
      "error: stopped at once by a second signal (SIGTERM) after SIGTERM: no step was trained;"
      f" removed the folders it created: {checkpoint_dir}, {out}, {out.parent},"
      f" {out.parent.parent}"), err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["log", "log.stderr"]


def test_resume_auto_with_an_empty_checkpoint_dir_refuses_a_folder_holding_a_run(run, tmp_path):
  """--out RUN (its own checkpoints 2 and 4, 4 records) --checkpoint-dir OTHER (empty) --resume
  auto (was: exit 0 'no checkpoint in OTHER: starting fresh', RUN's metrics moved aside and a
  new run trained beside its checkpoints): refused as a fresh start there is, nothing changed."""
  before = hashes(run)
  other = tmp_path / "other"
  result = job(tmp_path, "--out", str(run), "--checkpoint-dir", str(other), "--resume", "auto",
               "--steps", "6")
  usage_error(result, f"--out {run}", "holds a run", f"--checkpoint-dir {other}")
  assert hashes(run) == before and not other.exists()


def test_resume_refuses_metrics_of_another_run_than_the_checkpoints(run, tmp_path):
  """--out RUN (its own run's metrics) --checkpoint-dir Q/checkpoints of another run (was: RUN's
  metrics trimmed and Q's steps appended: two runs in one file): refused naming both."""
  other = pathlib.Path(shutil.copytree(run, tmp_path / "q"))
  _edit_config_out(other, tmp_path / "elsewhere")
  before = hashes(run)
  result = job(tmp_path, "--out", str(run), "--checkpoint-dir", str(other / "checkpoints"),
               "--resume", "--steps", "6")
  usage_error(result, f"--out {run}", f"--checkpoint-dir {other / 'checkpoints'}",
              str(tmp_path / "elsewhere"))
  assert hashes(run) == before


def _edit_config_out(run: pathlib.Path, out: pathlib.Path) -> None:
  """The checkpoints of ``run`` as written by a run whose --out was ``out`` (digests kept
  true: the record vouches for the metadata)."""
  from checkpoints import digest  # pylint: disable=import-outside-toplevel
  for step in h.checkpoint_steps(run / "checkpoints"):
    folder = run / "checkpoints" / str(step)
    metadata = json.loads((folder / "metadata" / "metadata").read_text())
    layout = json.loads((folder / "layout" / "metadata").read_text())
    metadata["config"]["out"] = str(out)
    layout["digest"] = digest.digest(layout["leaves"], layout["checksums"], metadata,
                                     layout["seed"], layout.get("state_classes"))
    (folder / "metadata" / "metadata").write_text(json.dumps(metadata))
    (folder / "layout" / "metadata").write_text(json.dumps(layout))


def test_a_run_whose_checkpoints_lie_elsewhere_resumes(run, tmp_path):
  """The run's own --out and --checkpoint-dir apart: its resume goes on."""
  _edit_config_out(run, run)  # as this run wrote them
  checkpoint_dir = pathlib.Path(shutil.move(run / "checkpoints", tmp_path / "ck"))
  result = job(tmp_path, "--out", str(run), "--checkpoint-dir", str(checkpoint_dir), "--resume",
               "--steps", "6")
  assert result.code == 0, result.err[-2000:]
  assert "resumed from step 4" in result.out


def test_nothing_to_resume_names_the_checkpoint_dir_searched(run, tmp_path):
  """--out RUN --resume --checkpoint-dir OTHER (empty; RUN/checkpoints has steps): the message
  names OTHER, the folder searched (was: 'nothing to resume: RUN (no checkpoints; ...)')."""
  other = tmp_path / "other"
  other.mkdir()
  result = job(tmp_path, "--out", str(run), "--resume", "--checkpoint-dir", str(other))
  usage_error(result, f"nothing to resume: --checkpoint-dir {other} (no checkpoints)")


def test_the_launcher_names_resume_when_the_newest_run_is_in_use(tmp_path, monkeypatch):
  """local_multihost -- --resume without --out while the newest run is live (was: '--out
  runs/lm-... is in use ... or choose another --out', a flag the user never gave)."""
  from launch import local_multihost  # pylint: disable=import-outside-toplevel
  from launch import cli, run_lock  # pylint: disable=import-outside-toplevel
  newest = tmp_path / "runs" / "lm-20260101-000000"
  (newest / "checkpoints" / "2").mkdir(parents=True)
  monkeypatch.chdir(tmp_path)
  held = run_lock.RunLock.acquire(newest)
  try:
    with pytest.raises(cli.UsageError) as refused:
      local_multihost._job_args(local_multihost.parse_args(  # pylint: disable=protected-access
          ["--processes", "2", "--devices", "4", "--", "--resume", "--steps", "10"]))
  finally:
    held.release()
  assert str(refused.value).startswith("--resume: the newest run runs/lm-20260101-000000 is in"
                                       " use"), refused.value
  assert "--out runs" not in str(refused.value)
