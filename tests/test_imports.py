"""Issue 14: the package layout shows the architecture. Walks every import statement of
every module of fedjax_inv (module level and inside functions) and checks that

* no import cycle exists between modules (not even one hidden in a function body);
* ``fedjax_inv/core`` (the engine) imports nothing of the package outside ``core``;
* ``fedjax_inv/data`` (sources and partitioners) imports no task, algorithm or runner;
* the package list of pyproject.toml names every package folder (the harness in
  benchmarks/ installs as fedjax_inv.benchmarks);
* the public API's ``__all__`` names exist.
"""
import ast
import pathlib

import pytest

import fedjax_inv
import fedjax_inv.benchmarks

ROOT = pathlib.Path(fedjax_inv.__file__).parent
# The benchmark harness lives in the repository's benchmarks/ and installs as
# fedjax_inv.benchmarks (pyproject.toml: package-dir).
BENCH = pathlib.Path(fedjax_inv.benchmarks.__file__).parent


def _modules() -> dict:
  mods = {}
  for f in ROOT.rglob("*.py"):
    rel = f.relative_to(ROOT.parent).with_suffix("")
    name = ".".join(rel.parts)
    if name.endswith(".__init__"):
      name = name[: -len(".__init__")]
    mods[name] = f
  for f in BENCH.glob("*.py"):  # the package's modules (not peers/, another environment)
    name = "fedjax_inv.benchmarks" + ("" if f.stem == "__init__" else "." + f.stem)
    mods[name] = f
  return mods


def _imports(name: str, path: pathlib.Path, mods: dict) -> set:
  """Package modules imported anywhere in ``path``. ``from pkg import sub`` counts as an
  import of ``pkg.sub`` only (not of ``pkg``'s ``__init__``) when ``sub`` is a module."""
  out = set()
  is_pkg = path.name == "__init__.py"
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names if a.name in mods)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = name.split(".")
        parts = parts if is_pkg else parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([base] if base else []))
      subs = [f"{base}.{a.name}" for a in node.names]
      if not all(s in mods for s in subs) and base in mods:
        out.add(base)
      out.update(s for s in subs if s in mods)
  out.discard(name)
  return out


def _graph():
  mods = _modules()
  return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(graph: dict) -> list:
  """Strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def test_the_walker_sees_imports_and_cycles():
  # guards against a walker that finds nothing (a test that cannot fail)
  g = _graph()
  assert "fedjax_inv.core.engine" in g["fedjax_inv.simulation"]
  assert "fedjax_inv.core.memory" in g["fedjax_inv.core.engine"]  # a function-level import
  assert "fedjax_inv.benchmarks.harness" in g["fedjax_inv.cli"]
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
  assert _cycles(_graph()) == []


def test_core_imports_only_core():
  bad = {m: sorted(d for d in deps if not d.startswith("fedjax_inv.core"))
         for m, deps in _graph().items() if m.startswith("fedjax_inv.core")}
  assert {m: d for m, d in bad.items() if d} == {}


def test_data_imports_no_tasks_algorithms_or_runners():
  upward = ("fedjax_inv.tasks", "fedjax_inv.algorithms", "fedjax_inv.simulation",
            "fedjax_inv.experiment", "fedjax_inv.cli", "fedjax_inv.eval")
  bad = {m: sorted(d for d in deps if d.startswith(upward))
         for m, deps in _graph().items() if m.startswith("fedjax_inv.data")}
  assert {m: d for m, d in bad.items() if d} == {}


def test_public_api():
  for name in fedjax_inv.__all__:
    assert hasattr(fedjax_inv, name), name
  for name in ("Algorithm", "Component", "Aggregator", "register", "map_reduce"):
    assert name in fedjax_inv.__all__


def test_pyproject_lists_every_package():
  """The packages are listed (the harness is mapped from benchmarks/), so a new package
  folder must be added there or a wheel would silently lack it."""
  tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
  conf = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
  folders = {".".join(f.parent.relative_to(ROOT.parent).parts)
             for f in ROOT.rglob("__init__.py")} | {"fedjax_inv.benchmarks"}
  assert set(conf["packages"]) == folders
  assert conf["package-dir"] == {"fedjax_inv.benchmarks": "benchmarks"}
