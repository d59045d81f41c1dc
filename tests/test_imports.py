"""Issue 14: the package layout shows the architecture. Walks every import statement of
every module of fedjax_inv (module level and inside functions) and checks that

* no import cycle exists between modules (not even one hidden in a function body);
* ``fedjax_inv/core`` (the engine) imports nothing of the package outside ``core``;
* ``fedjax_inv/data`` (sources and partitioners) imports no task, algorithm or runner;
* ``fedjax_inv/tasks`` imports only ``core``, ``data``, ``models`` and ``tasks`` (issue
  22: no algorithm, no run layer; an algorithm's settings on a task are task data);
* ``fedjax_inv/runner/outputs.py`` (the output writer), ``fedjax_inv/algorithms/penalties.py`` and
  ``fedjax_inv/aggregation/aggregators.py`` import nothing of the package outside ``core``;
* the package list of pyproject.toml names every package folder (the harness in
  benchmarks/ installs as fedjax_inv.benchmarks);
* the public API's ``__all__`` names exist.
"""
import ast
import pathlib
import subprocess
import sys

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
  assert "fedjax_inv.core.engine" in g["fedjax_inv.runner.simulation"]
  assert "fedjax_inv.core.memory" in g["fedjax_inv.core.engine"]  # a function-level import
  assert "fedjax_inv.benchmarks.harness" in g["fedjax_inv.cli"]
  # a function-level import in a guarded layer
  assert "fedjax_inv.data.colored_mnist" in g["fedjax_inv.tasks.colored_mnist"]
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
  assert _cycles(_graph()) == []


def test_core_imports_only_core():
  bad = {m: sorted(d for d in deps if not d.startswith("fedjax_inv.core"))
         for m, deps in _graph().items() if m.startswith("fedjax_inv.core")}
  assert {m: d for m, d in bad.items() if d} == {}


def test_data_imports_no_tasks_algorithms_or_runners():
  upward = ("fedjax_inv.tasks", "fedjax_inv.algorithms", "fedjax_inv.runner.simulation",
            "fedjax_inv.runner.experiment", "fedjax_inv.cli", "fedjax_inv.eval")
  bad = {m: sorted(d for d in deps if d.startswith(upward))
         for m, deps in _graph().items() if m.startswith("fedjax_inv.data")}
  assert {m: d for m, d in bad.items() if d} == {}


def _within(module: str, packages) -> bool:
  return any(module == p or module.startswith(p + ".") for p in packages)


def _outside(allowed, modules) -> dict:
  """``{module: [its package imports outside the packages in allowed]}`` for every module
  of the graph within ``modules``, empty lists left out."""
  bad = {m: sorted(d for d in deps if not _within(d, allowed))
         for m, deps in _graph().items() if _within(m, modules)}
  return {m: d for m, d in bad.items() if d}


# What a task module may import. The run layer (what builds and runs experiments out of
# tasks and algorithms) and the algorithms are above it.
TASKS_MAY_IMPORT = ("fedjax_inv.core", "fedjax_inv.data", "fedjax_inv.models",
                    "fedjax_inv.tasks")
RUN_LAYER = ("fedjax_inv.runner.simulation", "fedjax_inv.runner.replicas",
             "fedjax_inv.runner.sweep",
             "fedjax_inv.runner.experiment", "fedjax_inv.runner.tuning", "fedjax_inv.cli",
             "fedjax_inv.runner.lodo", "fedjax_inv.runner.checkpoint")
# Evaluation (metrics, model selection, the LODO tables) is below the run layer: it reads
# models, client data and histories, and may use the output writer's small helpers.
EVAL_MAY_IMPORT = ("fedjax_inv.core", "fedjax_inv.eval", "fedjax_inv.runner.outputs")
# Known violations of the guards below, each to be removed with the import it names (a
# stale entry fails test_known_violations_still_exist, so the list cannot outlive a fix).
KNOWN: set = set()


def _unknown(bad: dict) -> dict:
  out = {m: [d for d in deps if (m, d) not in KNOWN] for m, deps in bad.items()}
  return {m: d for m, d in out.items() if d}


def test_known_violations_still_exist():
  g = _graph()
  assert [(m, d) for m, d in sorted(KNOWN) if d not in g.get(m, ())] == []


def test_tasks_import_only_core_data_models_tasks():
  """A task is data (clients, eval sets, model, defaults): no algorithm (the settings of
  FedILC's methods on a task are in ``tasks/fedilc_settings.py``), nothing of the run
  layer."""
  assert _unknown(_outside(TASKS_MAY_IMPORT, ("fedjax_inv.tasks",))) == {}


def test_outputs_penalties_aggregators_import_only_core():
  bad = _outside(("fedjax_inv.core",), ("fedjax_inv.runner.outputs",
                                        "fedjax_inv.algorithms.penalties",
                                        "fedjax_inv.aggregation.aggregators"))
  assert _unknown(bad) == {}


def test_eval_imports_only_core_eval_outputs():
  """``eval`` holds evaluation only: no runner (the leave-one-domain-out runner is
  ``fedjax_inv.runner.lodo``), no task or algorithm."""
  assert _unknown(_outside(EVAL_MAY_IMPORT, ("fedjax_inv.eval",))) == {}


def test_the_guards_see_a_violation():
  # guards against guards that cannot fail
  assert _outside(("fedjax_inv.core",), ("fedjax_inv.tasks.base",)) != {}  # imports models
  assert _unknown({"fedjax_inv.tasks.x": ["fedjax_inv.algorithms.fedilc"]}) != {}
  for m in RUN_LAYER + ("fedjax_inv.algorithms.fedilc", "fedjax_inv"):
    assert not _within(m, TASKS_MAY_IMPORT), m
    assert not _within(m, EVAL_MAY_IMPORT), m


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


def test_package_top_holds_only_init_and_cli():
  top = sorted(p.name for p in ROOT.glob("*.py"))
  assert top == ["__init__.py", "cli.py"], top


def test_importing_the_engine_loads_only_the_core():
  code = ("import sys, fedjax_inv.core.engine; "
          "print(sorted(m for m in sys.modules if m.startswith('fedjax_inv')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True, cwd=ROOT.parent).stdout
  loaded = ast.literal_eval(out.strip())
  assert loaded and all(m == "fedjax_inv" or m.startswith("fedjax_inv.core") for m in loaded), \
      loaded


def test_old_module_paths_warn_and_resolve_to_the_new_modules():
  import importlib
  import warnings
  import fedjax_inv
  for old, new in fedjax_inv.MOVED_MODULES.items():
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    assert module.__spec__.name == new
    assert any(issubclass(w.category, DeprecationWarning) and new in str(w.message)
               for w in caught), old
  with pytest.warns(DeprecationWarning, match="privacy.client_dp"):
    from fedjax_inv.privacy import clipped_mean  # noqa: F401
