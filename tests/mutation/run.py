"""Mutation testing of the math core (issue 29). Not part of CI: about two hours on 2 cores.

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
that decides to raise is mutated). ``core/client.py`` is limited to ``local_train``;
``privacy.py``, ``dp_sgd.py``, ``robust.py`` and ``core/adversary.py`` leave out their CLI
glue (flag validation, spec parsing, summary fields), as ``MODULES`` says for each.

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
PRIVACY, DP_SGD, ROBUST = (f"tests/test_{m}.py::" for m in ("privacy", "dp_sgd", "robust"))
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
    "aggregators": ("fedjax_inv/aggregation/aggregators.py", "*", [
        "tests/test_aggregators.py", "tests/test_properties.py"] + [MASKED + t for t in (
            "test_geometric_mean_aggregator", "test_gma_and_mask_aggregators",
            "test_masking_aggregator_carry_mask", "test_outer_product_geo_stats",
            "test_summed_geo_stats", "test_sign_agreement")] + ["tests/test_fedgma.py"]),
    "penalties": ("fedjax_inv/algorithms/penalties.py", "*", [
        "tests/test_penalties.py"] + [MASKED + t for t in (
            "test_cross_entropy_binary", "test_cross_entropy_multiclass", "test_mse",
            "test_irm_v1_binary", "test_irm_v1_multiclass", "test_irm_v1_mse",
            "test_per_sample_irm_v1", "test_fishr_grad_variance_binary",
            "test_fishr_grad_variance_multiclass", "test_l2r", "test_fedsr_cmi_term",
            "test_penalties_zero_total_weight")]),
    # DP-FedAvg's math: clipping, the noise stage, adaptive clipping, the wiring and the
    # accounting. Left out: DPSettings.check (the CLI flags' validation), record /
    # not_covered / resolve (summary.json's fields and glue), is_number / quiet_epsilon.
    "privacy": ("fedjax_inv/privacy/client_dp.py", "clipped_mean,dp_component,apply,_adaptive,"
                "dp_event,_accountant,epsilon,solve_noise", [PRIVACY + t for t in (
                    "test_clipped_mean_finalize_and_the_adaptive_lift",
                    "test_dp_noise_stage_adds_sigma_clip_over_e_from_the_round_key",
                    "test_adaptive_dp_component_message_sum_and_clip_update",
                    "test_apply_wires_the_aggregator_the_noise_and_the_hparams",
                    "test_adaptive_count_noise_must_exceed_half_sigma",
                    "test_adaptive_without_noise_adds_no_noise_anywhere",
                    "test_epsilon_of_one_round_and_of_sigma_one",
                    "test_solve_noise_of_a_reachable_target_on_the_grid_is_exact",
                    "test_solve_noise_is_the_bisection",
                    "test_clipping_bounds_every_norm_and_keeps_small_updates",
                    "test_epsilon_edge_cases", "test_epsilon_equals_dp_accounting_called_directly",
                    "test_epsilon_equals_pfl_research", "test_adaptive_noise_split_and_its_checks",
                    "test_what_dp_covers_is_recorded_and_non_mean_servers_are_refused",
                    "test_a_dp_round_equals_a_numpy_loop",
                    "test_adaptive_clip_update_equals_its_formula_on_a_numpy_loop",
                    "test_noise_std_is_sigma_clip_over_the_expected_cohort")]),
    # DP-SGD's clipping and noise, the estimator, the wiring and the per-example
    # accounting; DPSGDSettings.check (the CLI flags' validation) left out.
    "dp_sgd": ("fedjax_inv/privacy/dp_sgd.py", "clip_and_noise,dp_sgd_component,apply,"
               "client_epsilon,record", [DP_SGD + t for t in (
                   "test_clip_and_noise_draws_the_documented_noise",
                   "test_estimator_clips_each_example_of_the_step",
                   "test_apply_wires_the_component_and_names_what_it_refuses",
                   "test_client_epsilon_at_sigma_one_and_for_tiny_clients",
                   "test_record_is_the_documented_summary",
                   "test_clip_and_noise_is_the_formula_and_every_clipped_norm_is_at_most_c",
                   "test_noise_std_is_sigma_c_over_the_batch_size",
                   "test_epsilon_equals_dp_accounting_called_directly",
                   "test_record_reports_the_worst_client",
                   "test_algorithms_it_cannot_cover_are_refused",
                   "test_no_clip_and_no_noise_is_plain_fedavg_over_a_full_batch",
                   "test_clipped_steps_equal_the_python_loop[scan]")]),
    # The robust aggregators, bucketing, Krum's cohort check and FedNova. Left out: parse
    # (the --aggregator spec's parsing) and configure (CLI glue: hparams and checks).
    "robust": ("fedjax_inv/aggregation/robust.py", "_gathered,_sorted_present,median,trimmed_mean,"
               "krum_scores,krum,geometric_median,centered_clip,bucketing,check_cohort,fednova",
               [ROBUST + t for t in (
                   "test_robust_aggregators_are_named_and_gathered",
                   "test_constructor_checks_at_their_bounds",
                   "test_check_cohort_is_strict_and_counts_buckets",
                   "test_fednova_lift_and_finalize_are_the_formula",
                   "test_few_present_clients_with_unit_weights",
                   "test_krum_scores_on_close_points_are_the_python_loop",
                   "test_geometric_median_defaults_and_few_steps_are_weiszfeld",
                   "test_centered_clip_and_trimmed_mean_defaults",
                   "test_bucketing_with_unit_weights_and_the_default_key",
                   "test_bucketing_nested_and_around_any_gathered_aggregator",
                   "test_median_is_numpy_median", "test_trimmed_mean_is_scipy_trim_mean",
                   "test_krum_and_multi_krum_are_the_python_loop",
                   "test_geometric_median_minimizes_the_summed_distances",
                   "test_centered_clipping_is_its_formula",
                   "test_bucketing_averages_shuffled_buckets_then_aggregates",
                   "test_bad_settings_are_named",
                   "test_robust_aggregator_in_the_engine_equals_the_loop[median]",
                   "test_fednova_equals_fedavg_with_equal_steps_and_normalizes_unequal_ones")]),
    # The attacks and participation draws. Left out: _fraction and the check methods of
    # Attack / Participation (the CLI flags' validation).
    "adversary": ("fedjax_inv/core/adversary.py", "masks_slots,attackers,available_sample,"
                  "straggler_steps,flip_labels,alie_z,apply_attack", [ROBUST + t for t in (
                      "test_masks_slots_says_whether_a_slot_can_be_empty",
                      "test_flip_labels_maps_y_to_k_minus_1_minus_y",
                      "test_alie_z_is_baruch_et_al",
                      "test_attackers_are_the_first_of_the_documented_permutation",
                      "test_available_sample_draws_the_cohort_from_the_online_clients",
                      "test_straggler_steps_is_the_documented_draw",
                      "test_apply_attack_is_each_formula_on_the_stack",
                      "test_attack_equals_the_python_loop[sign_flip]",
                      "test_attack_equals_the_python_loop[label_flip]",
                      "test_participation_equals_the_python_loop[scan-dropout]",
                      "test_participation_equals_the_python_loop[scan-stragglers_keep]",
                      "test_participation_equals_the_python_loop[scan-stragglers_drop]",
                      "test_availability_draws_the_cohort_from_online_clients")]),
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
         "- tests (pytest -x, in this order): " + ", ".join(f"`{t}`" for t in tests),
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
