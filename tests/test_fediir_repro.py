"""experiments/fediir: model selection, the per-seed averages, the loader of the raw runs
(tables.py) and the spec that makes them (spec.yaml)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shlex

import pytest

from fedjax_inv.runner import config, spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = ROOT / "experiments" / "fediir"
_mod = importlib.util.spec_from_file_location("fediir_tables", HERE / "tables.py")
tables = importlib.util.module_from_spec(_mod)
_mod.loader.exec_module(tables)


def test_select_by_val_takes_best_validation_round_first_on_ties():
  hist = [{"round": 5, "val_accuracy": 0.5, "ood_accuracy": 0.4},
          {"round": 10, "val_accuracy": 0.8, "ood_accuracy": 0.3},
          {"round": 15, "val_accuracy": 0.8, "ood_accuracy": 0.9}]
  assert tables.select_by_val(hist) == {"round": 10, "val": 0.8, "test": 0.3}


def test_seed_avg_averages_holdouts_per_seed_and_drops_incomplete_seeds():
  def r(label, seed, h, acc):
    return {"label": label, "penalty_code": 0.0, "seed": seed, "holdout": h,
            "selected": {"test": acc}}
  res = {"holdouts": ["0", "75"],
         "runs": [r("fedavg", 0, "0", 0.6), r("fedavg", 0, "75", 0.8),
                  r("fedavg", 1, "0", 0.5)]}                 # seed 1 lacks holdout 75
  assert tables.seed_avg([res], "fedavg", holdouts=("0", "75")) == [pytest.approx(70.0)]


def _record(group, name, holdout, seed, hist, selected_round, gamma=None):
  sp = spec.load_spec(HERE / "spec.yaml")
  run = next(r for r in sp.runs if r.group == group and r.name == name)
  assert str(dict(run.config)["holdout"]) == holdout
  hp = {"local_steps": 10, **({} if gamma is None else {"gamma": gamma})}
  return {"key": json.loads(json.dumps(spec.run_key(sp, run, seed))),
          "algorithm": "fedavg" if gamma is None else "fediir", "hparams": hp,
          "data": {"note": "n"}, "status": "ok", "final": hist[-1], "history": hist,
          "selected": {"max:val_accuracy": {"round": selected_round}}}


def test_load_reads_a_slice_from_the_spec_records_once_complete_else_the_former_file(
    tmp_path, monkeypatch):
  hist = [{"round": 10, "val_accuracy": 0.7, "ood_accuracy": 0.4},
          {"round": 20, "val_accuracy": 0.7, "ood_accuracy": 0.6}]
  folder = tmp_path / "results" / "raw" / "cpu_c50"
  folder.mkdir(parents=True)

  def write(name, seed, backend, gamma=None, stale=False, holdout="75"):
    rec = _record("cpu_c50", name, holdout, seed, hist, 10, gamma=gamma)
    if stale:  # a record of a former configuration of the run: not counted
      rec["key"]["config"] = {**rec["key"]["config"], "rounds": 99}
    rec["provenance"] = {"device": {"backend": backend}}
    (folder / f"{name}-seed{seed}.json").write_text(json.dumps(rec))

  monkeypatch.setattr(tables, "OUT", tmp_path)
  try:
    # the 75° slice of cpu_c50 is 2 runs x 3 seeds; 2 of its 6 records: still the file
    write("fediir-h75", 0, "cpu", gamma=0.02)
    write("fediir-h75", 1, "gpu", gamma=0.02)
    write("fediir-h75", 2, "tpu", gamma=0.02, stale=True)
    tables.load.cache_clear()
    rel = "results_cpu_c50_h75/c50.json"
    res = tables.load(rel)
    assert res["source"] == rel and res["records"] == (2, 6)
    assert tables.raw(rel) == f"`{rel}` (CPU; 2 of the 6 spec records written)"
    # every record written (seed 2's stale one replaced): the records
    write("fediir-h75", 2, "cpu", gamma=0.02)
    for seed in (0, 1, 2):
      write("fedavg-h75", seed, "cpu")
    tables.load.cache_clear()
    res = tables.load(rel)
    assert res["source"] == "results/raw/cpu_c50/" and res["rounds"] == 30
    assert res["holdouts"] == ["75"] and res["seeds"] == [0, 1, 2]
    assert res["records"] == (6, 6)
    assert [(r["seed"], r["label"]) for r in res["runs"]] == [
        (s, a) for s in (0, 1, 2) for a in ("fedavg", "fediir")]
    run = res["runs"][1]
    assert run["label"] == "fediir" and run["penalty_code"] == 0.01
    assert run["selected"] == {"round": 10, "val": 0.7, "test": 0.4}
    assert run["final_test"] == 0.6
    assert tables.machine(rel) == "CPU, GPU"
    assert tables.raw(rel) == "`results/raw/cpu_c50/` (75°; CPU, GPU)"
    res0 = tables.load("results_cpu/c50.json")                # no record at 0°: the file
    assert res0["source"] == "results_cpu/c50.json" and len(res0["runs"]) == 6
    assert tables.raw("results_cpu/c50.json", "0°") == "`results_cpu/c50.json` (0°; CPU)"
    assert tables.machine("results_gpu_h100/c50.json") == "H100"  # no record: the file
    # one caption entry per former file, then per record folder with its domains merged
    assert tables.sources([(rel, "75°"), ("results_cpu/c50.json", "0°")]) == \
        "`results_cpu/c50.json` (0°; CPU), `results/raw/cpu_c50/` (75°; CPU, GPU)"
    # two files from one folder: their domains merged, each machine named once
    for d in ("15", "30", "45", "60"):
      for seed in (0, 1, 2):
        write(f"fedavg-h{d}", seed, "cpu", holdout=d)
        write(f"fediir-h{d}", seed, "cpu", gamma=0.02, holdout=d)
    tables.load.cache_clear()
    assert tables.sources([(rel, "75°"), ("results_cpu_c50_rest/c50.json", "15°-60°")]) == \
        "`results/raw/cpu_c50/` (15°, 30°, 45°, 60°, 75°; CPU, GPU)"
  finally:
    tables.load.cache_clear()
  bad = _record("cpu_c50", "fediir-h75", "75", 0, hist, 20, gamma=0.02)
  with pytest.raises(ValueError, match="selected round 20, select_by_val 10"):
    tables.run_of(bad)


def test_the_spec_expands_to_the_runs_of_the_committed_results():
  """Every run of every committed results file has a spec run with its settings, and the
  spec holds no other group: 77 runs x 3 seeds."""
  sp = spec.load_spec(HERE / "spec.yaml")
  spec.check_runs(sp.runs)
  assert sp.seeds == (0, 1, 2) and sp.data_seed == "each"
  assert len(sp.runs) * len(sp.seeds) == 231
  runs = {(r.group, r.name): r.cfg for r in sp.runs}
  assert {g for g, _ in runs} == {g for g, _ in tables.FORMER.values()}
  for rel, (group, holdouts) in tables.FORMER.items():
    res = json.loads((HERE / rel).read_text())
    assert set(res["holdouts"]) == set(holdouts) and res["seeds"] == list(sp.seeds), rel
    n_runs = 0
    for r in res["runs"]:
      if r["label"] == "fedavg":
        name = f"fedavg-h{r['holdout']}"
      elif group.endswith("gamma"):
        name = f"fediir-g{tables._g(r['penalty_code'])}-h{r['holdout']}"
      else:
        name = f"fediir-h{r['holdout']}"
      cfg = runs[(group, name)]
      task = config.task_arguments(cfg)
      hp = config.algorithm_overrides(cfg)
      assert cfg["holdout"] == r["holdout"] and cfg["algorithm"] == r["label"], (rel, name)
      assert (cfg["rounds"], cfg["eval_every"]) == (res["rounds"], res["eval_every"]), name
      assert task.get("n_per_domain") == res["n_per_domain"], (rel, name)
      assert task["channels"] == [int(c) for c in res["channels"].split(",")], (rel, name)
      assert (task["size"], task["model"]) == (res["size"], res["model"]), (rel, name)
      assert task.get("num_clients", 5) == res["num_clients"], (rel, name)
      assert cfg.get("clients_per_round") == (None if res["row"] == "c5" else res["sampled"])
      assert cfg["local_steps"] == r["local_steps"], (rel, name)
      assert hp.get("gamma", 0.0) == 2 * r["penalty_code"], (rel, name)
      # the paper-size groups are pinned to scan (faster on a CPU); the reduced ones to vmap
      assert cfg["execution"] == ("scan" if group.startswith("full_") else "vmap"), name
      assert cfg["select"] == "max:val_accuracy"
      for k in ("client_lr", "server_lr", "batch_size", "client_optimizer", "weighting",
                "weight_decay", "ema", "ema_init"):
        assert hp.get(k) == r["hparams"].get(k), (rel, name, k)
      n_runs += 1
    assert n_runs == len(res["runs"]), rel



def _experiment_commands(text: str) -> list:
  """The ``fedjax-inv experiment`` commands of the bash blocks of ``text`` (markdown), as
  lists of their words after ``experiment``, continuation lines joined."""
  out = []
  for block in re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S):
    for line in block.replace("\\\n", " ").splitlines():
      words = shlex.split(line, comments=True)
      if len(words) > 1 and words[0].endswith("fedjax-inv") and words[1] == "experiment":
        out.append(words[2:])
  return out


def _where(words) -> dict:
  """The ``--where`` selection of a command's words (:func:`_experiment_commands`)."""
  return spec.parse_where(v for k, v in zip(words[1::2], words[2::2]) if k == "--where")


def test_every_readme_command_selects_runs_of_the_spec():
  """Each README command's --where and --seeds name runs and seeds of spec.yaml; the
  Commands section holds one command per table of tables.py, and together they select
  every spec run."""
  text = (HERE / "README.md").read_text()
  assert "reproduce.py" not in text and "run_full.sh" not in text
  sp = spec.load_spec(HERE / "spec.yaml")
  cmds = _experiment_commands(text)
  assert cmds
  for words in cmds:
    assert words[0] == "experiments/fediir/spec.yaml" and len(words) % 2 == 1, words
    opts = list(zip(words[1::2], words[2::2]))
    assert {k for k, _ in opts} <= {"--where", "--seeds"}, words
    runs = sp.select(_where(words))               # raises on a label not there
    assert runs, f"README: fedjax-inv experiment {' '.join(words)} selects no spec run"
    seeds = [int(s) for k, v in opts if k == "--seeds" for s in v.split(",")]
    assert set(seeds) <= set(sp.seeds), words
  section = text.split("### Commands\n", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"^```bash\n.*?^```", section, re.M | re.S).group(0)
  per_table = _experiment_commands(block)
  assert len(per_table) == len(tables.TABLES), per_table
  assert "python experiments/fair.py tables --only fediir" in block
  selected = {(r.group, r.name) for words in per_table
              for r in sp.select(_where(words))}
  assert selected == {(r.group, r.name) for r in sp.runs}
