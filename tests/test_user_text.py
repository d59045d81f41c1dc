"""What a user reads speaks to a user: no tracker numbers ("issue 26"), no "session", no
"main job", no "trial 0" in the README, the guides and API pages in docs/, the benchmark
results page, the notebooks (text, code and saved outputs), or any string of the package or
of the benchmark scripts (docstrings, which the API reference and ``--help`` render; help
texts; error messages). Comments are for developers and are not checked; ``--help`` is
checked as printed in tests/test_cli_help.py."""
import ast
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
INSIDER = re.compile(r"\b[Ii]ssues?\s+#?\d+|\b[Ss]essions?\b|\b[Mm]ain job\b|\b[Tt]rial 0\b")


def _hits(text: str, where: str) -> list[str]:
  return [f"{where}: ...{text[max(0, m.start() - 40):m.end() + 20]!r}..."
          for m in INSIDER.finditer(text)]


def test_the_pattern_finds_what_it_must():
  assert len(_hits("as issue 26 asked; in earlier sessions; the main job; trial 0", "x")) == 4
  assert not _hits("the first trial; tissue 3; the main jobs list", "x")


@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "CHANGELOG.md",
                                  ROOT / "benchmarks" / "RESULTS.md",
                                  *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_pages(path):
  assert not _hits(path.read_text(), str(path.relative_to(ROOT)))


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")),
                         ids=lambda p: p.name)
def test_notebooks(path):
  nb = json.loads(path.read_text())
  bad = []
  for i, cell in enumerate(nb["cells"]):
    texts = ["".join(cell["source"])]
    for out in cell.get("outputs", []):
      texts.append("".join(out.get("text", "")))
      texts.extend("".join(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    for t in texts:
      bad += _hits(t, f"{path.name} cell {i}")
  assert not bad


def _strings(path: pathlib.Path):
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      yield node.lineno, node.value


# The package, and the benchmark scripts (their docstrings are their `--help`; the tables
# they print go into benchmarks/RESULTS.md).
SOURCES = [*sorted((ROOT / "fedjax_inv").rglob("*.py")),
           *sorted((ROOT / "benchmarks").rglob("*.py"))]


def test_package_strings():
  """Docstrings, help texts and messages (string literals; f-strings' literal parts)."""
  bad = []
  for path in SOURCES:
    for line, s in _strings(path):
      bad += _hits(s, f"{path.relative_to(ROOT)}:{line}")
  assert not bad, "\n".join(bad)
