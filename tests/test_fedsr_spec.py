"""experiments/fedsr: the spec holds the settings of every committed folder's runs, each
README command selects runs of it, and the tables' loader reads a group's raw records
when there are any, else the committed folder."""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import pathlib
import re
import shlex
import shutil

import pytest
import yaml

from fedjax_inv import cli
from fedjax_inv.runner import config, spec

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = ROOT / "experiments" / "fedsr"
_mod = importlib.util.spec_from_file_location("fedsr_tables", HERE / "tables.py")
tables = importlib.util.module_from_spec(_mod)
_mod.loader.exec_module(tables)
DOMAINS = ("0", "15", "30", "45", "60", "75")
# The keys of a former command that the spec sets its own way: its seeds list, its record
# paths, its held-out domain axis; progress and checkpoints change nothing computed.
NOT_COMPARED = {"seeds", "out", "holdout", "checkpoint_every", "execution", "hp"}


def _former_commands() -> list:
  """(spec group, the former ``fedjax-inv run`` configuration) of every committed log: the
  command on its first line."""
  p = argparse.ArgumentParser()
  cli._run_parser(p.add_subparsers(dest="cmd"))
  logs = ([("restart_lr1e-3", f) for f in sorted((HERE / "h100_r500").glob("*.log"))]
          + [("restart_lr1e-2", f) for f in sorted((HERE / "h100_r500_lr1e-2").glob("*.log"))]
          + [("persistent_lr1e-3", f) for f in
             sorted((HERE / "cpu_r500_persistent").glob("*/h*/run.log"))])
  out = []
  for group, f in logs:
    argv = shlex.split(f.read_text().splitlines()[0].lstrip("+ "))
    args = p.parse_args(argv[argv.index("run"):])
    cfg = {k: getattr(args, k) for k in config.RUN_KEYS if getattr(args, k) is not None}
    out.append((group, config.check_run_config(cfg)))
  return out


def test_the_spec_holds_the_settings_of_every_committed_run():
  """Each committed folder's command, domain by domain, is one run of its spec group with
  the same settings; the spec has no other run. The H100 commands set no client optimizer
  state: the engine restarted the momentum every round then, as their groups do."""
  sp = spec.load_spec(HERE / "spec.yaml")
  spec.check_runs(sp.runs)
  assert sp.seeds == (0, 1, 2) and sp.data_seed == 0  # `--seeds 3`: data of seed 0
  runs = {(r.group, dict(r.labels)["method"], dict(r.labels)["holdout"]): r for r in sp.runs}
  former = _former_commands()
  assert len(former) == 8 + 12
  seen = set()
  for group, cfg in former:
    assert cfg["seeds"] == 3 and cfg.get("seed", 0) == 0
    hp = config.algorithm_overrides(cfg)
    if group.startswith("restart"):
      assert "client_optimizer_state" not in hp
      hp["client_optimizer_state"] = "restart"
    for d in (DOMAINS if cfg["holdout"] == "all" else (cfg["holdout"],)):
      key = (group, cfg["algorithm"], d)
      assert key not in seen, key
      seen.add(key)
      run = config.check_run_config(runs[key].cfg)
      assert run["holdout"] == d
      assert config.algorithm_overrides(run) == hp, key
      assert ({k: v for k, v in run.items() if k not in NOT_COMPARED}
              == {k: v for k, v in cfg.items() if k not in NOT_COMPARED}), key
      assert run["execution"] == "scan"  # the CPU's faster strategy, every group
  assert seen == set(runs)
  # the scan strategy of the CPU group is the one its committed runs used
  for f in (HERE / "cpu_r500_persistent").glob("*/h*/summary.json"):
    assert {r["execution"] for r in json.loads(f.read_text())["runs"]} == {"scan"}, f


def _readme_commands() -> list:
  """The ``fedjax-inv experiment`` lines of the README's bash block, as argv lists."""
  text = (HERE / "README.md").read_text()
  (block,) = re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)
  lines = [shlex.split(line, comments=True) for line in block.splitlines()]
  return [argv for argv in lines if argv[:2] == ["fedjax-inv", "experiment"]]


def test_each_readme_command_selects_runs_of_the_spec():
  """Every README command names this spec and a --where that selects runs of it (one
  table row: one group and method); together they select every run once."""
  sp = spec.load_spec(HERE / "spec.yaml")
  cmds = _readme_commands()
  assert len(cmds) == 10
  covered = []
  for argv in cmds:
    assert argv[2] == "experiments/fedsr/spec.yaml", argv
    items = [argv[i + 1] for i, a in enumerate(argv) if a == "--where"]
    assert len(items) == (len(argv) - 3) / 2, argv  # nothing but --where after the spec
    where = spec.parse_where(items)
    runs = sp.select(where)
    assert runs, argv
    assert len({(r.group, dict(r.labels)["method"]) for r in runs}) == 1, argv
    covered += [r.label for r in runs]
  assert sorted(covered) == sorted(r.label for r in sp.runs)
  text = (HERE / "README.md").read_text()
  assert "python experiments/fair.py tables --only fedsr" in text


@pytest.fixture
def folder(tmp_path, monkeypatch):
  """A copy of the spec and the committed folders; ``tables`` reads it, its cache empty."""
  shutil.copy(HERE / "spec.yaml", tmp_path / "spec.yaml")
  for name in tables.FORMER.values():
    shutil.copytree(HERE / name, tmp_path / name)
  monkeypatch.setattr(tables, "HERE", tmp_path)
  tables.load.cache_clear()
  yield tmp_path
  tables.load.cache_clear()


def _write(sp, folder, group, method, acc, change=None):
  """Fake records of every (held-out domain, seed) of one method: accuracy ``acc(d, s)``;
  ``change``: a config key changed in the records' key (another configuration)."""
  for run in sp.select({"group": [group], "method": [method]}):
    d = dict(run.labels)["holdout"]
    for s in sp.seeds:
      key = json.loads(json.dumps(spec.run_key(sp, run, s)))
      key["config"].update(change or {})
      final = {"round": 500, "ood_accuracy": acc(d, s)}
      rec = {"key": key, "status": "ok", "final": final, "history": [final],
             "provenance": {"device": {"backend": "cpu"}}}
      path = sp.record_path(folder, run, s)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(rec))


def test_the_tables_read_a_groups_records_when_there_are_any(folder):
  before = {k: f() for k, f in tables.TABLES.items()}
  cpu_before = tables.raw_table()
  assert tables.load("restart_lr1e-2", "fedsr")["from"] == "former"
  assert tables.load("persistent_lr1e-3", "fedsr")["kind"] == "summary"
  sp = spec.load_spec(folder / "spec.yaml")
  # records of another configuration do not count
  _write(sp, folder, "restart_lr1e-2", "fedsr", lambda d, s: 0.5, change={"lr": 0.1})
  tables.load.cache_clear()
  assert tables.load("restart_lr1e-2", "fedsr")["from"] == "former"
  # the spec's records replace that method's row, and nothing else
  _write(sp, folder, "restart_lr1e-2", "fedsr", lambda d, s: 0.5 + int(d) / 1000 + s / 100)
  _write(sp, folder, "persistent_lr1e-3", "fedavg", lambda d, s: 0.25 + s / 100)
  tables.load.cache_clear()
  row = tables.load("restart_lr1e-2", "fedsr")
  assert row["from"] == "records" and row["n"] == 3
  assert row["seeds"]["75"] == pytest.approx({0: 0.575, 1: 0.585, 2: 0.595})
  assert row["cells"]["75"] == (pytest.approx(58.5), pytest.approx(1.0))
  assert row["cells"]["avg"][0] == pytest.approx(100 * (0.51 + 0.0375))
  text = tables.TABLES["restart_lr1e-2"]()
  assert "| fedsr | ours (3 seeds, last) | 51.0 ± 1.0 | 52.5 ± 1.0 |" in text
  assert "FedSR: from the per-seed records in `results/raw/restart_lr1e-2/`" in text
  assert "lr1e-2_fedsr.csv" not in text and "lr1e-2_fedavg.csv" in text
  others = [a for a, b in zip(before["restart_lr1e-2"].splitlines(), text.splitlines())
            if a != b]
  assert len(others) == 2  # the FedSR row and the note under the table
  assert tables.TABLES["restart_lr1e-3"]() == before["restart_lr1e-3"]
  cpu = tables.raw_table()
  assert "| fedavg | ours (3 seeds, last) | 26.0 ± 1.0 |" in cpu
  assert [a for a in cpu.splitlines() if "| fedsr |" in a] == \
      [a for a in cpu_before.splitlines() if "| fedsr |" in a]
  assert tables.cpu_per_seed("fedavg")["avg"] == pytest.approx([25.0, 26.0, 27.0])
  # the verdict claims follow: FedSR at lr 1e-2 against FedAvg's committed aggregates
  claim = next(c for c in tables.claims() if c.method == "FedSR" and "lr 1e-2" in c.setting)
  assert claim.ours_agg[0] == pytest.approx(100 * (0.51 + 0.0375)) and not claim.raw
  assert claim.setting.startswith("H100, ")
  # with FedAvg's records too, the claim compares per-seed averages and names the machine
  _write(sp, folder, "restart_lr1e-2", "fedavg", lambda d, s: 0.4 + s / 100)
  tables.load.cache_clear()
  claim = next(c for c in tables.claims() if c.method == "FedSR" and "lr 1e-2" in c.setting)
  assert claim.setting.startswith("CPU, lr 1e-2")
  assert claim.ours == pytest.approx([100 * (0.5375 + s / 100) for s in (0, 1, 2)])
  assert claim.ours_baseline == pytest.approx([40.0, 41.0, 42.0])
  text = tables.TABLES["restart_lr1e-2"]()
  assert "FedAvg, FedSR: from the per-seed records in `results/raw/restart_lr1e-2/`, " \
      "run on: CPU" in text
  assert "| fedavg | 2 | 42.0 | 42.0 | 42.0 | 42.0 | 42.0 | 42.0 | 42.0 |" in text
  # the former run's table still shows the aggregates alone
  assert tables.TABLES["h100_former_lr1e-3"]() == before["h100_former_lr1e-3"]
  assert tables.TABLES["h100_former_lr1e-2"]() == before["h100_former_lr1e-2"]
  assert "lr1e-2_fedavg.csv" in before["h100_former_lr1e-2"]


@pytest.mark.slow
def test_a_tiny_spec_run_is_read_by_the_tables(tmp_path, monkeypatch):
  """The spec's smallest end to end check: one run of the spec at 2 rounds on 60 images
  per domain, through ``fedjax-inv experiment``'s executor, then the tables read it."""
  doc = yaml.safe_load((HERE / "spec.yaml").read_text())
  doc["base"].update(rounds=2, eval_every=1, task_arg=["n_per_domain=60"])
  doc["seeds"] = [0]
  (tmp_path / "spec.yaml").write_text(yaml.safe_dump(doc))
  sp = spec.load_spec(tmp_path / "spec.yaml")
  (rec,) = spec.execute_spec(sp, tmp_path, where={"group": ["restart_lr1e-3"],
                                                  "method": ["fedavg"], "holdout": ["0"]})
  assert rec["status"] == "ok" and rec["key"]["data_seed"] == 0
  assert rec["hparams"]["client_optimizer_state"] == "restart"
  assert rec["data"]["eval_sets"]["ood"]["examples"] == 60
  monkeypatch.setattr(tables, "HERE", tmp_path)
  tables.load.cache_clear()
  try:
    row = tables.load("restart_lr1e-3", "fedavg")
  finally:
    tables.load.cache_clear()
  assert row["from"] == "records" and row["seeds"] == {"0": {0: rec["final"]["ood_accuracy"]}}
  assert math.isfinite(row["cells"]["0"][0]) and "avg" not in row["cells"]
