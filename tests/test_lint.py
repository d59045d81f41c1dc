"""`ruff check` over the repository is clean (rules and exceptions: pyproject.toml's
[tool.ruff]): 2-space indentation, lines of at most 100 characters, double quotes,
pyflakes and bugbear."""
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _ruff() -> list:
  exe = shutil.which("ruff") or str(pathlib.Path(sys.executable).with_name("ruff"))
  if not pathlib.Path(exe).exists():
    pytest.fail("ruff is not installed; pip install -e '.[test]' installs it.")
  return [exe]


def test_ruff_check_is_clean():
  res = subprocess.run(_ruff() + ["check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_ruff_catches_a_violation(tmp_path):
  """The check is live: a file with single quotes and an unused import fails it."""
  bad = tmp_path / "bad.py"
  bad.write_text("import os\nx = 'single'\n")
  res = subprocess.run(_ruff() + ["check", "--no-cache", "--config",
                                  str(ROOT / "pyproject.toml"), str(bad)],
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 1
  assert "F401" in res.stdout and "Q000" in res.stdout


def test_each_constant_is_defined_once():
  """No two modules of the package define the same UPPER_CASE constant from a literal
  (a second module imports or aliases the first one's). ``NAME``, each algorithm module's
  own registry name, is the one convention exempt."""
  import ast
  import collections
  defs = collections.defaultdict(list)
  for path in sorted((ROOT / "fedjax_inv").rglob("*.py")):
    for node in ast.parse(path.read_text()).body:
      if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        continue
      literal = isinstance(node.value, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Constant))
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for t in targets:
        if literal and isinstance(t, ast.Name) and t.id.isupper() and t.id != "NAME":
          defs[t.id].append(str(path.relative_to(ROOT)))
  twice = {k: v for k, v in defs.items() if len(v) > 1}
  assert not twice, f"constants defined in more than one module: {twice}"
