"""The README's library example runs as pasted, in a fresh Python with no XLA_FLAGS."""

import os
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
  text = README.read_text()
  match = re.search(r"<!-- readme-example -->\s*```python\n(.*?)```", text, re.S)
  assert match, "README.md lost its <!-- readme-example --> python block"
  return match.group(1)


def test_readme_example_runs_as_pasted(tmp_path):
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(README.parent), env.get("PYTHONPATH")]))
  result = subprocess.run([sys.executable, "-c", readme_example()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "embed" in result.stdout and "ZeRO" in result.stdout
  assert (tmp_path / "ckpt").is_dir()
