"""The run's configuration, stored with every checkpoint, taken back and compared
on resume, and written or read as a --config file.

Every flag is stored but those of one invocation (``INVOCATION``: --resume,
--config, --print-config, --debug, and what ``cli.finish`` notes: which flags it
derived, and which the user gave, stored apart under ``given``: a resume's
--print-config pins a --warmup-steps the run was given and notes a default
one). A resume takes the saved flags back
(``inherited``) but where this invocation runs (``NOT_INHERITED``: --out,
--checkpoint-dir, the process and device flags); flags given again are
compared: one outside ``MAY_CHANGE`` must have the value it had when the
checkpoint was written: the model, the data order, the optimizer and the
learning-rate schedule (``--schedule-steps``, its horizon, included) define
the run. The flags in ``MAY_CHANGE`` only say where and how the run is laid
out, saved and reported (the mesh, the process count, ...), or how far it goes
(``--steps``), and are printed when they differ. (``--skip-nonfinite`` wraps
the optimizer, so its state, and must match.)
"""

import argparse
import json
import os
import pathlib
import tomllib

from launch import cli
from launch import derived_flags
from launch.errors import flag

__all__ = ["INVOCATION", "MAY_CHANGE", "NOT_INHERITED", "compare", "config_of",
           "defines_run", "describe_changes", "flags_of", "inherited", "read_file",
           "title", "to_toml"]

INVOCATION = frozenset({"resume", "config", "print_config", "debug", "out_is_newest_run",
                        "derived", "given"})
NOT_INHERITED = frozenset({  # where this invocation runs: the paths, the processes and devices
    "out", "checkpoint_dir", "cpu_devices", "coordinator", "num_processes", "process_id",
    "auto_distributed", "init_timeout", "heartbeat_timeout"})

_HOW_PROCESSES_JOIN = frozenset({  # how this invocation's processes meet, not the run: not compared
    "coordinator", "process_id", "init_timeout", "heartbeat_timeout"})

MAY_CHANGE = frozenset({
    "steps", "mesh", "axis_types", "rules", "zero", "out", "checkpoint_dir", "checkpoint_every",
    "keep_checkpoints", "log_every", "cpu_devices",
    "coordinator", "num_processes", "process_id", "auto_distributed", "init_timeout",
    "heartbeat_timeout", "process_count", "device_count", "eval_every", "eval_batches",
    "sample_every", "profile_steps", "peak_tflops", "state_memory_kind",
})


def flags_of(args: argparse.Namespace) -> dict:
  """The run's flags (all but ``INVOCATION``) as JSON values."""
  return json.loads(json.dumps({k: v for k, v in vars(args).items() if k not in INVOCATION}))


def config_of(args: argparse.Namespace, process_count: int, device_count: int) -> dict:
  """The run's flags (``flags_of``) plus the process and device counts, and
  under ``given`` the names of the flags the user gave (``cli.finish``;
  not a flag, never compared).

  A constant schedule has no horizon, so its ``schedule_steps`` is None.
  --out and --checkpoint-dir are stored absolute, symbolic links resolved
  (``_folder``), so a resume naming the same folder another way lists no change.
  """
  config = flags_of(args)
  for name in ("out", "checkpoint_dir"):  # the folder itself, however the path was written
    config[name] = _folder(config[name])
  if args.schedule == "constant":
    config["schedule_steps"] = None
  config.update(process_count=process_count, device_count=device_count, given=args.given)
  return config


def _folder(path: str | None) -> str | None:
  """A local folder's path absolute, normalised and with symbolic links resolved (the same
  folder, the same string); a URL (gs://...) or None as it is."""
  return path if path is None or "://" in path else os.path.realpath(path)


def _default(name: str):
  value = cli.parser().get_default(name)
  return json.loads(json.dumps(value))


def compare(saved: dict, current: dict) -> tuple[list[str], list[str]]:
  """(changes not allowed, allowed changes), each as ``--flag old -> new``.

  A flag missing from ``saved`` (added to the job later) counts as its default; how the
  processes join (``_HOW_PROCESSES_JOIN``: the launcher picks a new --coordinator port each
  time) is not compared.
  """
  refused, allowed = [], []
  for name in sorted(set(current) - {"given"} - _HOW_PROCESSES_JOIN):
    old = saved.get(name, _default(name))
    new = current[name]
    if _same(name, old, new):
      continue
    label = (name.replace("_", " ") if name in ("process_count", "device_count")
             else flag(name))
    change = f"{label} {_show(old)} -> {_show(new)}"
    (refused if defines_run(name) else allowed).append(change)
  return refused, allowed


def _same(name: str, old, new) -> bool:
  """Whether a flag's saved and current values are the same: --opt's keywords in any order
  (their order does not change the run; a keyword given twice is refused by the parser)."""
  if name == "opt" and isinstance(old, list) and isinstance(new, list):
    return sorted(map(tuple, old)) == sorted(map(tuple, new))
  return old == new


def _show(value) -> str:
  """A flag's value as the command line writes it: --opt's keywords as ``NAME=NUMBER``."""
  if value is None:
    return "(unset)"
  if isinstance(value, list):  # --opt's (name, number) pairs
    return ",".join(f"{name}={number}" for name, number in value) or "(none)"
  return str(value)


def describe_changes(refused: list[str], where: str) -> str:
  """The one-line error for flags that differ from the run being resumed."""
  return (f"--resume: the flags differ from the run in {where}: {'; '.join(refused)}."
          " Leave them out to keep the run's values, or start another run with a new --out")


def inherited(saved: dict) -> dict:
  """The saved flags a resume takes back, as the parser's values."""
  names = set(vars(cli.parser().parse_args([]))) - INVOCATION - NOT_INHERITED
  values = {k: v for k, v in saved.items() if k in names}
  if "opt" in values:
    values["opt"] = [tuple(pair) for pair in values["opt"]]
  return values


def _toml_value(value) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (int, float)):
    return repr(value)
  return json.dumps(value)


def to_toml(args: argparse.Namespace) -> str:
  """The run's flags as a --config file (unset flags left out). A flag derived
  from others and not given (``args.derived``, from ``cli.finish``) is a
  comment holding its resolved value and why: the file documents it without
  pinning it, so the flags given with the file derive it again."""
  lines = []
  for name, value in flags_of(args).items():
    if name in args.derived:
      resolved, why = args.derived[name]
      lines.append(f"# {name} = {_toml_value(resolved)}  # {why}")
    elif value is None or (name == "opt" and not value):
      continue
    elif name == "opt":
      pairs = ", ".join(f"{key} = {_toml_value(number)}" for key, number in value)
      lines.append(f"opt = {{ {pairs} }}")
    else:
      lines.append(f"{name} = {_toml_value(value)}")
  return "\n".join(lines) + "\n"


def _tokens(path: str, name: str, value, action) -> list[str]:
  """The command-line words of one entry of a --config file."""
  flag = action.option_strings[0]
  if name == "opt":
    return [word for entry in _opt_entries(path, value) for word in ("--opt", entry)]
  if action.nargs == 0:  # a switch: true or false
    if not isinstance(value, bool):
      raise cli.UsageError(f"--config {path}: {name} = {value!r}: must be true or false")
    negative = [s for s in action.option_strings if s.startswith("--no-")]
    return [flag] if value else negative[:1] if negative else []
  return [flag, str(value)]


def _opt_entries(path: str, value) -> list[str]:
  """The ``NAME=NUMBER`` words of a --config file's ``opt``: a table
  (``opt = { decay_rate = 0.8 }``, what ``--print-config`` writes), a list of
  ``[name, number]`` pairs (the checkpoint's JSON) or of ``"NAME=NUMBER"``
  strings (the command line's)."""
  if isinstance(value, dict):
    return [f"{key}={number}" for key, number in value.items()]
  if isinstance(value, list):
    if all(isinstance(e, str) for e in value):
      return list(value)
    if all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) for e in value):
      return [f"{key}={number}" for key, number in value]
  raise cli.UsageError(f"--config {path}: opt = {value!r}: must be a table of keyword = number"
                       " (opt = { decay_rate = 0.8 })")


def read_file(path: str) -> dict:
  """The flags a --config file (TOML, or JSON with a .json suffix) gives,
  checked like the command line's (``cli.explicit_flags``)."""
  try:
    text = pathlib.Path(path).read_text()
    data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
  except (OSError, ValueError) as e:
    raise cli.UsageError(f"--config {path}: cannot read it: {e}") from None
  if not isinstance(data, dict):
    raise cli.UsageError(f"--config {path}: must hold a table of flags (name = value, e.g."
                         f" lr = 0.01); it holds {json.dumps(data)[:60]}")
  parser = cli.parser()
  actions = {a.dest: a for a in parser._actions if a.option_strings}  # pylint: disable=W0212
  words, switches_off = [], []
  for key, value in data.items():
    name = key.replace("-", "_")
    if name not in actions or name in INVOCATION or name == "help":
      raise cli.UsageError(f"--config {path}: {key!r} is not a flag of the run (see"
                           " --print-config)")
    if value is None:
      continue
    tokens = _tokens(path, name, value, actions[name])
    if not tokens:
      switches_off.append(name)
    words += tokens
  try:
    given = cli.explicit_flags(words)
  except cli.UsageError as e:
    raise cli.UsageError(f"--config {path}: {e}") from None
  return {**given, **{name: False for name in switches_off}}


def defines_run(name: str) -> bool:
  """Whether the flag (or saved entry) ``name`` defines the run: a resume refuses to change it
  (``compare``)."""
  return name not in MAY_CHANGE and name != "given"


def _in_use(config: dict) -> dict:
  """The flags of ``config`` that define the run, with the values the run uses: the warmup of
  a warmup_cosine schedule as shortened (``derived_flags.warmup_in_use``), none for another
  schedule."""
  used = {name: value for name, value in config.items() if defines_run(name)}
  warmup = used.pop("warmup_steps", None)
  if used.get("schedule") == "warmup_cosine" and warmup is not None:
    used["warmup_steps"] = derived_flags.warmup_in_use(argparse.Namespace(**config))
  return used


def _units(used: dict) -> list[str]:
  """The command-line words of the flags ``used``, in the parser's order, a flag and its value
  as one unit (``--opt a=1``)."""
  units = []
  for action in cli.parser()._actions:  # pylint: disable=protected-access
    if used.get(action.dest) is None:
      continue
    words = _tokens("", action.dest, used[action.dest], action)
    step = 1 if action.nargs == 0 else 2
    units += [" ".join(words[i:i + step]) for i in range(0, len(words), step)]
  return units


def title(name: str, config: dict, width: int = 110) -> str:
  """The run's name and the flags that define it (``_in_use``) as a command line, for the plot:
  lines of at most ``width`` characters (or one flag), a flag never split from its value."""
  lines = [f"{name}:"]
  for unit in _units(_in_use(config)):
    if len(lines[-1]) + 1 + len(unit) > width:
      lines.append(unit)
    else:
      lines[-1] += " " + unit
  return "\n".join(lines)
