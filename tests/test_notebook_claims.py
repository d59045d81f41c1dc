"""The notebooks' saved outputs against the project's performance claims (reads the saved
notebook JSON and the committed benchmark files; executes nothing).

Notebook 04 (``notebooks/04_large_scale_simulation.ipynb``) prints two kinds of numbers:

* **Measured when it was executed** (``notebooks/execute.py``), one machine-readable line
  ``auto vs the Python loop, measured now (backend=cpu): C=10 1.41x, C=100 1.52x, ...``
  (the harness's ``ratio_vs_loop`` of the ``auto`` row: loop median round time / auto's).
  The claim for this workload (FedAvg, MLP 784-128-10, 5 local steps of 32) is that on a
  CPU ``auto`` matches or beats the engine's own per-client loop of jitted updates (the
  committed idle-machine runs give 1.17-1.92x, ``benchmarks/results_*.json``; on a GPU it is
  tens of times the loop). Every saved ratio must be >= ``MIN_RATIO`` = 0.9, in every
  notebook that prints such a line. The 10 % tolerance is the run-to-run drift of one row
  on the same idle 2-core machine (``benchmarks/RESULTS.md``: the same command a quarter
  hour apart differs by up to 10 %; back-to-back ``bench --quick`` rows 1.17 vs 1.22, 1.29
  vs 1.35, 1.30 vs 1.43): "matches" means within that band. A saved ratio below it
  contradicts the claim: either the notebook was executed on a loaded machine (re-execute
  it on a quiet one) or the engine got slower than its loop (fix the engine, or the claim).
* **The committed benchmark rows** (section "Measured on the project's machines"), lines
  ``[committed TAG] C=... name=value ...``: every number must equal the committed JSON in
  ``benchmarks/``, recomputed here from the files (client updates/s to 0.1, ratios to
  0.01), every MLP FedAvg cohort of those files must be printed, and the machine and date
  printed must be the files' own.
"""
import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NB_DIR = ROOT / "notebooks"
BENCH = ROOT / "benchmarks"
NB04 = "04_large_scale_simulation.ipynb"
MIN_RATIO = 0.9

LIVE = re.compile(r"^auto vs the Python loop, measured now \(backend=(\w+)\): (.*)$", re.M)
COMMITTED = re.compile(r"^\[committed (\w+)\] C=(\d+) (.*)$", re.M)
# The files the notebook's committed section reads (the same paths, relative to benchmarks/).
FILES = {"cpu": "results_side_by_side/ours.json", "pfl": "results_side_by_side/pfl.json",
         "flower": "results_side_by_side/flower.json", "cpu_10k": "results_mlp.json",
         "gpu": "gpu/h200_short_mlp.json"}


def _stream_text(name: str) -> str:
  nb = json.loads((NB_DIR / name).read_text())
  return "".join("".join(o.get("text", "")) for c in nb["cells"] if c["cell_type"] == "code"
                 for o in c["outputs"] if o["output_type"] == "stream")


def _doc(key: str) -> dict:
  return json.loads((BENCH / FILES[key]).read_text())


def _upd(key: str, impl: str) -> dict:
  """{C: client updates/s} of the file's MLP FedAvg rows whose impl is ``impl`` or, for the
  peers' versioned names ("pfl 0.6.0 (...)"), starts with ``impl + ' '``."""
  out = {}
  for r in _doc(key)["rows"]:
    if (r["workload"] == "mlp_fedavg" and r.get("client_updates_per_s")
        and (r["impl"] == impl or r["impl"].startswith(impl + " "))):
      out[r["clients"]] = r["client_updates_per_s"]
  return out


def _expected() -> dict:
  """{(tag, C): {name: printed value}} recomputed from the committed files."""
  series = {"cpu": dict(auto=_upd("cpu", "auto"), loop=_upd("cpu", "loop"),
                        **{"pfl-research": _upd("pfl", "pfl"), "flower": _upd("flower", "flower")}),
            "cpu_10k": dict(auto=_upd("cpu_10k", "auto"), loop=_upd("cpu_10k", "loop")),
            "gpu": dict(auto=_upd("gpu", "auto"), loop=_upd("gpu", "loop"))}
  out = {}
  for tag, s in series.items():
    assert s["auto"], f"{tag}: no auto rows in the committed file"
    for C, a in s["auto"].items():
      vals = {name: f"{pts[C]:.1f}" for name, pts in s.items()}
      vals.update({f"auto/{name}": f"{a / pts[C]:.2f}" for name, pts in s.items()
                   if name != "auto"})
      out[(tag, C)] = vals
  return out


def _live_ratios(text: str) -> list[tuple[str, int, float | None]]:
  out = []
  for backend, rest in LIVE.findall(text):
    items = re.findall(r"C=(\d+) (?:([\d.]+)x|skipped)", rest)
    assert items, f"unparsable ratio line: {rest!r}"
    out += [(backend, int(C), float(v) if v else None) for C, v in items]
  return out


def test_notebook_04_prints_its_measured_ratio():
  ratios = _live_ratios(_stream_text(NB04))
  assert ratios, f"{NB04}: no 'auto vs the Python loop, measured now' line in its outputs"
  meta = json.loads((NB_DIR / NB04).read_text())["metadata"]["fedjax_inv"]
  assert {b for b, _, _ in ratios} == {meta["backend"]}
  assert [C for _, C, _ in ratios] == [10, 100, 1000]  # the small size's cohorts
  assert all(v is not None for _, _, v in ratios), ratios


@pytest.mark.parametrize("name", sorted(p.name for p in NB_DIR.glob("*.ipynb")))
def test_saved_auto_vs_loop_ratio_does_not_contradict_the_claim(name):
  for backend, C, ratio in _live_ratios(_stream_text(name)):
    if ratio is None:
      continue
    assert ratio >= MIN_RATIO, (
        f"{name}: saved 'auto vs the Python loop' at C={C} on {backend} is {ratio:.2f}x < "
        f"{MIN_RATIO}: contradicts 'auto matches or beats its own loop'. Executed on a "
        "loaded machine? Re-run `python notebooks/execute.py "
        f"{name}` on a quiet one (1-minute load < 1.5), or investigate the engine.")


def test_notebook_04_committed_rows_equal_the_committed_files():
  text = _stream_text(NB04)
  printed = {}
  for tag, C, rest in COMMITTED.findall(text):
    assert (tag, int(C)) not in printed, f"[committed {tag}] C={C} printed twice"
    printed[(tag, int(C))] = dict(re.findall(r"([\w/-]+)=([\d.]+)", rest))
  expected = _expected()
  assert sorted(printed) == sorted(expected), "the committed cohorts printed differ from the files'"
  for key, vals in expected.items():
    assert printed[key] == vals, (key, printed[key], vals)


def test_notebook_04_names_the_machines_and_dates_of_the_committed_files():
  text = _stream_text(NB04)
  for key in ("cpu", "cpu_10k", "gpu"):
    meta = _doc(key)["meta"]
    assert meta["date"] in text and meta["cpu"] in text and f"benchmarks/{FILES[key]}" in text
  assert _doc("gpu")["meta"]["device_kind"] in text
  assert f"pfl-research {_doc('pfl')['meta']['pfl']}" in text
  assert f"Flower {_doc('flower')['meta']['flwr']}" in text



@pytest.mark.parametrize("name", sorted(p.name for p in NB_DIR.glob("*.ipynb")))
def test_no_library_warnings_in_saved_outputs(name):
  """A saved notebook shows its results, not a library's warnings (``TqdmWarning:
  IProgress not found`` and the like): every ``...Warning:`` in an output fails."""
  nb = json.loads((NB_DIR / name).read_text())
  bad = [f"cell {i}: {m.group(0)}" for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
         for o in c["outputs"]
         for t in ["".join(o.get("text", "")), *("".join(v) for v in o.get("data", {}).values()
                                                if isinstance(v, (str, list)))]
         for m in re.finditer(r"\b\w*Warning: .{0,60}", t)]
  assert not bad, "re-execute on a quiet machine after fixing the cause: " + "; ".join(bad)
