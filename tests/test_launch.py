"""The main job as a user runs it: outputs, SIGTERM handling and exact resume."""

import signal

import numpy as np
import pytest

from tests import launch_helpers as h


def test_help_lists_the_options(tmp_path):
  assert h.run(["launch.train", "--help"], tmp_path / "log", timeout=60) == 0
  text = (tmp_path / "log").read_text()
  for flag in ("--mesh", "--rules", "--optimizer", "--schedule", "--zero", "--resume",
               "--checkpoint-every", "--coordinator"):
    assert flag in text


def test_help_and_the_docs_list_every_exit_code(tmp_path):
  """--help lists each of cli.EXIT_CODES with its meaning, the constants train.main returns
  (cli.EXIT_*) among them; docs/failure-modes.md explains each."""
  from launch import cli
  assert h.run(["launch.train", "--help"], tmp_path / "log", timeout=60) == 0
  text = " ".join((tmp_path / "log").read_text().split())
  assert set(cli.EXIT_CODES) == {"0", "1", "2", "3", "4", "128 + N"}
  assert {str(code) for code in (cli.EXIT_DONE, cli.EXIT_ERROR, cli.EXIT_USAGE,
                                 cli.EXIT_NONFINITE, cli.EXIT_STORAGE)} < set(cli.EXIT_CODES)
  docs = (h.ROOT / "docs" / "failure-modes.md").read_text()
  for code, meaning in cli.EXIT_CODES.items():
    assert f"{code} {meaning}" in text, code
    assert f"**{code}**" in docs, code


def test_unknown_hyperparameter_names_the_optimizer(tmp_path, capsys):
  from launch import train
  assert train.main([*h.TINY, "--cpu-devices", "0", "--out", str(tmp_path / "run"),
                     "--optimizer", "sgd", "--b2", "0.9"]) == 2
  assert "error: --optimizer sgd: does not take b2" in capsys.readouterr().err
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_sigterm_saves_and_resume_matches_uninterrupted_run(tmp_path):
  out, log = tmp_path / "run", tmp_path / "log"
  proc = h.start(["launch.train", *h.TINY, "--optimizer", "adam", "--steps", "500",
                  "--checkpoint-every", "4", "--out", str(out)], log)
  try:
    h.wait_for_steps(out, 5, proc, timeout=150)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
  finally:
    h.stop(proc)
  text = log.read_text()
  for shown in ("mesh: {'data': 4, 'model': 2}", "partition rules", "per-device memory plan",
                "params+state", "tok/s", "stopped by signal 15"):
    assert shown in text
  assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  stopped = len(h.losses(out))
  assert h.checkpoint_steps(out / "checkpoints")[-1] == stopped  # the stop step was saved

  resumed = h.run_in_process(out, "--optimizer", "adam", "--steps", str(stopped + 2),
                             "--resume")
  reference = h.run_in_process(tmp_path / "ref", "--optimizer", "adam",
                               "--steps", str(stopped + 2))
  np.testing.assert_allclose(resumed, reference, rtol=1e-6)
  assert reference[-1] < reference[0] - 0.5


def test_default_out_is_a_new_run_folder_and_resume_takes_the_newest(tmp_path, monkeypatch):
  from launch import cli, run_folder
  monkeypatch.chdir(tmp_path)
  fresh = cli.parse_args([])
  assert fresh.out is None and fresh.checkpoint_dir is None  # decided once all checks pass
  assert run_folder.prepare(fresh) == (False, None)
  assert fresh.out.startswith("runs/lm-") and fresh.checkpoint_dir == f"{fresh.out}/checkpoints"
  for name in ("lm-20260101-000000", "lm-20260102-000000", "lm-20260103-000000"):
    (tmp_path / "runs" / name).mkdir(parents=True)
  for name in ("lm-20260101-000000", "lm-20260102-000000"):  # the newest has no checkpoint
    (tmp_path / "runs" / name / "checkpoints" / "10").mkdir(parents=True)
  resumed = cli.parse_args(["--resume"])
  assert run_folder.prepare(resumed) == (True, None)
  assert resumed.out == "runs/lm-20260102-000000"
  with pytest.raises(cli.UsageError, match="needs --out"):
    cli.parse_args(["--num-processes", "2"])


def test_local_launcher_gives_every_process_the_same_run_folder(tmp_path, monkeypatch):
  from launch import cli, local_multihost
  monkeypatch.chdir(tmp_path)
  args = local_multihost.parse_args(["--processes", "2", "--", "--steps", "5"])
  commands = local_multihost.process_commands(args, port=12345)
  outs = {c[c.index("--out") + 1] for c in commands}
  assert len(outs) == 1 and outs.pop().startswith("runs/lm-")
  assert [c[c.index("--process-id") + 1] for c in commands] == ["0", "1"]
  for command in commands:  # each joins the others: the job accepts its process flags
    assert cli.parse_args(command[command.index("launch.train") + 1:]).coordinator
  given = local_multihost.parse_args(["--", "--out", "mine"])
  assert all(c.count("--out") == 1 and "mine" in c for c in local_multihost.process_commands(given, 1))
  timeouts = local_multihost.parse_args(["--init-timeout", "5", "--heartbeat-timeout", "30",
                                         "--devices", "2", "--", "--out", "mine"])
  for command in local_multihost.process_commands(timeouts, 1):  # the job's values: the launcher's
    args = cli.parse_args(command[command.index("launch.train") + 1:])
    assert (args.init_timeout, args.heartbeat_timeout, args.cpu_devices) == (5, 30, 2)


@pytest.mark.parametrize("resume", [["--resume=auto"], ["--resume", "auto"], ["--resume"],
                                    ["--resume=required"], ["--res"], ["--resume", "--steps", "9"]])
def test_local_launcher_resumes_the_run_the_job_would(tmp_path, monkeypatch, resume):
  """Every spelling of --resume the job's parser takes gives every process the newest run that
  holds a checkpoint, as the job alone would take; '--resume=auto' (and '--res') gave a new run
  folder, the launcher seeing no word '--resume'."""
  from launch import local_multihost
  monkeypatch.chdir(tmp_path)
  for name in ("lm-20260101-000000", "lm-20260102-000000"):
    (tmp_path / "runs" / name / "checkpoints" / "10").mkdir(parents=True)
  (tmp_path / "runs" / "lm-20260103-000000").mkdir()  # the newest, no checkpoint
  args = local_multihost.parse_args(["--", "--steps", "12", *resume])
  for command in local_multihost.process_commands(args, port=12345):
    assert command[command.index("--out") + 1] == "runs/lm-20260102-000000", command


def test_local_launcher_keeps_the_run_folder_the_job_is_given(tmp_path, monkeypatch):
  """--out as the job's parser reads it (abbreviated, or in a --config file) is the folder of
  every process: the launcher added its own --out after '--ou X', which the job took instead.
  With --checkpoint-dir, --resume does not look for the newest run (the job does not)."""
  from launch import local_multihost
  monkeypatch.chdir(tmp_path)
  (tmp_path / "runs" / "lm-20260101-000000" / "checkpoints" / "10").mkdir(parents=True)
  (tmp_path / "c.toml").write_text('out = "from-file"\n')
  for job_args in (["--ou", "mine"], ["--out=mine"], ["--config", "c.toml"],
                   ["--config", "c.toml", "--resume"]):
    commands = local_multihost.process_commands(local_multihost.parse_args(["--", *job_args]), 1)
    assert all("--out" not in command for command in commands), (job_args, commands)
  args = local_multihost.parse_args(["--", "--checkpoint-dir", "ck", "--resume"])
  for command in local_multihost.process_commands(args, 1):
    assert command[command.index("--out") + 1].startswith("runs/lm-"), command
    assert command[command.index("--out") + 1] != "runs/lm-20260101-000000", command
