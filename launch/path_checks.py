"""Checks of the run's folders given as --out and --checkpoint-dir (``check_paths``), run
before anything reads or creates them: an empty path, a URL as --out, a URL whose scheme
etils.epath does not read or whose package is not installed (``url_packages``), a local path
blocked by a file (``blocking_part``) or one orbax would write elsewhere. Each is refused as
a ``UsageError`` naming the flag.
"""

import importlib.util
import os
import pathlib

from checkpoints.directory import orbax_rewrites
from launch.errors import UsageError
from launch.errors import flag

__all__ = ["blocking_part", "check_paths", "url_packages"]


def blocking_part(path: str) -> tuple[str, str] | None:
  """(the part of ``path``, what it is) that keeps a folder from being there: ``path`` or a
  folder above it that is a file, or a symbolic link to nothing; None when there is none."""
  for part in (pathlib.Path(path), *pathlib.Path(path).parents):
    if os.path.isdir(part):
      return None
    if os.path.islink(part) and not os.path.exists(part):
      return str(part), f"a symbolic link to {os.readlink(part)}, which does not exist"
    if os.path.exists(part):
      return str(part), "a file, not a folder"
  return None


def url_packages(scheme: str) -> tuple[str, ...]:
  """The packages through which etils.epath (which writes the checkpoints) reads
  ``scheme``:// paths, any one of them enough: the one fsspec's registry names for the
  scheme (gcsfs for gs://, s3fs for s3://), the one to install, then tensorflow (whose gfile
  epath prefers where it is installed)."""
  from fsspec.registry import known_implementations  # pylint: disable=import-outside-toplevel
  implementation = known_implementations.get(scheme, {}).get("class")
  return ((implementation.split(".")[0],) if implementation else ()) + ("tensorflow",)


def _readable_scheme(scheme: str) -> bool:
  """Whether etils.epath (which writes the checkpoints) makes a path of ``scheme``:// (it
  raised KeyError for schemes it does not know, GS:// included: schemes are matched as
  written)."""
  from etils import epath  # pylint: disable=import-outside-toplevel
  try:
    epath.Path(f"{scheme}://bucket")
  except KeyError:
    return False
  return True


def _check_url(spelled: str, path: str) -> None:
  """A URL whose scheme etils.epath does not read is refused (naming the lower-case scheme
  when that one is read); one read through packages none of which is installed
  (``url_packages``) is refused, naming the package and the command that installs it."""
  scheme, _, rest = path.partition("://")
  if not _readable_scheme(scheme):
    hint = (f"; write the scheme in lower case: {scheme.lower()}://{rest}"
            if scheme != scheme.lower() and _readable_scheme(scheme.lower()) else "")
    raise UsageError(f"{spelled} {path}: etils.epath (which writes the checkpoints) reads no"
                     f" {scheme}:// paths{hint}")
  packages = url_packages(scheme)
  if not any(importlib.util.find_spec(name) for name in packages):
    raise UsageError(f"{spelled} {path}: {scheme}:// paths need the package"
                     f" {packages[0]}, which is not installed: pip install {packages[0]}")


def check_paths(values: dict) -> None:
  """Refuses an --out or --checkpoint-dir in ``values`` that the job cannot use: empty, a
  URL as --out, a URL etils.epath cannot read (``_check_url``), a local path blocked by a
  file. Run before anything reads those folders (``launch.flags`` runs it on the given flags
  before a --resume reads the run's saved flags)."""
  for name in ("out", "checkpoint_dir"):
    path = values.get(name)
    if path is not None and not path.strip():
      raise UsageError(f"{flag(name)} {path!r}: an empty path; name a folder")
    if name == "out" and path is not None and "://" in path:
      raise UsageError(f"--out {path}: must be a local folder (the metrics, the plot, the logs"
                       " and the run's lock are written there as local files); keep the"
                       f" checkpoints in a bucket with --checkpoint-dir {path.rstrip('/')}"
                       "/checkpoints")
    if path is not None and "://" in path:
      _check_url(flag(name), path)
    blocked = blocking_part(path) if path is not None and "://" not in path else None
    if blocked is not None:
      part, what = blocked
      where = "" if part == str(pathlib.Path(path)) else f"{part} "
      raise UsageError(f"{flag(name)} {path}: {where}is {what}; name another folder")
  _refuse_checkpoints_among_run_files(values)
  _check_checkpoints_folder(values)


def _refuse_checkpoints_among_run_files(values: dict) -> None:
  """Refuses a new run's --checkpoint-dir that is the run folder itself: its step folders would
  lie among the run's files, where a resume without the flag looks for none (in
  --out/checkpoints). A --resume of a run that kept them so goes on."""
  out, checkpoint_dir = values.get("out"), values.get("checkpoint_dir")
  if (not values.get("resume") and out is not None and checkpoint_dir is not None
      and "://" not in checkpoint_dir
      and os.path.abspath(checkpoint_dir) == os.path.abspath(out)):
    raise UsageError(f"--checkpoint-dir {checkpoint_dir}: the run folder (--out) itself; keep"
                     f" the checkpoints in a folder of their own, e.g. --checkpoint-dir"
                     f" {os.path.join(out, 'checkpoints')} (where a run keeps them by default)")


def _check_checkpoints_folder(values: dict) -> None:
  """Refuses a local checkpoint folder (--checkpoint-dir, else --out, which holds them by
  default) that orbax would write elsewhere (``checkpoints.directory.orbax_rewrites``)."""
  name = "checkpoint_dir" if values.get("checkpoint_dir") is not None else "out"
  path = values.get(name)
  if path is not None and orbax_rewrites(path):
    raise UsageError(f"{flag(name)} {path}: orbax reads 'gs:/' in a local path as a gs:// URL"
                     " and cannot write the checkpoints there; for a bucket write gs://...,"
                     " for a local folder a path without 'gs:/'")
