"""Sets the repository location once, everywhere it appears: the Colab badges and
``REPO_URL`` of every notebook, the README's notebook table and ``[project.urls]`` in
pyproject.toml. The current location is read from pyproject.toml's ``Repository`` URL.

Usage (when publishing):  python notebooks/set_repo.py OWNER/NAME   (e.g. acme/fedjax_inv)
"""
from __future__ import annotations

import os
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def current_slug(root: pathlib.Path = ROOT) -> str:
  """``owner/name`` of pyproject.toml's ``Repository = "https://github.com/owner/name"``.

  Raises:
    ValueError: no such line in pyproject.toml.
  """
  m = re.search(r'^Repository\s*=\s*"https://github\.com/([\w.-]+/[\w.-]+)"',
                (root / "pyproject.toml").read_text(), re.M)
  if not m:
    raise ValueError(f"{root / 'pyproject.toml'}: no [project.urls] Repository = "
                     '"https://github.com/OWNER/NAME" line to start from.')
  return m.group(1)


def set_repo(slug: str, root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  """Replaces the current ``owner/name`` by ``slug`` in the files listed in the module
  docstring (atomically, file by file). Returns the files changed.

  Raises:
    ValueError: ``slug`` not of the form ``owner/name``.
  """
  if not re.fullmatch(r"[\w.-]+/[\w.-]+", slug):
    raise ValueError(f"{slug!r}: pass the repository as OWNER/NAME, e.g. acme/fedjax_inv.")
  old = current_slug(root)
  changed = []
  files = [root / "pyproject.toml", root / "README.md"] + sorted(
      (root / "notebooks").glob("*.ipynb"))
  for f in files:
    text = f.read_text()
    new = text.replace(f"github.com/{old}", f"github.com/{slug}").replace(
        f"colab.research.google.com/github/{old}/", f"colab.research.google.com/github/{slug}/")
    if new != text:
      tmp = f.with_name(f.name + ".tmp")
      tmp.write_text(new)
      os.replace(tmp, f)
      changed.append(f)
  return changed


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(__doc__)
  for f in set_repo(sys.argv[1]):
    print(f"updated {f.relative_to(ROOT)}")
