"""experiments/fedgma: FedGMA's metric, the table columns, the specs' runs against the
README's list, and the tables' loader (a spec's raw records, else the former files)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import re
import shutil

import pytest

from fedjax_inv.runner import spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDER = ROOT / "experiments" / "fedgma"


def _load(rel, name):
  sp = importlib.util.spec_from_file_location(name, ROOT / rel)
  mod = importlib.util.module_from_spec(sp)
  sp.loader.exec_module(mod)
  return mod


tables = _load("experiments/fedgma/tables.py", "fedgma_tables")


def test_last_mean_is_the_mean_of_the_last_rounds():
  hist = [{"round": r, "ood_accuracy": a} for r, a in enumerate([0.1, 0.2, 0.5, 0.7], 1)]
  assert tables.last_mean(hist, "ood_accuracy", 2) == pytest.approx(0.6)
  assert tables.last_mean(hist, "ood_accuracy", 20) == pytest.approx(0.375)  # all 4
  with pytest.raises(ValueError, match="test_accuracy"):
    tables.last_mean(hist, "test_accuracy", 2)


def test_columns_are_the_papers_pairs():
  sp = spec.load_spec(FOLDER / "spec.yaml")
  cols = {}
  for r in sp.runs:
    cols.setdefault(dict(r.labels)["method"], set()).add(
        (r.cfg["algorithm"], tuple(r.cfg.get("hp", ()))))
  assert cols == {"fedavg": {("fedavg", ())},
                  "fedgma": {("fedgma", ("base=fedavg", "tau=0.4"))},
                  "fedprox": {("fedprox", ("mu=0.01",))},
                  "fedgma_fedprox": {("fedgma", ("base=fedprox", "tau=0.4", "mu=0.01"))}}
  # a record's column follows its algorithm and FedGMA's base
  rec = {"registry_name": "fedgma", "hparams": {"base": "fedprox", "tau": 0.4}}
  assert tables.column(rec) == "fedgma_fedprox"
  assert tables.column({**rec, "hparams": {"base": "fedavg"}}) == "fedgma"
  # Every column of every row has a paper number (FedGMA Tables 1-2).
  assert all(set(v) == set(tables.ALGS) for v in tables.PAPER.values())
  assert set(tables.PAPER) == {dict(r.labels)["row"] for r in sp.runs if r.group == "full"}


def _readme_runs():
  """The rows of the README's runs table: (spec file, --where dict, runs, seeds, the
  former files named)."""
  text = (FOLDER / "README.md").read_text()
  block = text.split("<!-- static: the specs' runs, not results -->\n", 1)[1]
  rows = []
  for line in block.splitlines()[2:]:
    if not line.startswith("|"):
      break
    cells = [c.strip() for c in line.strip("|").split("|")]
    sel = cells[1].strip("`").split()
    where = spec.parse_where(w for w in sel[1:] if w != "--where")
    runs, seeds = (int(x) for x in cells[2].split("×"))
    rows.append((sel[0], where, runs, seeds, set(re.findall(r"`(results[^`]*\.json)`",
                                                               cells[4]))))
  return text, rows


def test_the_specs_expand_to_the_runs_the_readme_lists():
  text, rows = _readme_runs()
  assert len(rows) == 8
  covered = {}
  for file, where, n, seeds, former in rows:
    sp = spec.load_spec(FOLDER / file)
    spec.check_runs(sp.runs)
    runs = sp.select(where)
    assert len(runs) == n and len(sp.seeds) == seeds, (file, where)
    for r in runs:  # every run of a spec in exactly one row
      assert (file, r.label) not in covered, (file, r.label)
      covered[(file, r.label)] = where
      # the strategy is pinned: scan for the 150-round and paper-size runs recorded on a
      # CPU (faster for their CNN there), vmap for the others
      want = "scan" if r.group in ("mnist_r150", "tune", "full") else "vmap"
      assert r.cfg["execution"] == want and "last_k" in r.cfg, (file, r.label)
    # the former files of the row are the tables' for that part of the spec
    groups = {r.group for r in runs}
    assert former == {s.former for s in tables.SOURCES.values() if s.spec == file
                      and s.group in groups and s.row in (None, where.get("row", [None])[0])}
    for f in former:
      assert (FOLDER / f).is_file(), f
    # one command per row, in the README
    cmd = f"fedjax-inv experiment experiments/fedgma/{file}"
    args = "".join(f" --where {k}={','.join(v)}" for k, v in where.items())
    assert (cmd + args) in text, cmd + args
  for file in ("spec.yaml", "tune.yaml", "femnist.yaml"):
    sp = spec.load_spec(FOLDER / file)
    assert {r.label for r in sp.runs} == {lab for f, lab in covered if f == file}, file
  # the reduced groups hold the former commands' settings
  sp = spec.load_spec(FOLDER / "spec.yaml")
  cm = {r.name: r.cfg for r in sp.runs if r.group == "cmnist_r20"}["fedgma"]
  assert (cm["rounds"], cm["last_k"], cm["local_steps"], cm["eval_every"]) == (20, 10, 5, 1)
  assert cm["task_arg"] == ["partition=quantity", "k=2", "n_train=600", "n_test=300",
                            "channels=[16,32]"]
  assert sp.seeds == (0, 1, 2) and sp.data_seed == "each"
  assert spec.load_spec(FOLDER / "tune.yaml").seeds == (100,)


@pytest.fixture
def fresh_load():
  """``tables.load``'s cache emptied before and after the test."""
  tables.load.cache_clear()
  yield tables.load
  tables.load.cache_clear()


def test_the_tables_read_a_specs_records_when_there_are_any(tmp_path, monkeypatch,
                                                            fresh_load):
  """Without records every table reads the former files; records written for the spec's
  current settings replace their part, records of changed settings do not."""
  for f in ("spec.yaml", "tune.yaml"):
    shutil.copy(FOLDER / f, tmp_path / f)
  for src in tables.SOURCES.values():
    (tmp_path / src.former).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(FOLDER / src.former, tmp_path / src.former)
  monkeypatch.setattr(tables, "HERE", tmp_path)
  before = {k: f() for k, f in tables.TABLES.items()}
  assert tables.load("mnist_r30")["from"] == "former"
  sp = spec.load_spec(tmp_path / "spec.yaml")
  hist = [{"round": r, "test_accuracy": 0.5 + r / 100, "train_accuracy": 0.9}
          for r in range(1, 31)]
  for run in sp.select({"group": ["mnist_r30"]}):
    for s in sp.seeds:
      rec = {"key": json.loads(json.dumps(spec.run_key(sp, run, s))), "status": "ok",
             "registry_name": run.cfg["algorithm"],
             "hparams": {"base": "fedavg", "client_lr": 0.1}, "history": hist,
             "final": hist[-1], "data": {"note": "Flower Datasets' DirichletPartitioner"}}
      path = sp.record_path(tmp_path, run, s)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(rec))
  tables.load.cache_clear()
  res = tables.load("mnist_r30")
  assert res["from"] == "records" and res["raw"] == "results/mnist_r30/"
  assert (res["rounds"], res["last"]) == (30, 10) and len(res["runs"]) == 6
  assert {r["label"] for r in res["runs"]} == {"fedavg", "fedgma"}
  assert tables.seeds_of(res, "fedgma") == pytest.approx([75.5] * 3)  # rounds 21-30
  after = tables.mnist_cpu()
  assert "`results/mnist_r30/`" in after and "75.5 ± 0.0" in after
  assert after != before["mnist_cpu"]
  assert {k: f() for k, f in tables.TABLES.items() if k != "mnist_cpu"} == {
      k: v for k, v in before.items() if k != "mnist_cpu"}
  # records of other settings (here: 31 rounds) are not this spec's
  for run in sp.select({"group": ["mnist_r30"]}):
    for s in sp.seeds:
      q = sp.record_path(tmp_path, run, s)
      rec = json.loads(q.read_text())
      rec["key"]["config"]["rounds"] = 31
      q.write_text(json.dumps(rec))
  tables.load.cache_clear()
  assert tables.load("mnist_r30")["from"] == "former"
  assert tables.mnist_cpu() == before["mnist_cpu"]
