"""Leave-one-domain-out runner: model selection, equality with direct runs, tables, outputs,
validation before training. Uses a tiny Gaussian domain task registered here."""
import csv
import io
import json

import numpy as np
import pytest

from fedjax_inv import models
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import simulation
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks.domainbed import build_domain_task
from fedjax_inv.runner import lodo
from fedjax_inv.tasks import Task, make_task, register_task, task_registry

DOMAINS = ["d0", "d1", "d2"]
TASK = "_test_gaussian_domains"
DEFAULTS = dict(rounds=4, eval_every=1, local_steps=2, batch_size=16,
                client_optimizer="sgd", client_lr=0.2, weight_decay=0.0)


def _gaussian_domains(holdout=0, val_fraction=0.25, seed=0, data_dir=None, source="auto",
                      download=False, shift=1.5):
  """3 domains; label = sign of x0 + noise; domain d shifts dims 1..3 by d * shift and
  flips a spurious feature's correlation with the label."""
  rng = np.random.default_rng(100)  # data fixed; the split uses `seed`
  doms = []
  for d in range(len(DOMAINS)):
    n = 40 + 10 * d
    y = rng.integers(0, 2, n).astype(np.int32)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    x[:, 0] += 1.5 * (2 * y - 1)
    x[:, 1:] += d * shift
    x[:, 3] += (1 - d) * (2 * y - 1)
    doms.append((x, y))
  return build_domain_task(TASK, doms, DOMAINS, holdout=holdout, val_fraction=val_fraction,
                           seed=seed, model=models.mlp(4, (8,), 1), kind="binary",
                           info={"paper": "test", "dataset_source": "generated",
                                 "data_note": "3 Gaussian domains"},
                           defaults=DEFAULTS)


def _not_a_domain_task(data_dir=None, source="auto", download=False, seed=0):
  x = np.zeros((4, 2), np.float32)
  y = np.array([0, 1, 0, 1], np.int32)
  data = from_client_arrays([x], [y])
  return Task("_test_plain", "binary", data, {"ood": data}, models.mlp(2, (2,), 1),
              {"paper": "test"}, defaults=DEFAULTS)


if TASK not in task_registry():
  register_task(TASK, paper="test", summary="3 Gaussian domains")(_gaussian_domains)
  register_task("_test_plain", paper="test", summary="no domains")(_not_a_domain_task)


def test_domain_task_contract():
  t = make_task(TASK, holdout="d1")
  assert t.info["domains"] == DOMAINS and t.info["holdout"] == "d1"
  assert t.train.num_clients == 2 and t.eval_sets["val"].num_clients == 2
  assert int(t.eval_sets["ood"].n[0]) == 50


def test_select_rounds_closed_form():
  hist = [{"round": 2, "val_accuracy": 0.6, "ood_accuracy": 0.5},
          {"round": 4, "val_accuracy": 0.8, "ood_accuracy": 0.4},
          {"round": 6, "val_accuracy": 0.8, "ood_accuracy": 0.9},   # val tie: earliest
          {"round": 8, "val_accuracy": 0.7, "ood_accuracy": 0.9}]   # ood tie: earliest
  sel = lodo.select_rounds(hist)
  assert sel["training-domain validation"] == {"round": 4, "ood_accuracy": 0.4,
                                               "val_accuracy": 0.8}
  assert sel["test-domain oracle"]["round"] == 6
  assert sel["last"] == {"round": 8, "ood_accuracy": 0.9, "val_accuracy": 0.7}
  with pytest.raises(ValueError, match="empty"):
    lodo.select_rounds([])
  with pytest.raises(ValueError, match="val_accuracy"):
    lodo.select_rounds([{"round": 1, "ood_accuracy": 0.5}])


def test_validation_mean_and_pooled_pick_different_rounds():
  """Issue 10.3: DomainBed / FedIIR average the per-domain validation accuracies; pooling
  weights the large domain. Two source domains with 10 and 90 validation examples:
  round 1 — accuracies (1.0, 0.5): mean 0.75, pooled 0.55; round 2 — (0.0, 0.7): mean
  0.35, pooled 0.63. The summaries come from the evaluator's per-client counts."""
  from fedjax_inv.eval import summarize
  hist = []
  for r, correct in ((1, [10, 45]), (2, [0, 63])):
    e = {"round": r, "ood_accuracy": 0.1 * r}
    e.update(summarize({"loss_sum": np.ones(2), "n": np.array([10, 90]),
                        "correct": np.array(correct, float)}, "val"))
    hist.append(e)
  assert hist[0]["val_mean_client_accuracy"] == pytest.approx(0.75)
  assert hist[0]["val_accuracy"] == pytest.approx(0.55)
  assert hist[1]["val_mean_client_accuracy"] == pytest.approx(0.35)
  assert hist[1]["val_accuracy"] == pytest.approx(0.63)
  mean = lodo.select_rounds(hist)["training-domain validation"]
  pooled = lodo.select_rounds(hist, validation="pooled")["training-domain validation"]
  assert (mean["round"], mean["val_accuracy"]) == (1, pytest.approx(0.75))
  assert (pooled["round"], pooled["val_accuracy"]) == (2, pytest.approx(0.63))
  # A single validation client: no per-client mean key; both equal the pooled accuracy.
  one = [{"round": 1, "val_accuracy": 0.4, "ood_accuracy": 0.2}]
  assert lodo.select_rounds(one)["training-domain validation"]["val_accuracy"] == 0.4
  with pytest.raises(ValueError, match="validation='median'"):
    lodo.select_rounds(hist, validation="median")


@pytest.fixture(scope="module")
def result():
  return lodo.run_lodo(TASK, ["fedavg", "fedprox"], seeds=(0, 1), holdouts=[0, "d2"],
                       algorithm_kwargs={"client_lr": 0.3, "fedprox": {"mu": 0.5}},
                       progress=False)


@pytest.mark.slow
def test_runs_equal_direct_simulation_runs(result):
  assert result["holdouts"] == ["d0", "d2"] and result["domains"] == DOMAINS
  assert len(result["runs"]) == 2 * 2 * 2
  r = next(r for r in result["runs"] if r["holdout"] == "d2" and r["seed"] == 1
           and r["algorithm"] == "fedprox")
  # Task defaults, overridden by the common then the per-algorithm kwargs.
  kw = {k: v for k, v in DEFAULTS.items() if k not in ("rounds", "eval_every")}
  kw.update(client_lr=0.3, mu=0.5)
  direct = simulation.run(make_task(TASK, holdout="d2"), make_algorithm("fedprox", **kw),
                          rounds=4, seed=1, eval_every=1, progress=False)
  assert r["history"] == direct.history
  assert r["hparams"]["mu"] == 0.5 and r["hparams"]["client_lr"] == 0.3
  other = next(r for r in result["runs"] if r["algorithm"] == "fedavg")
  assert other["hparams"]["client_lr"] == 0.3 and "mu" not in other["hparams"]


def test_selection_and_table_follow_the_histories(result):
  for r in result["runs"]:
    h = r["history"]
    assert [e["round"] for e in h] == [1, 2, 3, 4]
    val = [e["val_mean_client_accuracy"] for e in h]  # DomainBed/FedIIR default
    ood = [e["ood_accuracy"] for e in h]
    sel = r["selected"]
    assert sel["training-domain validation"]["ood_accuracy"] == ood[int(np.argmax(val))]
    assert sel["test-domain oracle"]["ood_accuracy"] == max(ood)
    assert sel["last"]["ood_accuracy"] == ood[-1]
  rows = result["table"]
  assert [(x["selection"], x["algorithm"]) for x in rows] == [
      (s, a) for s in lodo.SELECTIONS for a in ("fedavg", "fedprox")]
  for row in rows:
    per_seed = {0: [], 1: []}
    for h in ("d0", "d2"):
      vals = [r["selected"][row["selection"]]["ood_accuracy"] for r in result["runs"]
              if r["algorithm"] == row["algorithm"] and r["holdout"] == h]
      assert row["cells"][h]["mean"] == pytest.approx(np.mean(vals))
      assert row["cells"][h]["std"] == pytest.approx(np.std(vals, ddof=1))
      for r in result["runs"]:
        if r["algorithm"] == row["algorithm"] and r["holdout"] == h:
          per_seed[r["seed"]].append(r["selected"][row["selection"]]["ood_accuracy"])
    avgs = [np.mean(v) for v in per_seed.values()]
    assert row["cells"]["avg"]["mean"] == pytest.approx(np.mean(avgs))
    assert row["cells"]["avg"]["std"] == pytest.approx(np.std(avgs, ddof=1))
  # The oracle is an upper bound of the other selections, cell by cell.
  by = {(x["selection"], x["algorithm"]): x["cells"] for x in rows}
  for a in ("fedavg", "fedprox"):
    for c in ("d0", "d2", "avg"):
      oracle = by[("test-domain oracle", a)][c]["mean"]
      assert by[("training-domain validation", a)][c]["mean"] <= oracle + 1e-12
      assert by[("last", a)][c]["mean"] <= oracle + 1e-12


def test_outputs_markdown_csv_json(result, tmp_path):
  md = lodo.format_lodo_markdown(result)
  for s in lodo.SELECTIONS:
    assert f"### {s}" in md
  assert "| algorithm | d0 | d2 | avg |" in md
  row = next(x for x in result["table"] if x["selection"] == "last"
             and x["algorithm"] == "fedavg")
  c = row["cells"]["d2"]
  assert f"{100 * c['mean']:.1f} ± {100 * c['std']:.1f}" in md
  rows = list(csv.DictReader(io.StringIO(lodo.lodo_csv(result))))
  assert len(rows) == 6
  got = next(r for r in rows if r["selection"] == "last" and r["algorithm"] == "fedavg")
  assert float(got["d2_mean"]) == pytest.approx(c["mean"], abs=1e-6)
  assert float(got["avg_std"]) == pytest.approx(row["cells"]["avg"]["std"], abs=1e-6)
  out = tmp_path / "lodo"
  (out).mkdir()
  (out / "stale.txt").write_text("old run")
  (out / ".fedjax-inv-run").write_text("")  # an earlier fedjax-inv output (issue 11)
  lodo.write_lodo_outputs(out, result)
  assert sorted(p.name for p in out.iterdir() if p.name[0] != ".") == [
      "metrics.jsonl", "results.csv", "results.md", "summary.json"]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["seeds"] == [0, 1] and summary["selections"] == list(lodo.SELECTIONS)
  assert summary["validation"] == "mean" and "per-source-domain" in md
  assert summary["table"][0]["cells"]["d0"]["mean"] == result["table"][0]["cells"]["d0"][
      "mean"]
  assert set(summary["task_info"]) == {"d0", "d2"}
  assert all("history" not in r for r in summary["runs"])
  lines = (out / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 8 * 4 and json.loads(lines[0])["holdout"] == "d0"


def test_arguments_validated_before_training(monkeypatch):
  def no_training(*a, **k):
    raise AssertionError("training started before validation finished")
  monkeypatch.setattr(simulation, "run", no_training)
  with pytest.raises(ValueError, match="unknown holdout domain 'd9'"):
    lodo.run_lodo(TASK, ["fedavg"], holdouts=["d0", "d9"], progress=False)
  with pytest.raises(ValueError, match="out of range"):
    lodo.run_lodo(TASK, ["fedavg"], holdouts=[3], progress=False)
  with pytest.raises(ValueError, match="seeds is empty"):
    lodo.run_lodo(TASK, ["fedavg"], seeds=(), progress=False)
  with pytest.raises(ValueError, match="unknown algorithm"):
    lodo.run_lodo(TASK, ["fedavg", "nope"], progress=False)
  with pytest.raises(ValueError, match="unknown task"):
    lodo.run_lodo("nope", ["fedavg"], progress=False)
  with pytest.raises(ValueError, match="holdouts="):
    lodo.run_lodo(TASK, ["fedavg"], task_kwargs={"holdout": 1}, progress=False)
  with pytest.raises(ValueError, match="not a domain task"):
    lodo.run_lodo("_test_plain", ["fedavg"], progress=False)
  with pytest.raises(ValueError, match="unknown hyperparameters"):
    lodo.run_lodo(TASK, ["fedavg"], algorithm_kwargs={"bogus": 1}, progress=False)
  with pytest.raises(ValueError, match="execution"):
    lodo.run_lodo(TASK, ["fedavg"], execution="warp", progress=False)
  with pytest.raises(ValueError, match="twice"):
    lodo.run_lodo(TASK, ["fedavg"], holdouts=["d1", 1], progress=False)
  with pytest.raises(ValueError, match="rounds"):
    lodo.run_lodo(TASK, ["fedavg"], rounds=0, progress=False)
  with pytest.raises(ValueError, match="validation='pool'"):
    lodo.run_lodo(TASK, ["fedavg"], validation="pool", progress=False)


def test_resplit_uses_the_seed_for_the_data_split(monkeypatch):
  seen = []

  def spy(task, alg, **kw):  # records the split; no training needed for this test
    seen.append((kw["seed"], np.asarray(task.eval_sets["val"].x).sum()))
    h = [{"round": 1, "val_accuracy": 0.5, "ood_accuracy": 0.5}]
    return simulation.RunResult(h, h[-1], None, None, "scan", 0.0)
  monkeypatch.setattr(simulation, "run", spy)
  res = lodo.run_lodo(TASK, "fedavg", seeds=(0, 1), holdouts="d1", rounds=1,
                      resplit=True, progress=False)
  assert res["resplit"] and len(seen) == 2
  assert seen[0][1] != seen[1][1]  # different validation splits
  seen.clear()
  lodo.run_lodo(TASK, "fedavg", seeds=(0, 1), holdouts="d1", rounds=1, progress=False)
  assert seen[0][1] == seen[1][1]  # one fixed split


@pytest.mark.slow
def test_rotated_mnist_lodo_table_on_bundled_digits(tmp_path):
  """Issue 4's done-criterion: the leave-one-domain-out runner produces the paper-style
  table for rotated_mnist on the bundled offline digits (small sizes for CI)."""
  result = lodo.run_lodo(
      "rotated_mnist", "fedavg", seeds=(0,), rounds=2, holdouts="all",
      task_kwargs={"n_per_domain": 60, "channels": (4, 4)},
      algorithm_kwargs={"local_steps": 1, "batch_size": 16}, eval_every=1,
      progress=False)
  assert result["domains"] == ["0", "15", "30", "45", "60", "75"]
  out = lodo.write_lodo_outputs(tmp_path / "lodo", result)
  md = (out / "results.md").read_text()
  for sel in ("training-domain validation", "test-domain oracle", "last"):
    assert sel in md
  header = next(l for l in md.splitlines() if l.startswith("| algorithm"))
  assert all(f"| {d} " in header for d in result["domains"]) and "avg" in header
  rows = [r for r in result["table"] if r["selection"] == "test-domain oracle"]
  cells = rows[0]["cells"]
  for d in result["domains"]:
    # one seed: the test-domain oracle's cell is the best held-out accuracy of that run
    run = next(r for r in result["runs"] if r["holdout"] == d)
    assert cells[d]["values"] == [max(e["ood_accuracy"] for e in run["history"])]
  # the oracle is never below training-domain validation selection
  val = next(r for r in result["table"] if r["selection"] == "training-domain validation")
  assert all(cells[d]["mean"] >= val["cells"][d]["mean"] - 1e-9 for d in result["domains"])


EQ_TASK = "_test_equal_domains"


def _equal_domains(holdout=0, val_fraction=0.25, seed=0, data_dir=None, source="auto",
                   download=False):
  """3 equal-sized Gaussian domains (so every held-out domain gives the same shapes)."""
  rng = np.random.default_rng(7)
  doms = []
  for d in range(3):
    y = rng.integers(0, 2, 40).astype(np.int32)
    x = rng.normal(size=(40, 4)).astype(np.float32) + d
    x[:, 0] += 1.5 * (2 * y - 1)
    doms.append((x, y))
  return build_domain_task(EQ_TASK, doms, DOMAINS, holdout=holdout,
                           val_fraction=val_fraction, seed=seed,
                           model=models.mlp(4, (8,), 1), kind="binary",
                           info={"paper": "test"}, defaults=DEFAULTS)


if EQ_TASK not in task_registry():
  register_task(EQ_TASK, paper="test", summary="3 equal Gaussian domains")(_equal_domains)


@pytest.mark.slow
def test_batched_holdouts_equal_sequential_runs():
  """Issue 13: --holdout all with --replicas batched runs every (held-out domain, seed)
  of an algorithm as one vmapped program with per-replica data; each run equals the
  sequential one (float32 rounding), and so do the model selections."""
  kw = dict(seeds=(0, 1), holdouts="all", progress=False,
            algorithm_kwargs={"client_lr": 0.3, "mu": 0.5})
  seq = lodo.run_lodo(EQ_TASK, ["fedprox"], replicas="sequential", **kw)
  log = io.StringIO()
  bat = lodo.run_lodo(EQ_TASK, ["fedprox"], replicas="batched", stream=log, **kw)
  assert "fedprox: 6 (held-out domain, seed) runs batched as one program" in log.getvalue()
  assert (seq["replicas"], bat["replicas"]) == ("sequential", "batched")
  key = lambda r: (r["holdout"], r["algorithm"], r["seed"])  # noqa: E731
  assert sorted(map(key, seq["runs"])) == sorted(map(key, bat["runs"]))
  by = {key(r): r for r in bat["runs"]}
  for r in seq["runs"]:
    b = by[key(r)]
    assert [e["round"] for e in r["history"]] == [e["round"] for e in b["history"]]
    for x, y in zip(r["history"], b["history"]):
      for k in x:
        np.testing.assert_allclose(x[k], y[k], rtol=2e-6, atol=1e-7, err_msg=str(key(r)))
    for sel in lodo.SELECTIONS:
      assert r["selected"][sel]["round"] == b["selected"][sel]["round"]
  finals = {round(r["final"]["ood_loss"], 6) for r in bat["runs"]}
  assert len(finals) == len(bat["runs"])  # every replica is its own run


def test_batched_holdouts_with_unequal_domains_run_one_at_a_time():
  out = io.StringIO()
  res = lodo.run_lodo(TASK, ["fedavg"], holdouts=["d0", "d1"], rounds=1, progress=False,
                      replicas="batched", stream=out)
  assert res["replicas"] == "sequential" and len(res["runs"]) == 2
  assert "running one held-out domain at a time" in out.getvalue()
  assert "other data shapes" in out.getvalue()
  with pytest.raises(ValueError, match="replicas='many'"):
    lodo.run_lodo(TASK, ["fedavg"], replicas="many", progress=False)
