"""The README's library example runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
  text = README.read_text()
  match = re.search(r"<!-- readme-example -->\s*```python\n(.*?)```", text, re.S)
  assert match, "README.md lost its <!-- readme-example --> python block"
  return match.group(1)


def test_readme_example_runs(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  exec(compile(readme_example(), "README.md", "exec"), {})
  printed = capsys.readouterr().out
  assert "embed" in printed and "ZeRO" in printed
  assert (tmp_path / "ckpt").is_dir()
