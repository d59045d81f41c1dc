"""Experiments as specs (fedjax_inv/runner/spec.py, ``fedjax-inv experiment``).

What must hold: a spec expands into the product of its axes, each run's configuration
is base < group config < options in axis order; a bad spec or run configuration is
refused before anything runs, naming the key; every run goes through the executor of
``fedjax-inv run`` and equals ``simulation.run`` called directly; a record already on disk
with the same key is kept (resume); ``fedjax-inv tune`` runs through the same executor;
the committed robustness spec expands to the 444 runs of its README.
"""
import json
import pathlib

import chex
import numpy as np
import pytest

from fedjax_inv.runner import executor, spec, tuning

ROOT = pathlib.Path(__file__).resolve().parents[1]
TASK_ARG = ["n_per_client=40", "n_ood=20"]
BASE = {"task": "synthetic_hospital", "task_arg": TASK_ARG, "rounds": 3, "eval_every": 1,
        "local_steps": 2, "batch_size": 8}


def _doc(**kw):
  doc = {"base": dict(BASE), "seeds": [0, 1], "groups": [
      {"group": "g", "name": "{algorithm}-{lr}",
       "axes": {"algorithm": {"fedavg": {"algorithm": "fedavg"},
                              "fedprox": {"algorithm": "fedprox", "hp": ["mu=0.1"]}},
                "lr": {"0.1": {"lr": 0.1}, "0.3": {"lr": 0.3}}}}]}
  doc.update(kw)
  return doc


def test_spec_is_the_product_of_its_axes_with_options_last():
  sp = spec.parse_spec(_doc())
  assert [r.name for r in sp.runs] == ["fedavg-0.1", "fedavg-0.3", "fedprox-0.1",
                                       "fedprox-0.3"]
  r = sp.runs[3]
  assert r.cfg == {**BASE, "algorithm": "fedprox", "hp": ["mu=0.1"], "lr": 0.3}
  assert dict(r.labels) == {"algorithm": "fedprox", "lr": "0.3"}
  # a group's config sits between base and the options
  doc = _doc()
  doc["groups"][0]["config"] = {"rounds": 5, "lr": 9.0}
  assert {r.cfg["rounds"] for r in spec.parse_spec(doc).runs} == {5}
  assert {r.cfg["lr"] for r in spec.parse_spec(doc).runs} == {0.1, 0.3}
  assert [r.name for r in sp.select({"algorithm": ["fedprox"], "lr": ["0.1"]})] == [
      "fedprox-0.1"]
  assert sp.record_path(pathlib.Path("o"), r, 1) == pathlib.Path(
      "o/results/g/fedprox-0.3/seed1.json")


@pytest.mark.parametrize("change, match", [
    (dict(base={"x": 1}, groups=None), r"groups: give a list"),
    (dict(extra=1), r"\['extra'\]: unknown key"),
    (dict(seeds=[0, 0]), r"seeds \[0, 0\]: give a list of distinct integers"),
    (dict(data_seed="first"), r"data_seed 'first': use 'each'"),
    (dict(record="r/{method}-{seed}.json"), r"record 'r/\{method\}-\{seed\}.json': a record "
     r"path may use \{group\}, \{name\} and \{seed\} only"),
    (dict(record="r/{name}.json"), r"and must use \{seed\}"),
])
def test_a_bad_spec_names_the_key_and_the_fix(change, match):
  doc = _doc()
  doc.update(change)
  with pytest.raises(ValueError, match=match):
    spec.parse_spec(doc)


def test_bad_group_and_where_and_run_config_are_refused_before_running():
  doc = _doc()
  doc["groups"][0]["name"] = "{algorithm}"  # lr missing from the name: two runs collide
  with pytest.raises(ValueError, match=r"two runs are named g/fedavg"):
    spec.parse_spec(doc)
  doc["groups"][0]["name"] = "{algorithm}-{lr}"
  doc["groups"][0]["axes"]["lr"]["0.5"] = 0.5
  with pytest.raises(ValueError, match=r"axes.lr.0.5: 0.5 is not a mapping of run keys"):
    spec.parse_spec(doc)
  del doc["groups"][0]["axes"]["lr"]["0.5"]
  doc["groups"][0]["name"] = "{algo}-{lr}"
  with pytest.raises(ValueError, match=r"'algo' is not an axis of the group"):
    spec.parse_spec(doc)
  sp = spec.parse_spec(_doc())
  with pytest.raises(ValueError, match=r"no axis 'alg'.*algorithm, group, lr"):
    sp.select({"alg": ["fedavg"]})
  with pytest.raises(ValueError, match=r"--where lr=0.2: not an option of axis 'lr'"):
    sp.select({"lr": ["0.2"]})
  with pytest.raises(ValueError, match=r"--where 'lr': use AXIS=LABEL"):
    spec.parse_where(["lr"])
  bad = _doc()
  bad["base"]["rounds"] = 0
  with pytest.raises(ValueError, match=r"spec run g/fedavg-0.1: .*rounds"):
    spec.check_runs(spec.parse_spec(bad).runs)
  bad = _doc()
  bad["base"]["seed"] = 3
  with pytest.raises(ValueError, match=r"'seed' is not a key of a spec run; use the spec's "
                     "'seeds' list"):
    spec.check_runs(spec.parse_spec(bad).runs)
  bad = _doc()
  bad["base"]["sweep"] = ["lr=0.1,0.2"]  # a run records one algorithm setting
  with pytest.raises(ValueError, match=r"'sweep' is not a key of a spec run; use an axis"):
    spec.check_runs(spec.parse_spec(bad).runs)
  bad = _doc()
  bad["base"]["learning_rate"] = 0.1
  with pytest.raises(ValueError, match=r"unknown key\(s\) \['learning_rate'\]"):
    spec.check_runs(spec.parse_spec(bad).runs)


def _direct(cfg, seed):
  """The reference: the task and algorithm built by hand, ``simulation.run`` called
  directly (no planner, no executor)."""
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.runner import simulation
  from fedjax_inv.tasks import make_task
  task = make_task("synthetic_hospital", seed=seed, n_per_client=40, n_ood=20)
  alg = make_algorithm(cfg["algorithm"], **task.algorithm_settings(
      cfg["algorithm"], dict(client_lr=cfg["lr"], local_steps=2, batch_size=8,
                             **({"mu": 0.1} if cfg["algorithm"] == "fedprox" else {}))))
  return simulation.run(task, alg, rounds=3, seed=seed, eval_every=1, progress=False)


def test_spec_runs_go_through_the_executor_equal_a_direct_run_and_resume(tmp_path,
                                                                          monkeypatch):
  sp = spec.parse_spec(_doc(seeds=[1, 2]))
  calls = []
  real = executor.execute
  monkeypatch.setattr(executor, "execute", lambda *a, **k: calls.append(1) or real(*a, **k))
  recs = spec.execute_spec(sp, tmp_path, where={"lr": ["0.3"]})
  # one plan per run (its seeds together), each seed on its own data
  assert len(calls) == 2 and [(r["key"]["name"], r["key"]["seed"]) for r in recs] == [
      ("fedavg-0.3", 1), ("fedavg-0.3", 2), ("fedprox-0.3", 1), ("fedprox-0.3", 2)]
  runs = sp.select({"lr": ["0.3"]})
  for (run, s), rec in zip([(r, s) for r in runs for s in (1, 2)], recs):
    ref = _direct(run.cfg, s)
    chex.assert_trees_all_close(rec["final"], json.loads(json.dumps(ref.final)), rtol=1e-6)
    assert rec["hparams"]["client_lr"] == 0.3 and rec["status"] == "ok"
    assert rec["data"]["train_clients"] == 2 and rec["provenance"]["git_commit"]
    on_disk = json.loads(sp.record_path(tmp_path, run, s).read_text())
    assert on_disk["key"] == {"group": "g", "name": run.name, "config": run.cfg,
                              "seed": s, "data_seed": "each"}
  # resume: the same key is kept, nothing runs; a changed run runs again
  monkeypatch.setattr(executor, "execute", lambda *a, **k: pytest.fail("ran again"))
  assert spec.execute_spec(sp, tmp_path, where={"lr": ["0.3"]}) == recs
  changed = _doc(seeds=[1, 2])
  changed["base"]["rounds"] = 2
  with pytest.raises(BaseException, match="ran again"):
    spec.execute_spec(spec.parse_spec(changed), tmp_path, where={"lr": ["0.3"]})
  with pytest.raises(ValueError, match=r"--seeds 5: not seeds of this spec \(1, 2\)"):
    spec.execute_spec(sp, tmp_path, seeds=[5])
  # a file that is not a record is never overwritten
  (tmp_path / "mine").mkdir()
  other = sp.record_path(tmp_path / "mine", sp.runs[0], 1)
  other.parent.mkdir(parents=True)
  other.write_text('{"notes": "a user file"}')
  with pytest.raises(ValueError, match=r"is not a run record \(no 'key'\); refusing"):
    spec.execute_spec(sp, tmp_path / "mine", where={"lr": ["0.1"]})
  assert json.loads(other.read_text()) == {"notes": "a user file"}


def test_tuning_runs_through_the_executor(tmp_path, monkeypatch):
  calls = []
  real = executor.execute
  monkeypatch.setattr(executor, "execute", lambda *a, **k: calls.append(1) or real(*a, **k))
  task = tuning._task("synthetic_hospital", 0, {"n_per_client": 40, "n_ood": 20}, 0.1)
  rec = tuning._run_one(tmp_path / "r.json", {"seed": 0, "settings": {"client_lr": 0.2}},
                        task, "fedavg", {"client_lr": 0.2},
                        dict(rounds=2, eval_every=1, clients_per_round=None,
                             progress=False))
  assert calls == [1] and rec["hparams"]["client_lr"] == 0.2
  assert set(rec["final"]) >= {"val_accuracy", "ood_accuracy"}
  assert json.loads((tmp_path / "r.json").read_text())["final"] == rec["final"]


def test_the_robustness_spec_expands_to_its_readme_runs():
  sp = spec.load_spec(ROOT / "experiments" / "robustness" / "spec.yaml")
  spec.check_runs(sp.runs)
  assert len(sp.runs) * len(sp.seeds) == 444
  names = {r.name for r in sp.runs}
  assert {"mean-none-0", "bucketing2+krum-ipm-0.3", "fedprox-0.9-drop",
          "fednova-0-keep"} <= names
  r = next(r for r in sp.runs if r.name == "bucketing2+krum-alie-0.1")
  assert r.cfg["aggregator"] == "krum:f=3" and r.cfg["bucketing"] == 2
  assert r.cfg["attack"] == "alie" and r.cfg["attack_fraction"] == 0.1


def test_experiment_cli_dry_run_lists_the_runs_and_refuses_a_bad_where(capsys):
  from fedjax_inv import cli
  path = str(ROOT / "experiments" / "robustness" / "spec.yaml")
  assert cli.main(["experiment", path, "--dry-run", "--where", "group=stragglers",
                   "--where", "fraction=0.9"]) == 0
  out = capsys.readouterr().out
  assert "6 runs × 3 seeds = 18 records" in out
  assert "stragglers/fedprox-0.9-drop: " in out and "--hp mu=0.1" in out
  assert cli.main(["experiment", path, "--where", "fraction=0.4"]) == 2
  assert "not an option of axis 'fraction'" in capsys.readouterr().err


def test_noniid_task_mlp_model_and_its_errors():
  from fedjax_inv.tasks import make_task
  t = make_task("mnist_noniid", num_clients=4, model="mlp", hidden=[16], n_train=200,
                n_test=50)
  assert t.info["model"] == "MLP 784-16-10"
  params = t.model.init(0)
  sizes = sorted(int(np.prod(p.shape)) for p in __import__("jax").tree.leaves(params))
  assert sizes == sorted([784 * 16, 16, 16 * 10, 10])
  with pytest.raises(ValueError, match=r"model='vit'; choose 'cnn'"):
    make_task("mnist_noniid", model="vit")
  with pytest.raises(ValueError, match=r"hidden=\[0\]; give the MLP's hidden widths"):
    make_task("mnist_noniid", model="mlp", hidden=[0])


def test_every_committed_spec_checks():
  specs = sorted(ROOT.glob("experiments/*/*.yaml"))
  assert {p.name for p in specs} >= {"spec.yaml", "dp_sgd.yaml"}
  for p in specs:
    sp = spec.load_spec(p)
    spec.check_runs(sp.runs)
    paths = {sp.record_path(p.parent, r, s) for r in sp.runs for s in sp.seeds}
    assert len(paths) == len(sp.runs) * len(sp.seeds), p  # no two records share a file


def test_a_held_out_domain_is_an_axis_and_its_run_equals_a_direct_one(tmp_path):
  """A leave-one-domain-out run of a spec (the ``holdout`` run key as an axis) goes
  through the executor and records the run of that held-out domain: its final metrics
  equal ``simulation.run`` on the task built with that holdout, and its data record is
  that task's. A run that holds out several domains is refused before anything runs."""
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.runner import simulation
  from fedjax_inv.tasks import make_task
  tkw = dict(n_per_domain=60, model="cnn", channels=(4, 4, 4))
  doc = {"seeds": [0], "record": "r/{name}-{seed}.json",
         "base": {"task": "rotated_mnist", "algorithm": "fedavg", "rounds": 2, "lr": 0.05,
                  "local_steps": 1, "batch_size": 8, "execution": "vmap",
                  "task_arg": ["n_per_domain=60", "model=cnn", "channels=[4,4,4]"]},
         "groups": [{"name": "h{holdout}",
                     "axes": {"holdout": {"0": {"holdout": "0"}, "75": {"holdout": "75"}}}}]}
  recs = spec.execute_spec(spec.parse_spec(doc), tmp_path, where={"holdout": ["75"]})
  (rec,) = recs
  task = make_task("rotated_mnist", seed=0, holdout="75", **tkw)
  alg = make_algorithm("fedavg", **task.algorithm_settings(
      "fedavg", dict(client_lr=0.05, local_steps=1, batch_size=8)))
  ref = simulation.run(task, alg, rounds=2, seed=0, eval_every=2, progress=False,
                       execution="vmap")
  chex.assert_trees_all_close(rec["final"], json.loads(json.dumps(ref.final)), rtol=1e-6)
  assert rec["data"] == spec.data_record(task)
  assert rec["data"]["eval_sets"]["ood"]["examples"] == 60
  doc["groups"][0]["axes"]["holdout"]["0"] = {"holdout": "0,15"}
  with pytest.raises(ValueError, match=r"spec run h0: holdout='0,15': a spec run holds out "
                     "one domain"):
    spec.check_runs(spec.parse_spec(doc).runs)


def _experiment_commands():
  """Every ``fedjax-inv experiment`` command in a code block of an experiments README
  (continued lines joined, comments dropped): ``(readme, argv after 'experiment')``."""
  import re
  import shlex
  out = []
  for readme in sorted(ROOT.glob("experiments/*/README.md")):
    for block in re.findall(r"```(?:bash|sh|)\n(.*?)```", readme.read_text(), re.S):
      for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if "experiment" in words and any(w.endswith("fedjax-inv") for w in words):
          out.append((readme.relative_to(ROOT), words[words.index("experiment") + 1:]))
  return out


def test_every_experiments_readme_command_selects_runs_of_its_spec():
  """Each ``fedjax-inv experiment SPEC [--where ...] [--seeds ...]`` in an experiments
  README names a committed spec, and its ``--where`` / ``--seeds`` select at least one of
  the spec's runs and only its seeds (a renamed axis option or group breaks a command)."""
  cmds = _experiment_commands()
  assert {str(r.parent.name) for r, _ in cmds} >= {"fedilc", "invariant_fedavg", "fedgma",
                                                   "fediir", "fedsr", "robustness",
                                                   "privacy"}
  for readme, argv in cmds:
    sp = spec.load_spec(ROOT / argv[0])
    where, seeds, i = [], None, 1
    while i < len(argv):
      if argv[i] == "--where":
        where.append(argv[i + 1])
      elif argv[i] == "--seeds":
        seeds = [int(s) for s in argv[i + 1].split(",")]
      elif argv[i] != "--out":
        raise AssertionError(f"{readme}: unexpected {argv[i]!r} in {argv}")
      i += 2
    assert sp.select(spec.parse_where(where)), (readme, argv)
    assert set(seeds or sp.seeds) <= set(sp.seeds), (readme, argv)


def test_machines_names_the_records_backends():
  cpu = {"provenance": {"device": {"backend": "cpu", "count": 1}}}
  gpu = {"provenance": {"device": {"backend": "gpu"}}}
  assert spec.machines([cpu, cpu]) == "CPU"
  assert spec.machines([gpu, cpu]) == "CPU, GPU"
  assert spec.machines([{}]) == "UNKNOWN MACHINE"
  assert spec.machines([]) == ""
