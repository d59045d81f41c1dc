"""Mutation testing of the math core (issue 29). Not part of CI: about an hour on 2 cores.

The mutants are mutmut's (``mutmut==2.5.1``: ``list_mutations`` / ``mutate``, one operator
change per mutant: ``+``→``-``, ``<``→``<=``, ``0``→``1``, ``x``→``None``, ...). This
script runs them, because mutmut 2's own runner is sequential and mutmut 3 forks a process
that has already started JAX's thread pools. Each worker owns a scratch copy of the working
tree (tracked and untracked-not-ignored files), so the checkout is never mutated: it writes
one mutant into its copy, runs the module's tests there (``pytest -x``, fastest file
first, in a fresh interpreter), and puts the original back.

Scope (the same rule for every module): only lines inside functions (module-level aliases
and constants are not the math), no decorator lines (dropping ``@jax.jit`` is equivalent
by design), and no line inside a ``raise`` statement (an error message's text; the check
that decides to raise is mutated). ``core/client.py`` is limited to ``local_train``.

Status per mutant: ``killed`` (the tests failed or errored, or ran past the time limit),
``survived`` (the tests passed). Results persist in ``<dir>/<name>.state.json``: a killed
mutant stays killed, a survivor is run again when the module's test files change, so a
rerun after adding tests only re-checks the survivors. ``EQUIVALENT`` (``equivalent.py``)
names the survivors that no test can kill, with the reason; the score is
``killed / (total - equivalent)``. The report, ``tests/mutation/results/<name>.md``, lists
every survivor's diff.

Usage:
  python tests/mutation/run.py                      # every module, 2 workers
  python tests/mutation/run.py penalties --jobs 1   # one module
  python tests/mutation/run.py --report-only        # rewrite the reports from the state
"""
from __future__ import annotations

import argparse
import ast
import concurrent.futures as cf
import difflib
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

MASKED = "tests/test_masked_rows.py::"
MARKER = ".fedjax_inv_mutation_scratch"
# name: (module, functions ('*' = every function), tests fastest first). A surviving
# mutant costs the whole list, so it names the tests aimed at the module only (the
# padded-row tests of test_masked_rows.py that reach it, by node id).
MODULES = {
    "losses": ("fedjax_inv/core/losses.py", "*", [
        "tests/test_losses.py", "tests/test_masked_rows.py", "tests/test_engine_reference.py"]),
    "core_aggregator": ("fedjax_inv/core/aggregator.py", "*", [
        "tests/test_aggregators.py", "tests/test_properties.py", "tests/test_losses.py"]),
    "local_train": ("fedjax_inv/core/client.py", "local_train", [
        "tests/test_engine_reference.py", "tests/test_client_opt_state.py",
        # the gradient-estimator hook (FedILC's intra-silo geometric mean): engine vs loop
        "tests/test_fedilc.py::test_fedsgd_type_equals_python_loop[fishr_intra_geo-scan]"]),
    "aggregators": ("fedjax_inv/aggregators.py", "*", [
        "tests/test_aggregators.py", "tests/test_properties.py"] + [MASKED + t for t in (
            "test_geometric_mean_aggregator", "test_gma_and_mask_aggregators",
            "test_masking_aggregator_carry_mask", "test_outer_product_geo_stats",
            "test_summed_geo_stats", "test_sign_agreement")] + ["tests/test_fedgma.py"]),
    "penalties": ("fedjax_inv/penalties.py", "*", [
        "tests/test_penalties.py"] + [MASKED + t for t in (
            "test_cross_entropy_binary", "test_cross_entropy_multiclass", "test_mse",
            "test_irm_v1_binary", "test_irm_v1_multiclass", "test_irm_v1_mse",
            "test_per_sample_irm_v1", "test_fishr_grad_variance_binary",
            "test_fishr_grad_variance_multiclass", "test_l2r", "test_fedsr_cmi_term",
            "test_penalties_zero_total_weight")]),
}


def in_scope_lines(source: str, functions: str) -> set[int]:
  """1-based line numbers that may be mutated (module docstring: scope)."""
  tree = ast.parse(source)
  wanted = set(functions.split(","))
  inside, excluded = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      if "*" in wanted or node.name in wanted:
        inside.update(range(node.lineno, node.end_lineno + 1))
      for d in node.decorator_list:
        excluded.update(range(d.lineno, d.end_lineno + 1))
    if isinstance(node, ast.Raise):
      excluded.update(range(node.lineno, node.end_lineno + 1))
  return inside - excluded


def mutants(path: str, functions: str) -> list[dict]:
  """Every in-scope mutant of ``path``: ``{key, line, original, mutated, source}``."""
  import mutmut
  source = (REPO / path).read_text()
  lines = source.split("\n")
  scope = in_scope_lines(source, functions)
  out = []
  for mid in mutmut.list_mutations(mutmut.Context(source=source, filename=path)):
    if mid.line_number + 1 not in scope:
      continue
    mutated, n = mutmut.mutate(mutmut.Context(source=source, mutation_id=mid, filename=path))
    if n != 1 or mutated == source:
      continue
    new_lines = mutated.split("\n")
    diff = [l for l in difflib.unified_diff(lines, new_lines, lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    out.append(dict(key=f"L{mid.line_number + 1}:{mid.index}", line=mid.line_number + 1,
                    diff=diff, source=mutated))
  # The state is keyed by the diff (and its occurrence among equal diffs), not the line
  # number, so that results stay attached to their mutant when the file's lines move.
  seen: dict = {}
  for m in out:
    h = hashlib.sha1("\n".join(m["diff"]).encode()).hexdigest()[:12]
    seen[h] = seen.get(h, -1) + 1
    m["id"] = f"{h}#{seen[h]}"
  return out


def tests_hash(tests: list[str]) -> str:
  """Changes when the test selection or any of its files (or the oracle) changes."""
  h = hashlib.sha256("\n".join(tests).encode())
  for t in sorted({t.split("::")[0] for t in tests} | {"tests/conftest.py", "tests/reference.py"}):
    p = REPO / t
    h.update(t.encode() + (p.read_bytes() if p.exists() else b""))
  return h.hexdigest()[:16]


def scratch_copy(dest: pathlib.Path) -> None:
  """Copies the working tree's tracked and untracked-not-ignored files into ``dest``."""
  files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                         capture_output=True, check=True).stdout.split(b"\0")
  for f in files:
    if not f:
      continue
    src = REPO / f.decode()
    if src.is_file():
      (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(src, dest / f.decode())


def run_tests(work: pathlib.Path, tests: list[str], timeout: float) -> tuple[str, float]:
  env = dict(os.environ, PYTHONPATH=str(work), JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=str(work.parent / "jax-cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  t0 = time.perf_counter()
  try:
    r = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                        *tests], cwd=work, env=env, capture_output=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return "killed", time.perf_counter() - t0  # the mutant made the tests hang
  return ("survived" if r.returncode == 0 else "killed"), time.perf_counter() - t0


def write_atomic(path: pathlib.Path, text: str) -> None:
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, path)


def report(name: str, state: dict, muts: list[dict]) -> str:
  from equivalent import EQUIVALENT
  module, functions, tests = MODULES[name]
  eq = EQUIVALENT.get(name, {})
  st = state["mutants"]
  rows = [(m, st.get(m["id"], {}).get("status", "untested")) for m in muts]
  killed = sum(s == "killed" for _, s in rows)
  survivors = [m for m, s in rows if s == "survived"]
  equivalent = [m for m in survivors if tuple(m["diff"]) in eq]
  untested = sum(s == "untested" for _, s in rows)
  total = len(rows) - untested
  denom = total - len(equivalent)
  pct = f"{100.0 * killed / denom:.1f} %" if denom else "n/a"
  out = [f"# Mutation testing: `{module}`" + (f" (`{functions}`)" if functions != "*" else ""),
         "", f"- score: **{killed} / {denom} killed ({pct})**, excluding "
         f"{len(equivalent)} equivalent mutants; {len(rows)} mutants in scope"
         + (f", **{untested} not run yet**" if untested else ""),
         f"- tests (pytest -x, in this order): " + ", ".join(f"`{t}`" for t in tests),
         f"- generated by `python tests/mutation/run.py {name}` (mutmut 2.5.1's mutants); "
         f"last run {state.get('date', '?')}", ""]
  out.append(f"## Surviving mutants: {len(survivors) - len(equivalent)} not equivalent\n")
  for m in survivors:
    if tuple(m["diff"]) in eq:
      continue
    out += [f"- line {m['line']} (`{m['key']}`)", "  ```diff",
            *("  " + l for l in m["diff"]), "  ```"]
  out.append(f"\n## Equivalent mutants ({len(equivalent)})\n")
  for m in equivalent:
    out += [f"- line {m['line']}: {eq[tuple(m['diff'])]}", "  ```diff",
            *("  " + l for l in m["diff"]), "  ```"]
  return "\n".join(out) + "\n"


def run_module(name: str, root: pathlib.Path, workers: list[pathlib.Path], log) -> None:
  module, functions, tests = MODULES[name]
  muts = mutants(module, functions)
  state_path = root / f"{name}.state.json"
  state = json.loads(state_path.read_text()) if state_path.exists() else {"mutants": {}}
  th = tests_hash(tests)
  todo = [m for m in muts
          if state["mutants"].get(m["id"], {}).get("status") != "killed"
          and not (state["mutants"].get(m["id"], {}).get("status") == "survived"
                   and state["mutants"][m["id"]].get("tests_hash") == th)]
  original = (REPO / module).read_text()
  for w in workers:
    (w / module).write_text(original)
  if "baseline_s" not in state or state.get("baseline_hash") != th:
    status, secs = run_tests(workers[0], tests, timeout=3600)
    if status != "survived":
      sys.exit(f"{name}: the tests fail without any mutant; fix them first.")
    state.update(baseline_s=secs, baseline_hash=th)
  timeout = max(120.0, 10 * state["baseline_s"])
  log(f"{name}: {len(muts)} mutants in scope, {len(todo)} to run "
      f"(baseline {state['baseline_s']:.0f} s, limit {timeout:.0f} s)")
  lock = threading.Lock()
  free = list(workers)

  def one(m):
    with lock:
      w = free.pop()
    try:
      (w / module).write_text(m["source"])
      status, secs = run_tests(w, tests, timeout)
    finally:
      (w / module).write_text(original)
      with lock:
        free.append(w)
    with lock:
      state["mutants"][m["id"]] = dict(status=status, seconds=round(secs, 1),
                                       tests_hash=th, line=m["line"], diff=m["diff"])
      state["date"] = time.strftime("%Y-%m-%d %H:%M")
      write_atomic(state_path, json.dumps(state, indent=1))
      done = sum(1 for k in (x["id"] for x in todo) if k in state["mutants"]
                 and state["mutants"][k].get("tests_hash") == th)
      log(f"  {name} {m['key']:>9s} {status:8s} {secs:5.1f} s  ({done}/{len(todo)})")

  with cf.ThreadPoolExecutor(len(workers)) as ex:
    list(ex.map(one, todo))
  write_atomic(HERE / "results" / f"{name}.md", report(name, state, muts))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("names", nargs="*", help=f"modules (default all): {', '.join(MODULES)}")
  p.add_argument("--jobs", type=int, default=2, help="parallel workers (default 2)")
  p.add_argument("--dir", default=os.environ.get("MUTATION_DIR", "/tmp/fedjax_inv_mutation"),
                 help="scratch copies and state (default /tmp/fedjax_inv_mutation)")
  p.add_argument("--report-only", action="store_true")
  a = p.parse_args(argv)
  names = a.names or list(MODULES)
  for n in names:
    if n not in MODULES:
      p.error(f"unknown module {n!r}; choose from {', '.join(MODULES)}")
  if a.jobs < 1:
    p.error(f"--jobs {a.jobs}: use >= 1")
  root = pathlib.Path(a.dir)
  root.mkdir(parents=True, exist_ok=True)
  (HERE / "results").mkdir(exist_ok=True)
  log = lambda s: print(s, flush=True)  # noqa: E731
  if a.report_only:
    for n in names:
      state_path = root / f"{n}.state.json"
      state = json.loads(state_path.read_text()) if state_path.exists() else {"mutants": {}}
      write_atomic(HERE / "results" / f"{n}.md", report(n, state, mutants(*MODULES[n][:2])))
    return 0
  workers = []
  for i in range(a.jobs):
    w = root / f"worker{i}"
    if w.exists():
      if not (w / MARKER).exists():
        sys.exit(f"{w} exists and was not made by this script; choose another --dir.")
      shutil.rmtree(w)  # ours (the marker says so): a fresh copy of the tree every run
    w.mkdir()
    (w / MARKER).write_text("scratch copy made by tests/mutation/run.py\n")
    scratch_copy(w)
    workers.append(w)
  for n in names:
    run_module(n, root, workers, log)
  return 0


if __name__ == "__main__":
  sys.exit(main())
