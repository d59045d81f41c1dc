"""Executes the notebooks in place and stores their outputs (tables, figures), so that a
reader sees results without running anything.

Each notebook runs in a fresh kernel of this interpreter at ``--size`` (default ``small``:
what a CPU runs in a few minutes; the notebooks read it from ``FEDJAX_INV_NB_SIZE``). The
executed notebook is written back atomically with ``metadata.fedjax_inv``: the SHA-256 of
its code cells after the setup cell (``code_sha256``), the size, the date, the JAX version
and backend, and the machine. ``tests/test_notebooks.py`` fails when the committed code
cells no longer match that hash (outputs stale against the code) or when outputs are
missing: re-run this script after editing a notebook.

Usage:  python notebooks/execute.py [--size small|ci|large] [NAME.ipynb ...]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import pathlib
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent


def code_sha256(nb: dict) -> str:
  """SHA-256 of the notebook's code cells after the first (the setup cell, whose
  repository URL ``notebooks/set_repo.py`` rewrites), each cell's source joined."""
  cells = [c for c in nb["cells"] if c["cell_type"] == "code"][1:]
  src = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
         for c in cells]
  return hashlib.sha256(json.dumps(src).encode()).hexdigest()


def execute(path: pathlib.Path, size: str, timeout: int = 1800) -> dict:
  """Runs ``path`` in a fresh kernel at ``size``; writes it back with outputs. Returns
  the ``metadata.fedjax_inv`` record.

  Raises:
    nbclient.exceptions.CellExecutionError: a cell failed (the file is left unchanged).
  """
  import jax
  import nbclient
  import nbformat
  from fedjax_inv.benchmarks.harness import machine_info
  with tempfile.TemporaryDirectory() as tmp:
    spec = pathlib.Path(tmp) / "jupyter" / "kernels" / "fedjax-inv-exec"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fedjax_inv", "language": "python"}))
    os.environ["JUPYTER_PATH"] = str(pathlib.Path(tmp) / "jupyter")
    os.environ["FEDJAX_INV_NB_SIZE"] = size
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="fedjax-inv-exec",
                                     resources={"metadata": {"path": str(HERE)}})
    client.execute()
  nb.metadata.pop("widgets", None)
  record = dict(code_sha256=code_sha256(nb), size=size,
                executed=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                jax=jax.__version__, backend=jax.default_backend(),
                machine="{cpu}, {cores} cores".format(**machine_info()))
  nb.metadata["fedjax_inv"] = record
  nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                               "name": "python3"}
  tmp_out = path.with_suffix(".ipynb.tmp")
  nbformat.write(nb, tmp_out)
  os.replace(tmp_out, path)
  return record


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("names", nargs="*", help="notebooks to run (default: all in notebooks/)")
  p.add_argument("--size", default="small", choices=("ci", "small", "large"))
  a = p.parse_args(argv)
  paths = [HERE / n for n in a.names] or sorted(HERE.glob("*.ipynb"))
  for path in paths:
    if not path.is_file():
      sys.exit(f"{path}: no such notebook; choose from "
               f"{sorted(q.name for q in HERE.glob('*.ipynb'))}.")
  for path in paths:
    rec = execute(path, a.size)
    print(f"{path.name}: executed at size {a.size!r} ({rec['machine']}, JAX {rec['jax']})",
          flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
