"""The notebooks in notebooks/: stored with the outputs of their committed code (at least
one figure each; the code cells' hash in ``metadata.fedjax_inv`` equals the committed
code's, so outputs cannot go stale), a Colab install cell that never installs when
fedjax_inv is importable, the repository named in one place (``notebooks/set_repo.py``),
and each one executed end to end at its CI size (``FEDJAX_INV_NB_SIZE=ci``) in a fresh
kernel of this interpreter."""
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

NB_DIR = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = ["01_quickstart.ipynb", "02_invariance_methods.ipynb",
             "03_bring_your_own_data.ipynb", "04_large_scale_simulation.ipynb",
             "05_write_an_algorithm.ipynb"]


PLOTS = NOTEBOOKS  # every notebook shows at least one figure


def _load(name):
  return json.loads((NB_DIR / name).read_text())


def test_every_notebook_is_there():
  assert sorted(p.name for p in NB_DIR.glob("*.ipynb")) == sorted(NOTEBOOKS)


def _code_hash(nb):
  # Written here, not imported from notebooks/execute.py: the code cells after the setup
  # cell (whose REPO_URL set_repo.py rewrites), each cell's source joined, as JSON.
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"][1:]
  return hashlib.sha256(json.dumps(["".join(c["source"]) for c in cells]).encode()).hexdigest()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_stored_notebook_shows_the_outputs_of_its_code(name):
  nb = _load(name)
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  meta = nb["metadata"].get("fedjax_inv")
  assert meta, f"{name}: never executed by notebooks/execute.py; run it and commit"
  assert meta["code_sha256"] == _code_hash(nb), (
      f"{name}: the code changed since its outputs were made; re-run "
      f"`python notebooks/execute.py {name}` and commit the result")
  assert meta["size"] == "small", meta
  for c in code[1:]:
    assert c.get("execution_count") is not None, f"{name}: a code cell was not executed"
  outputs = [o for c in code for o in c["outputs"]]
  assert not [o for o in outputs if o["output_type"] == "error"], f"{name}: stored error"
  assert any("image/png" in o.get("data", {}) for o in outputs), f"{name}: no figure"
  text = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
  assert "SIZE='small'" in text, f"{name}: not executed at the small size"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_colab_install_cell(name):
  nb = _load(name)
  code = [c for c in nb["cells"] if c["cell_type"] == "code"]
  first = "".join(code[0]["source"])
  assert first.lstrip().startswith("# Setup") and 'REPO_URL = "' in first
  assert 'find_spec("fedjax_inv") is None' in first  # install only when not importable
  assert 'SIZE = os.environ.get("FEDJAX_INV_NB_SIZE"' in "".join(code[1]["source"])
  badge = "".join(nb["cells"][0]["source"])
  assert re.search(r"colab\.research\.google\.com/github/[\w.-]+/fedjax_inv/blob/main/"
                   rf"notebooks/{re.escape(name)}\)", badge)


def test_set_repo_names_the_repository_everywhere_at_once(tmp_path):
  root = NB_DIR.parent
  for f in ["pyproject.toml", "README.md"]:
    shutil.copy(root / f, tmp_path / f)
  shutil.copytree(NB_DIR, tmp_path / "notebooks")
  old = re.search(r'^Repository = "https://github\.com/([\w.-]+/[\w.-]+)"',
                  (root / "pyproject.toml").read_text(), re.M).group(1)
  r = subprocess.run([sys.executable, str(tmp_path / "notebooks" / "set_repo.py"),
                      "acme/fedjax_inv"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  for f in [tmp_path / "pyproject.toml", tmp_path / "README.md",
            *sorted((tmp_path / "notebooks").glob("*.ipynb"))]:
    text = f.read_text()
    assert f"github.com/{old}" not in text and f"github/{old}/" not in text, f
  for name in NOTEBOOKS:
    nb = json.loads((tmp_path / "notebooks" / name).read_text())
    assert 'REPO_URL = "https://github.com/acme/fedjax_inv"' in "".join(
        [c for c in nb["cells"] if c["cell_type"] == "code"][0]["source"])
    assert "colab.research.google.com/github/acme/fedjax_inv/" in "".join(nb["cells"][0]["source"])
    assert nb["metadata"]["fedjax_inv"]["code_sha256"] == _code_hash(nb)  # still fresh
  assert 'Repository = "https://github.com/acme/fedjax_inv"' in (
      tmp_path / "pyproject.toml").read_text()
  bad = subprocess.run([sys.executable, str(tmp_path / "notebooks" / "set_repo.py"), "acme"],
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and "OWNER/NAME" in bad.stderr


@pytest.mark.slow
@pytest.mark.multiprocess  # each notebook runs in its own ipykernel process
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_end_to_end_at_ci_size(name, tmp_path, monkeypatch):
  nbformat = pytest.importorskip("nbformat")
  nbclient = pytest.importorskip("nbclient")
  pytest.importorskip("ipykernel")
  monkeypatch.setenv("FEDJAX_INV_NB_SIZE", "ci")
  monkeypatch.setenv("PIP_NO_INDEX", "1")  # belt and braces: nothing may be downloaded
  monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
  # A kernelspec of our own that runs this interpreter, whatever "python3" means elsewhere
  # on the machine (JUPYTER_PATH is searched first).
  spec = tmp_path / "jupyter" / "kernels" / "fedjax-inv-test"
  spec.mkdir(parents=True)
  (spec / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "fedjax_inv tests", "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  work = tmp_path / "work"
  work.mkdir()
  nb = nbformat.read(NB_DIR / name, as_version=4)
  # The kernel talks over Unix sockets, not TCP: a TCP port chosen free can be taken by a
  # process of another test (the multi-process runs bind ports) before the kernel binds it.
  from jupyter_client.manager import AsyncKernelManager
  sockets = tempfile.mkdtemp(prefix="nbk")  # short: a socket path has ~100 characters
  km = AsyncKernelManager(kernel_name="fedjax-inv-test", transport="ipc",
                          ip=os.path.join(sockets, "k"))
  client = nbclient.NotebookClient(nb, km=km, timeout=300, kernel_name="fedjax-inv-test",
                                   resources={"metadata": {"path": str(work)}})
  try:
    client.execute()
  finally:
    shutil.rmtree(sockets, ignore_errors=True)  # ours: made just above
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "skipping the install" in text
  assert "SIZE='ci'" in text
  assert not [o for o in outputs if o.output_type == "error"]
  if name in PLOTS:
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name}: no figure"
