"""The job's flags (issue 20): resuming takes the run's saved flags, --config
and --print-config round-trip, and the default learning rate per optimizer
is the best of the committed benchmark."""

import json
import os
import pathlib
import re
import shutil
import sys

import pytest

from checkpoints import digest
from launch import cli
from launch import defaults
from launch import derived_flags
from launch import flags
from launch import report
from launch import run_config
from launch import run_contents
from launch import train
from tests import launch_helpers as h

RESULTS = h.ROOT / "benchmarks" / "results" / "matrix_optimizers.md"


def _printed_config(capsys, *argv) -> str:
  assert train.main([*argv, "--print-config"]) == 0
  return capsys.readouterr().out


def test_config_file_and_print_config_round_trip(tmp_path, capsys):
  argv = ["--optimizer", "adafactor", "--lr", "0.01", "--opt", "decay_rate=0.9", "--no-zero",
          "--scan-layers", "--profile-steps", "5:7", "--steps", "40", "--mesh", "data=2,model=4"]
  toml = _printed_config(capsys, *argv)
  assert 'optimizer = "adafactor"' in toml and "lr = 0.01" in toml
  assert "opt = { decay_rate = 0.9 }" in toml and "zero = false" in toml
  path = tmp_path / "run.toml"
  path.write_text(toml)
  assert _printed_config(capsys, "--config", str(path)) == toml
  direct = vars(flags.resolve(argv))
  # The same flags; the file gives every one of them (``given``, saved with checkpoints).
  assert {**vars(flags.resolve(["--config", str(path)])), "config": None,
          "given": direct["given"]} == direct
  as_json = tmp_path / "run.json"  # every flag's value, as a checkpoint saves them: all given
  as_json.write_text(json.dumps(run_config.flags_of(flags.resolve(argv))))
  from_json = flags.resolve(["--config", str(as_json)])
  assert run_config.flags_of(from_json) == run_config.flags_of(flags.resolve(argv))
  assert from_json.derived == {}
  assert flags.resolve(["--config", str(path), "--lr", "0.02"]).lr == 0.02  # the command line wins


def test_the_plot_title_names_every_flag_that_defines_the_run_with_the_value_in_use():
  """The flags a resume refuses to change are in loss.png's title, as a command line, with the
  warmup the schedule uses (--steps 3: 2, not the 20 configured); the title stated the
  configured warmup and left out --state-bits, --param-dtype, --correction-bits,
  --skip-nonfinite, --final-lr-ratio, --scan-layers. Flags that may change are not in it."""
  args = cli.parse_args(["--steps", "3", "--param-dtype", "bfloat16", "--state-bits", "8",
                         "--correction-bits", "16", "--skip-nonfinite", "--final-lr-ratio",
                         "0.2", "--scan-layers", "--opt", "eps_root=1e-08", "--mesh",
                         "data=2,model=4"])
  config = run_config.config_of(args, 1, 8)
  title = run_config.title("lm-x", config)
  assert title.startswith("lm-x: ")
  words = " ".join(title.split())
  for shown in ("--warmup-steps 2 ", "--state-bits 8 ", "--param-dtype bfloat16 ",
                "--correction-bits 16 ", "--final-lr-ratio 0.2 ", "--opt eps_root=1e-08 ",
                "--schedule warmup_cosine ", "--schedule-steps 3 "):
    assert shown in words + " ", (shown, title)
  defining = [name for name in config if run_config.compare(config, {name: "other"})[0]]
  assert {"skip_nonfinite", "scan_layers", "seed", "clip_norm"} <= set(defining)
  for name in defining:
    if config[name] not in (None, False, []):
      assert "--" + name.replace("_", "-") in words, (name, title)
  for name in set(config) - set(defining) - {"given"}:
    assert "--" + name.replace("_", "-") not in words, (name, title)
  assert "--warmup-steps" not in run_config.title(
      "lm-x", run_config.config_of(cli.parse_args(["--schedule", "constant"]), 1, 8))


@pytest.mark.parametrize("argv", [
    ["--optimizer", "adafactor", "--opt", "decay_rate=0.8", "--opt", "decay_rate=0.9"],
    ["--optimizer", "sgd", "--b2", "0.9"],
    ["--optimizer", "rprop", "--schedule", "cosine"],
    ["--optimizer", "dpsgd"],
    ["--seq-len", "200000"],
    ["--batch", "100000"],
    ["--mesh", "data:4"],
    ["--axis-types", "data=explicit"],
], ids=["opt_given_twice", "keyword_not_taken", "lr_not_a_schedule", "not_in_the_job",
        "seq_len_over_the_corpus", "no_held_out_batch", "mesh_syntax", "axis_types_left_out"])
def test_print_config_refuses_what_a_run_refuses(tmp_path, capsys, argv):
  """--print-config printed a file for flags a run refuses: for --opt decay_rate=0.8 --opt
  decay_rate=0.9 one that --config cannot read (a duplicate TOML key). It now fails as the run
  does, with the same error line, printing nothing."""
  flags_ = [*h.TINY, *argv]
  assert train.main([*flags_, "--print-config"]) == cli.EXIT_USAGE
  printed = capsys.readouterr()
  assert printed.out == "" and len(printed.err.splitlines()) == 1, printed
  out = tmp_path / "run"
  assert train.main([*flags_, "--cpu-devices", "0", "--out", str(out)]) == cli.EXIT_USAGE
  assert capsys.readouterr().err == printed.err
  assert not out.exists()


@pytest.mark.parametrize("scheme, package", [
    ("gs", "gcsfs"), ("s3", "s3fs"), ("az", "adlfs"), ("hf", "huggingface_hub")])
def test_a_bucket_checkpoint_dir_without_its_package_is_a_usage_error(
    tmp_path, monkeypatch, capsys, scheme, package):
  """etils.epath reads a bucket through the package fsspec names for its scheme (or
  tensorflow): with neither installed the run failed with 'error: ImportError: Please install
  gcsfs to access Google Storage' (s3://: 'Install s3fs to access S3'), exit 1, not naming the
  flag. Now the flag is refused, naming the package and how to install it; nothing is
  created."""
  for missing in (package, "tensorflow"):
    monkeypatch.setitem(sys.modules, missing, None)  # not importable, whatever is installed
  monkeypatch.chdir(tmp_path)
  argv = [*h.TINY, "--cpu-devices", "0", "--steps", "2", "--checkpoint-dir",
          f"{scheme}://bucket/ck"]
  for extra in ([], ["--print-config"]):
    assert train.main([*argv, *extra]) == cli.EXIT_USAGE
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == (
        f"error: --checkpoint-dir {scheme}://bucket/ck: {scheme}:// paths need the package"
        f" {package}, which is not installed: pip install {package}\n")
  assert list(tmp_path.iterdir()) == []


def test_a_bucket_out_is_a_usage_error(tmp_path, monkeypatch, capsys):
  """--out is written with local file calls (metrics, plot, logs, the run's lock): --out
  gs://bucket/run made a local folder CWD/gs:/bucket/run (or, without gcsfs, failed with an
  ImportError, exit 1). Refused as such (not for a missing gcsfs); nothing is created."""
  monkeypatch.chdir(tmp_path)
  for missing in ("gcsfs", "tensorflow"):
    monkeypatch.setitem(sys.modules, missing, None)
  assert train.main([*h.TINY, "--cpu-devices", "0", "--steps", "2", "--out",
                     "gs://bucket/run"]) == cli.EXIT_USAGE
  assert capsys.readouterr().err == (
      "error: --out gs://bucket/run: must be a local folder (the metrics, the plot, the logs"
      " and the run's lock are written there as local files); keep the checkpoints in a"
      " bucket with --checkpoint-dir gs://bucket/run/checkpoints\n")
  assert list(tmp_path.iterdir()) == []


_NO_GCSFS = ("error: --checkpoint-dir gs://b/c: gs:// paths need the package gcsfs, which is not"
             " installed: pip install gcsfs\n")
_BUCKET_OUT = ("error: --out {}: must be a local folder (the metrics, the plot, the logs and the"
               " run's lock are written there as local files); keep the checkpoints in a bucket"
               " with --checkpoint-dir {}/checkpoints\n")


@pytest.mark.parametrize("argv, error", [
    (["--resume", "--checkpoint-dir", "gs://b/c"], _NO_GCSFS),
    (["--resume", "--out", "gs://b/r"], _BUCKET_OUT.format("gs://b/r", "gs://b/r")),
    (["--resume=auto", "--out", "gs://b/r"], _BUCKET_OUT.format("gs://b/r", "gs://b/r")),
    (["--config", "{config}", "--resume"], _BUCKET_OUT.format("gs://b/run", "gs://b/run")),
    (["--print-config", "--resume", "--checkpoint-dir", "gs://b/c"], _NO_GCSFS),
    (["--resume", "--checkpoint-dir", "GS://b/c"],
     "error: --checkpoint-dir GS://b/c: etils.epath (which writes the checkpoints) reads no"
     " GS:// paths; write the scheme in lower case: gs://b/c\n"),
    (["--checkpoint-dir", "GS://b/c"],
     "error: --checkpoint-dir GS://b/c: etils.epath (which writes the checkpoints) reads no"
     " GS:// paths; write the scheme in lower case: gs://b/c\n"),
    (["--checkpoint-dir", "nowhere://b/c"],
     "error: --checkpoint-dir nowhere://b/c: etils.epath (which writes the checkpoints) reads"
     " no nowhere:// paths\n"),
], ids=["resume_checkpoint_dir", "resume_out", "resume_auto_out", "config_out",
        "print_config_resume", "resume_upper_case_scheme", "upper_case_scheme",
        "unknown_scheme"])
def test_a_bucket_path_is_checked_before_a_resume_reads_it(tmp_path, monkeypatch, capsys, argv,
                                                           error):
  """With --resume the run's folder was read (for its saved flags) before --out and
  --checkpoint-dir were checked: a gs:// path without gcsfs, or --out gs://, failed with 'error:
  ImportError: Please install gcsfs to access Google Storage', exit 1; GS:// (which etils.epath
  does not read) with 'error: KeyError: 'GS://''. Now the same usage errors as without --resume
  (given on the command line or in --config), exit 2, nothing created."""
  for missing in ("gcsfs", "tensorflow"):
    monkeypatch.setitem(sys.modules, missing, None)
  config = _written(tmp_path, "g.toml", 'out = "gs://b/run"\n')
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  argv = [arg.format(config=config) for arg in argv]
  assert train.main([*h.TINY, "--cpu-devices", "0", "--steps", "2", *argv]) == cli.EXIT_USAGE
  printed = capsys.readouterr()
  assert printed.out == "" and printed.err == error
  assert list(cwd.iterdir()) == []


def _written(tmp_path, name: str, text: str) -> str:
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_a_printed_config_with_a_shortened_default_warmup_reads_back(tmp_path, capsys):
  """--steps 10 shortens the default warmup 20 to 9: the file says so in a comment and does
  not pin 20, which read back as given would be refused (below the horizon 10)."""
  toml = _printed_config(capsys, "--steps", "10")
  assert "# warmup_steps = 9  # the default 20, at most the schedule's horizon - 1" in toml
  assert "# schedule_steps = 10  # --steps" in toml.splitlines()
  path = _written(tmp_path, "c.toml", toml)
  assert _printed_config(capsys, "--config", path) == toml
  assert run_config.flags_of(flags.resolve(["--config", path])) == run_config.flags_of(
      flags.resolve(["--steps", "10"]))


def test_a_derived_line_uncommented_pins_its_value(tmp_path, capsys):
  """Each derived line is a comment whose reason is a comment of its own: with its first '# '
  removed it reads as the flag given (it was invalid TOML: the reason was in parentheses)."""
  toml = _printed_config(capsys, "--steps", "10")
  pinned = "\n".join(line[2:] if line.startswith(("# lr = ", "# warmup_steps = ")) else line
                     for line in toml.splitlines())
  args = flags.resolve(["--config", _written(tmp_path, "u.toml", pinned)])
  assert (args.lr, args.warmup_steps) == (0.01, 9)
  assert "lr" not in args.derived and "warmup_steps" not in args.derived


@pytest.mark.parametrize("argv", [
    ["--steps", "1000", "--optimizer", "muon"],  # lr and schedule_steps derived again
    ["--optimizer", "lbfgs"],  # lr 1.0 and a constant schedule
    ["--param-dtype", "float32"],  # no correction bits (the file was printed for bfloat16)
    ["--steps", "5"],  # the default warmup shortened to 4
])
def test_flags_given_with_a_printed_config_derive_what_depends_on_them(tmp_path, capsys, argv):
  """A printed config pins what was given, not what the job derived from it: flags given
  next to the file derive --lr, --schedule, --schedule-steps, --warmup-steps and
  --correction-bits as they would on the command line alone."""
  toml = _printed_config(capsys, "--param-dtype", "bfloat16")
  assert "# lr = 0.01  # adamw's default" in toml.splitlines()
  assert "# correction_bits = 8  # the default with --param-dtype bfloat16" in toml.splitlines()
  path = _written(tmp_path, "d.toml", toml)
  alone = ["--param-dtype", "bfloat16", *argv]
  assert run_config.flags_of(flags.resolve(["--config", path, *argv])) == run_config.flags_of(
      flags.resolve(alone))
  assert _printed_config(capsys, "--config", path, *argv) == _printed_config(capsys, *alone)


def test_given_derived_flags_are_pinned_by_a_printed_config(tmp_path, capsys):
  toml = _printed_config(capsys, "--lr", "0.02", "--schedule-steps", "300", "--warmup-steps", "5")
  for line in ("lr = 0.02", "schedule_steps = 300", "warmup_steps = 5"):
    assert line in toml.splitlines()
  args = flags.resolve(["--config", _written(tmp_path, "e.toml", toml), "--optimizer", "muon"])
  assert (args.lr, args.schedule_steps, args.warmup_steps) == (0.02, 300, 5)


@pytest.mark.parametrize("text, culprit", [
    ("learning_rate = 0.1", "'learning_rate' is not a flag"),
    ("resume = true", "'resume' is not a flag"),
    ('steps = "many"', "argument --steps: invalid int value: 'many'"),
    ('zero = "no"', "zero = 'no': must be true or false"),
    ("lr = -1", "--lr -1.0: must be a finite number > 0"),
    ("steps = [", "cannot read it"),
    ("opt = 3", "opt = 3: must be a table of keyword = number"),
    ("opt = [[1, 2, 3]]", "opt = [[1, 2, 3]]: must be a table of keyword = number"),
    ('opt = { b1 = "x" }', "'x' is not a number"),
])
def test_bad_config_file(tmp_path, text, culprit):
  path = tmp_path / "bad.toml"
  path.write_text(text)
  with pytest.raises(cli.UsageError, match=re.escape(culprit)):
    flags.resolve(["--config", str(path)])


@pytest.mark.parametrize("text", ["[1, 2]", '"lr"', "3"])
def test_a_json_config_that_is_not_a_table_is_a_usage_error(tmp_path, text):
  path = tmp_path / "bad.json"
  path.write_text(text)
  with pytest.raises(cli.UsageError, match=re.escape(
      f"--config {path}: must hold a table of flags (name = value, e.g. lr = 0.01); it holds")):
    flags.resolve(["--config", str(path)])


@pytest.mark.parametrize("opt", ["{ decay_rate = 0.7 }", '[["decay_rate", 0.7]]',
                                 '["decay_rate=0.7"]'])
def test_config_opt_as_a_table_pairs_or_command_line_words(tmp_path, opt):
  path = tmp_path / "run.toml"
  path.write_text(f'optimizer = "adafactor"\nopt = {opt}\n')
  assert flags.resolve(["--config", str(path)]).opt == [("decay_rate", 0.7)]


@pytest.mark.slow
def test_resume_takes_the_saved_flags(tmp_path, capsys):
  """Trained with adafactor, lr 0.01 and a 4-step warmup-cosine schedule; the
  resume gives only --out, --resume and --steps."""
  out = tmp_path / "run"
  first = [*h.TINY, "--cpu-devices", "0", "--out", str(out), "--optimizer", "adafactor",
           "--lr", "0.01", "--schedule", "warmup_cosine", "--warmup-steps", "1", "--steps", "4",
           "--checkpoint-every", "2", "--eval-every", "0"]
  assert train.main(first) == 0
  capsys.readouterr()
  again = ["--cpu-devices", "0", "--out", str(out), "--resume"]
  shown = _printed_config(capsys, *again)
  for line in ('optimizer = "adafactor"', "lr = 0.01", "schedule_steps = 4", "steps = 4",
               "d_model = 32"):
    assert line in shown.splitlines(), line

  assert train.main([*again, "--steps", "6"]) == 0
  printed = capsys.readouterr().out
  changes = [line for line in printed.splitlines() if line.startswith("resume:")]
  assert changes == ["resume: changed --steps 4 -> 6"]
  records = report.read_metrics(out / "metrics.jsonl")
  assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
  assert [r["lr"] for r in records[4:]] == pytest.approx([0.001, 0.001])  # past the horizon 4
  assert all(r["tokens_per_s"] > 0 for r in records[4:])  # measured in the first window too
  saved, step = run_contents.saved_config(out / "checkpoints")
  assert step == 6 and (saved["optimizer"], saved["lr"], saved["schedule_steps"]) == (
      "adafactor", 0.01, 4)

  assert train.main([*again, "--steps", "6", "--lr", "0.02"]) == 2
  error = capsys.readouterr().err
  assert error.startswith("error: --resume: the flags differ") and "--lr 0.01 -> 0.02" in error


def _tiny_run(out, *flags) -> int:
  return train.main([*h.TINY, "--cpu-devices", "0", "--out", str(out), "--steps", "2",
                     "--checkpoint-every", "2", "--eval-every", "0", *flags])


def _one_error_line(capsys) -> str:
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  return lines[0]


def test_a_resume_finds_checkpoints_kept_outside_the_run_folder(tmp_path, capsys):
  """A run given --checkpoint-dir elsewhere records that folder in its own: a resume naming only
  --out continues from those checkpoints, also after the run folder was moved (a resume
  without the flag found none, 'nothing to resume'; a moved folder was refused as holding
  another run's metrics)."""
  out, elsewhere = tmp_path / "run", tmp_path / "store" / "ck"
  assert _tiny_run(out, "--steps", "4", "--checkpoint-dir", str(elsewhere)) == 0
  assert not (out / "checkpoints").exists()
  record_text = f"{os.path.realpath(elsewhere)}\n"
  assert (out / run_contents.CHECKPOINT_DIR_RECORD).read_text() == record_text
  capsys.readouterr()
  assert train.main(["--cpu-devices", "0", "--out", str(out), "--resume", "--steps", "6"]) == 0
  assert f"resumed from step 4 ({os.path.realpath(elsewhere)})" in capsys.readouterr().out
  moved = tmp_path / "moved"
  out.rename(moved)
  assert train.main(["--cpu-devices", "0", "--out", str(moved), "--resume", "--steps", "8"]) == 0
  printed = capsys.readouterr().out
  assert f"resumed from step 6 ({os.path.realpath(elsewhere)})" in printed
  assert f"--out {out} -> {moved}" in printed
  assert [r["step"] for r in report.read_metrics(moved / "metrics.jsonl")] == list(range(1, 9))
  assert h.checkpoint_steps(elsewhere)[-1] == 8
  (moved / run_contents.CHECKPOINT_DIR_RECORD).write_text("two\nlines\n")  # damaged by hand
  again = ["--cpu-devices", "0", "--out", str(moved), "--resume", "--steps", "10"]
  assert train.main(again) == 2
  assert "checkpoint_dir.txt: not a checkpoint folder's path" in _one_error_line(capsys)
  assert train.main([*again, "--checkpoint-dir", str(elsewhere)]) == 0  # the flag: written anew
  assert (moved / run_contents.CHECKPOINT_DIR_RECORD).read_text() == record_text


def test_a_recorded_checkpoint_folder_never_mixes_or_loses_a_run(tmp_path, capsys):
  """Run X keeps its checkpoints in SH; run Y continues them. X's resume is refused as another
  run's checkpoints (X's record is older than Y's: it resumed and split the metrics, X's
  steps [1, 2, 5, 6], Y's [3, 4]); --resume auto with an empty --checkpoint-dir, outside X or
  inside it, is refused, naming SH (it started afresh and repointed the record); SH moved away, Y's resume
  says so (--resume auto recreated SH empty and started afresh)."""
  x, y, shared = tmp_path / "x", tmp_path / "y", tmp_path / "sh"
  assert _tiny_run(x, "--checkpoint-dir", str(shared)) == 0
  assert _tiny_run(y, "--checkpoint-dir", str(shared), "--resume", "--steps", "4") == 0
  before = {f: f.read_bytes() for f in [*x.rglob("*"), *y.rglob("*")] if f.is_file()}
  capsys.readouterr()
  assert _tiny_run(x, "--resume", "--steps", "6") == 2
  assert f"holds the metrics of another run than the checkpoints" in _one_error_line(capsys)
  empty = tmp_path / "empty"
  assert _tiny_run(x, "--resume", "auto", "--checkpoint-dir", str(empty)) == 2
  assert f"pass --checkpoint-dir {os.path.realpath(shared)} to continue it" in _one_error_line(
      capsys)
  assert not empty.exists()
  inside = x / "new-ck"  # inside X: it started afresh there and dropped the record of SH
  assert _tiny_run(x, "--resume", "auto", "--checkpoint-dir", str(inside)) == 2
  assert f"pass --checkpoint-dir {os.path.realpath(shared)} to continue it" in _one_error_line(
      capsys)
  assert not inside.exists()
  shared.rename(tmp_path / "sh-moved")
  for resume in (["--resume"], ["--resume", "auto"]):
    assert _tiny_run(y, *resume, "--steps", "6") == 2
    line = _one_error_line(capsys)
    assert f"keeps its checkpoints in {os.path.realpath(shared)}" in line, line
    assert "which does not exist: pass --checkpoint-dir naming where they are now" in line
  assert not shared.exists()
  assert {f: f.read_bytes() for f in [*x.rglob("*"), *y.rglob("*")] if f.is_file()} == before
  (tmp_path / "sh-moved").rename(shared)
  shutil.rmtree(y)  # Y gone: X's record still names SH, whose newest steps Y trained
  assert _tiny_run(x, "--resume", "--steps", "6") == 2
  line = _one_error_line(capsys)
  assert f"the metrics in --out {x} end at step 2, but --checkpoint-dir" in line, line
  assert "holds step 4" in line and "would leave steps 3-4 out of these metrics" in line


def test_a_run_whose_checkpoints_another_run_continued_is_not_resumed(tmp_path, capsys):
  """P keeps its checkpoints in P/checkpoints, Q continues them; P's resume would append steps
  5 and 6 to P's metrics of steps 1 and 2 (it did: P's steps [1, 2, 5, 6], Q's [3, 4])."""
  p, q = tmp_path / "p", tmp_path / "q"
  assert _tiny_run(p) == 0
  assert _tiny_run(q, "--checkpoint-dir", str(p / "checkpoints"), "--resume", "--steps", "4") == 0
  capsys.readouterr()
  assert _tiny_run(p, "--resume", "--steps", "6") == 2
  line = _one_error_line(capsys)
  assert f"end at step 2, but --checkpoint-dir {p / 'checkpoints'} holds step 4" in line, line
  assert f"(saved by the run in {os.path.realpath(q)})" in line
  assert [r["step"] for r in report.read_metrics(p / "metrics.jsonl")] == [1, 2]


def test_a_folder_in_place_of_the_record_is_refused_before_the_run_starts(tmp_path, capsys):
  """A directory named checkpoint_dir.txt in --out: the run trained, then exited 4 naming a
  draft file and advising to free space; a pipe there: a resume waited for ever to read it."""
  out, elsewhere = tmp_path / "run", tmp_path / "ck"
  (out / run_contents.CHECKPOINT_DIR_RECORD).mkdir(parents=True)
  assert _tiny_run(out, "--checkpoint-dir", str(elsewhere)) == 2
  line = _one_error_line(capsys)
  assert f"--out {out}: {out / run_contents.CHECKPOINT_DIR_RECORD} is not a file" in line, line
  assert not elsewhere.exists() and [f.name for f in out.iterdir()] == ["checkpoint_dir.txt"]
  (out / run_contents.CHECKPOINT_DIR_RECORD).rmdir()
  os.mkfifo(out / run_contents.CHECKPOINT_DIR_RECORD)  # reading it waited for ever
  for resume in (["--resume"], ["--resume", "auto"]):
    assert _tiny_run(out, *resume) == 2
    assert f"{out / run_contents.CHECKPOINT_DIR_RECORD} is not a file" in _one_error_line(capsys)


def test_a_metrics_line_that_is_not_utf8_is_one_line_passed_over(tmp_path):
  """A torn or foreign line in metrics.jsonl: the folder checks raised UnicodeDecodeError."""
  (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n\xff\xfe\n{"step": 3}\n')
  assert run_contents.metrics_records(tmp_path) == 3
  assert run_contents.last_metrics_step(tmp_path) == 3


def test_a_run_folder_records_where_its_checkpoints_are(tmp_path, monkeypatch):
  """A folder outside the run absolute (links resolved), one inside relative to it (found again
  after the run folder moves, also when written through a link), a URL as given, the default
  folder no record; a resume without --out finds the newest run through its record; a record
  that is not one line of a path, or names a folder the job cannot use, is an error naming it,
  not a path, and its run is not passed over for an older one."""
  runs = tmp_path / "runs"
  out = runs / "lm-1"
  out.mkdir(parents=True)
  (tmp_path / "link").symlink_to(tmp_path / "store", target_is_directory=True)
  monkeypatch.chdir(tmp_path)
  run_contents.record_checkpoint_dir(out, "link/ck")
  assert run_contents.checkpoints_of(out) == str(tmp_path.resolve() / "store" / "ck")
  (tmp_path / "store" / "ck" / "3").mkdir(parents=True)
  assert run_contents.newest_resumable() == pathlib.Path("runs/lm-1")
  run_contents.record_checkpoint_dir(out, "gs://bucket/ck")
  assert run_contents.recorded_checkpoint_dir(out) == "gs://bucket/ck"
  (tmp_path / "to-run").symlink_to(out, target_is_directory=True)
  run_contents.record_checkpoint_dir(out, "to-run/sub/ck")
  assert (out / run_contents.CHECKPOINT_DIR_RECORD).read_text() == "sub/ck\n"
  out.rename(runs / "lm-2")
  assert run_contents.checkpoints_of(runs / "lm-2") == str(runs / "lm-2" / "sub" / "ck")
  out = runs / "lm-2"
  run_contents.record_checkpoint_dir(out, str(out / "checkpoints"))
  assert not (out / run_contents.CHECKPOINT_DIR_RECORD).exists()
  assert run_contents.checkpoints_of(out) == run_contents.checkpoints_in(out)
  assert not [p.name for p in out.iterdir()]  # no draft left
  (out / run_contents.CHECKPOINT_DIR_RECORD).write_text("sub/ck")  # written by hand
  assert run_contents.checkpoints_of(out) == str(out / "sub" / "ck")
  for text in ("", "\n", "a\nb\n", "garbage\x01\n", "two\n\n"):
    (out / run_contents.CHECKPOINT_DIR_RECORD).write_text(text)
    with pytest.raises(cli.UsageError, match="checkpoint_dir.txt: not a checkpoint folder's path"):
      run_contents.checkpoints_of(out)
  assert run_contents.newest_resumable() == pathlib.Path("runs/lm-2")  # reported, not passed over
  (out / run_contents.CHECKPOINT_DIR_RECORD).write_text(f"{tmp_path / 'file'}/ck\n")
  (tmp_path / "file").write_text("")
  with pytest.raises(cli.UsageError, match=r"checkpoint_dir.txt \(the run's checkpoint folder,"
                     r" recorded\): --checkpoint-dir .*/file/ck: .*file is a file"):
    run_contents.checkpoints_of(out)


def _benchmark_bests() -> dict:
  """optimizer -> best lr, from the committed results' table of bests."""
  text = RESULTS.read_text().split("## Best learning rate of each", 1)[1].split("##", 1)[0]
  return {m.group(1): float(m.group(2))
          for m in re.finditer(r"^\| (\w+) \| ([0-9.e-]+)", text, re.MULTILINE)}


def test_default_learning_rates_are_the_benchmark_bests():
  bests = _benchmark_bests()
  assert set(defaults.LEARNING_RATES) == {*bests, "adam"}
  for optimizer, lr in bests.items():
    assert defaults.learning_rate(optimizer) == lr, optimizer
    assert cli.parse_args(["--optimizer", optimizer]).lr == lr
  assert defaults.learning_rate("adam") == bests["adamw"]
  assert cli.parse_args(["--optimizer", "rmsprop"]).lr == defaults.FALLBACK


def test_default_runs_are_within_2_percent_of_the_benchmark_bests():
  """The committed runs of ``python -m launch.train --optimizer X`` (no --lr),
  muon among them, against the best of X's sweep."""
  text = RESULTS.read_text().split("## The job's default learning rate", 1)[1]
  rows = re.findall(r"^\| (\w+) \| ([0-9.e-]+) \| ([0-9.]+) \| ([0-9.]+) \|", text, re.MULTILINE)
  assert {row[0] for row in rows} == set(_benchmark_bests())
  for optimizer, default_lr, loss, best in rows:
    assert float(default_lr) == defaults.learning_rate(optimizer)
    assert float(loss) <= 1.02 * float(best), optimizer


@pytest.mark.slow
def test_a_changed_flag_is_refused_as_itself_before_the_flags_are_merged(tmp_path, capsys):
  """bfloat16 params saved --correction-bits 8; resuming with --param-dtype float32 names
  --param-dtype (the merged flags would fail on the saved --correction-bits, which the user
  never gave), and leaves the run's checkpoints as they were."""
  out = tmp_path / "run"
  first = [*h.TINY, "--cpu-devices", "0", "--out", str(out), "--param-dtype", "bfloat16",
           "--steps", "2", "--eval-every", "0"]
  assert train.main(first) == 0
  before = sorted(p.name for p in (out / "checkpoints").iterdir())
  capsys.readouterr()
  again = ["--cpu-devices", "0", "--out", str(out), "--resume", "--steps", "4"]
  assert train.main([*again, "--param-dtype", "float32"]) == 2
  error = capsys.readouterr().err
  assert error.count("\n") == 1 and error.startswith("error: --resume: the flags differ")
  assert "--param-dtype bfloat16 -> float32" in error and "correction" not in error
  assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before


def _save_config(run, args) -> None:
  """A checkpoint step 6 of ``run`` whose metadata holds the flags a resume takes from ``args``
  (nothing else: enough for ``launch.flags``)."""
  _write_step(run / "checkpoints" / "6", run_config.inherited(run_config.flags_of(args)))


def _write_step(folder, config) -> None:
  """A step folder holding ``config`` as its metadata and a record whose digest vouches for it
  (``checkpoints.digest``: a resume takes flags only from such a step), no arrays."""
  metadata = {"config": config}
  layout = {"format": digest.FORMAT, "seed": 0, "leaves": {}, "checksums": {},
            "digest": digest.digest({}, {}, metadata, 0)}
  for item, value in (("metadata", metadata), ("layout", layout)):
    (folder / item).mkdir(parents=True)
    (folder / item / "metadata").write_text(json.dumps(value))


def test_a_saved_default_warmup_is_not_refused_on_resume(tmp_path):
  """A run made with --steps 6 keeps the default --warmup-steps 20 (shortened
  to the horizon); its saved flags hold 20, and a resume that gives none of
  them must not refuse it as if the user had given 20."""
  _save_config(tmp_path / "run", cli.parse_args(["--steps", "6"]))
  args = flags.resolve(["--out", str(tmp_path / "run"), "--resume"])
  assert (args.steps, args.warmup_steps, args.schedule_steps) == (6, 20, 6)
  with pytest.raises(cli.UsageError, match="--warmup-steps 20"):
    flags.resolve(["--out", str(tmp_path / "run"), "--resume", "--warmup-steps", "20"])


def test_a_resumes_printed_config_pins_the_warmup_the_run_was_given(tmp_path, capsys):
  """The checkpoints list the flags the run was given (``run_config.config_of``): a
  --warmup-steps given then is printed as a value, and a new run from the file warms up
  as the resumed one did (not for the default 20)."""
  args = cli.parse_args(["--steps", "30", "--warmup-steps", "3"])
  config = run_config.config_of(args, 1, 8)
  assert "warmup_steps" in config["given"] and "lr" not in config["given"]
  _write_step(tmp_path / "run" / "checkpoints" / "6", config)
  resume = ["--out", str(tmp_path / "run"), "--resume"]
  lines = _printed_config(capsys, *resume).splitlines()
  assert "warmup_steps = 3" in lines
  path = _written(tmp_path, "r.toml", "\n".join(lines) + "\n")
  new = flags.resolve(["--config", path, "--out", str(tmp_path / "new")])
  assert (new.warmup_steps, derived_flags.warmup_in_use(new), new.steps) == (3, 3, 30)
  resumed = flags.resolve([*resume, "--steps", "40"])  # given on resume: compared, not saved
  assert resumed.given == ["out", "resume", "steps", "warmup_steps"]
  refused, _ = run_config.compare(config, run_config.config_of(resumed, 1, 8))
  assert refused == []


def test_the_same_folder_written_another_way_is_no_change(tmp_path, monkeypatch):
  """The run's folders are stored absolute and normalised, links resolved: a resume naming the
  same folder as ../x/run, by its absolute path or through a link lists no change (it listed
  --out ../x/run -> /abs/x/run and --checkpoint-dir as changed); another folder is listed."""
  tmp_path = pathlib.Path(os.path.realpath(tmp_path))
  run = tmp_path / "x" / "run"
  run.mkdir(parents=True)
  (tmp_path / "link").symlink_to(tmp_path / "x")
  (tmp_path / "work").mkdir()
  monkeypatch.chdir(tmp_path / "work")
  config = lambda *argv: run_config.config_of(cli.parse_args(list(argv)), 1, 8)
  saved = config("--out", "../x/run", "--checkpoint-dir", "../x/run/checkpoints")
  assert saved["out"] == str(run) and saved["checkpoint_dir"] == str(run / "checkpoints")
  for out in (str(run), f"{tmp_path}/x/./run/", str(tmp_path / "link" / "run")):
    assert run_config.compare(saved, config("--out", out, "--checkpoint-dir",
                                            f"{out}/checkpoints")) == ([], [])
  other = config("--out", "../x/other", "--checkpoint-dir", "../x/run/checkpoints")
  assert run_config.compare(saved, other) == ([], [f"--out {run} -> {tmp_path / 'x' / 'other'}"])


def test_a_resumes_printed_config_reads_back_with_and_without_resume(tmp_path, capsys):
  """A run saved --steps 6 with the default --warmup-steps 20 (shortened to 5): its resume's
  printed config pins the saved flags but the warmup, which the resume treats as a default,
  so the file reads back with --resume (the same flags) and without (the same run)."""
  _save_config(tmp_path / "run", cli.parse_args(["--steps", "6", "--optimizer", "muon"]))
  resume = ["--out", str(tmp_path / "run"), "--resume"]
  toml = _printed_config(capsys, *resume)
  lines = toml.splitlines()
  assert "# warmup_steps = 5  # the run's saved 20, at most the schedule's horizon - 1" in lines
  assert "lr = 0.03" in lines and "schedule_steps = 6" in lines  # saved: pinned
  path = _written(tmp_path, "r.toml", toml)
  assert _printed_config(capsys, "--config", path, *resume) == toml
  assert run_config.flags_of(flags.resolve(["--config", path, *resume])) == run_config.flags_of(
      flags.resolve(resume))
  new = ["--out", str(tmp_path / "new")]
  assert run_config.flags_of(flags.resolve(["--config", path, *new])) == run_config.flags_of(
      flags.resolve([*new, "--steps", "6", "--optimizer", "muon"]))


def test_a_warning_while_planning_leaves_stderr_to_a_later_usage_error(tmp_path, capsys):
  """Shampoo's Gram statistics of a model-sharded dimension replicate, which the state plan
  warns of (one ReplicatedStateWarning, a line per leaf). The warning was re-shown on stderr
  with its source line, so a usage error found later (a resume's changed flag) printed 30
  lines on stderr. The warning is now a note on stdout, and the usage error stderr's one
  line."""
  out = tmp_path / "run"
  argv = [*h.TINY, "--cpu-devices", "0", "--out", str(out), "--optimizer", "shampoo",
          "--eval-every", "0", "--checkpoint-every", "1"]
  assert train.main([*argv, "--steps", "1"]) == 0
  printed = capsys.readouterr()
  assert printed.err == ""
  assert "warning: ReplicatedStateWarning: these optimizer-state leaves are less sharded" \
      in printed.out
  assert train.main([*argv, "--steps", "2", "--resume", "--seed", "1"]) == cli.EXIT_USAGE
  printed = capsys.readouterr()
  assert printed.err.startswith("error: --resume: the flags differ") and \
      printed.err.count("\n") == 1, printed.err
