"""The API reference builds: ``mkdocs build --strict`` over mkdocs.yml (the hand-written
pages in docs/ and the pages generated from the public docstrings by mkdocstrings). A
broken reference, a missing page or a docstring naming a parameter that the signature
lacks fails it."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_mkdocs_builds_strict(tmp_path):
  pytest.importorskip("mkdocs")
  pytest.importorskip("mkdocstrings_handlers.python")
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                      str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                     capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  page = (tmp_path / "site" / "api" / "running" / "index.html").read_text()
  assert "fedjax_inv.runner.simulation.run" in page and "checkpoint_every" in page
  assert (tmp_path / "site" / "ALGORITHMS" / "index.html").is_file()
