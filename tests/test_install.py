"""The package as a user gets it: a wheel built from this checkout, installed with its
dependencies into a fresh virtualenv, then ``fedjax-inv list`` and a 2-round ``fedjax-inv
run``. On Python 3.12 when one can be found (the rest of the suite runs on 3.11, so this
one install covers the other supported version too), else on this interpreter.

Needs the package registry (pip). An interpreter that is missing is skipped with the reason.
"""
import glob
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]


def _interpreter(version: str):
  """A working ``python<version>``: this one, one on PATH, or a pyenv install."""
  if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
    return sys.executable
  candidates = [shutil.which(f"python{version}")]
  candidates += sorted(glob.glob(os.path.expanduser(
      f"~/.pyenv/versions/{version}*/bin/python{version}")))
  for exe in filter(None, candidates):
    r = subprocess.run([exe, "--version"], capture_output=True, text=True)
    if r.returncode == 0:
      return exe
  return None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  out = tmp_path_factory.mktemp("wheel")
  subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                  str(REPO)], check=True, capture_output=True, text=True, timeout=600)
  (whl,) = out.glob("fedjax_inv-*.whl")
  return whl


def test_wheel_installs_and_runs(wheel, tmp_path):
  exe = _interpreter("3.12") or _interpreter("3.11")
  if exe is None:
    pytest.skip("no Python 3.12 or 3.11 here (not on PATH, not under ~/.pyenv/versions): "
                "install one to test the wheel on it")
  venv = tmp_path / "venv"
  subprocess.run([exe, "-m", "venv", str(venv)], check=True, timeout=300)
  py = venv / "bin" / "python"
  r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], capture_output=True,
                     text=True, timeout=1200)
  assert r.returncode == 0, r.stderr[-3000:]
  # The suite's settings stay out, except its compilation cache (tests/conftest.py): the
  # two installs compile the same default run.
  env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_"))
         or k in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
  env["JAX_PLATFORMS"] = "cpu"
  cli = venv / "bin" / "fedjax-inv"
  listing = subprocess.run([str(cli), "list"], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
  assert listing.returncode == 0, listing.stderr[-3000:]
  assert "fedavg" in listing.stdout and "fishr_inter_geo" in listing.stdout
  out = tmp_path / "run"
  run = subprocess.run([str(cli), "run", "--rounds", "2", "--out", str(out)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["jax"]["version"] and (out / "metrics.jsonl").is_file()
  # The installed package, not this checkout, ran.
  where = subprocess.run([str(py), "-c", "import fedjax_inv; print(fedjax_inv.__file__)"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
  assert str(venv) in where.stdout, where.stdout
