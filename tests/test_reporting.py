"""Run reporting (fedjax_inv.eval.reporting): FedILC's thresholded AUROC/AUPRC, selection at
the lowest-OOD-loss round with an independent copy of that model, the FedGMA last-k mean
with its evaluation schedule, per-round ranking/fairness metrics, per-task defaults,
errors before compile, outputs, and a quiet progress bar off a terminal."""
import json

import jax
import numpy as np
import pytest
from sklearn.metrics import auc, precision_recall_curve, roc_auc_score

from fedjax_inv import models
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import simulation
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.eval import build_evaluator, metrics, reporting, summarize
from fedjax_inv.tasks import Task, register_task, task_registry


# ---------------------------------------------------------------------------------------
# Thresholded (official FedILC) ranking metrics.
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_thresholded_metrics_equal_sklearn_on_binary_predictions(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(4, 80))
  y = rng.integers(0, 2, n)
  y[:2] = [0, 1]
  # Shift so some seeds predict (almost) all 0 or all 1.
  s = rng.normal(size=n) + 1.5 * y + rng.uniform(-4, 4)
  p = (s > 0).astype(float)
  assert metrics.auroc_thresholded(s, y) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
  prec, rec, _ = precision_recall_curve(y, p)
  assert metrics.auprc_thresholded(s, y) == pytest.approx(auc(rec, prec), abs=1e-12)
  # Closed form: balanced accuracy of the thresholded predictions.
  tpr = p[y == 1].mean()
  tnr = 1 - p[y == 0].mean()
  assert metrics.auroc_thresholded(s, y) == pytest.approx((tpr + tnr) / 2)


def test_thresholded_differs_from_continuous_and_closed_forms():
  y = np.array([0, 0, 1, 1])
  s = np.array([-2.0, -0.5, -0.1, 3.0])  # perfect ranking, one positive below 0
  assert metrics.auroc(s, y) == 1.0
  assert metrics.auroc_thresholded(s, y) == pytest.approx(0.75)  # (0.5 + 1) / 2
  # All-negative predictions: the curve (1, pi) -> (0, 1) gives (1 + pi) / 2.
  y2 = np.array([0, 1, 0, 0])
  assert metrics.auprc_thresholded([-1, -1, -1, -1], y2) == pytest.approx((1 + 0.25) / 2)
  # threshold moves the cut: at 0.5 only the last is positive.
  assert metrics.auroc_thresholded(s, y, threshold=-0.2) == 1.0


def test_thresholded_batch_average_matches_manual_loop():
  rng = np.random.default_rng(3)
  y = rng.integers(0, 2, 70)
  s = rng.normal(size=70) + y
  got = metrics.auroc_thresholded(s, y, batch_size=16, seed=5)
  order = np.random.default_rng(5).permutation(70)
  want = []
  for b in range(4):  # 4 full batches of 16; the last 6 examples are dropped
    idx = order[16 * b:16 * (b + 1)]
    if 0 < y[idx].sum() < 16:
      want.append(roc_auc_score(y[idx], (s[idx] > 0).astype(float)))
  assert got == pytest.approx(np.mean(want))
  with pytest.raises(ValueError, match="batch_size=1"):
    metrics.auprc_thresholded(s, y, batch_size=1)


# ---------------------------------------------------------------------------------------
# Pure selection / window logic.
# ---------------------------------------------------------------------------------------


def test_eval_rounds_include_the_last_k_cheaply():
  assert reporting.eval_rounds(100, 10, 20) == list(range(10, 81, 10)) + list(range(81, 101))
  assert reporting.eval_rounds(10, 4) == [4, 8, 10]
  assert reporting.eval_rounds(5, 10, 20) == [1, 2, 3, 4, 5]   # k capped at rounds
  with pytest.raises(ValueError, match="eval_every=0"):
    reporting.eval_rounds(10, 0)


def test_select_index_ties_nan_and_select_from():
  h = [{"round": 1, "ood_loss": 0.1}, {"round": 5, "ood_loss": 0.4},
       {"round": 10, "ood_loss": float("nan")}, {"round": 15, "ood_loss": 0.3},
       {"round": 20, "ood_loss": 0.3}]
  assert reporting.select_index(h, "min:ood_loss") == (0, False)
  # The official FedILC code only lets rounds after the 6th compete.
  assert reporting.select_index(h, "min:ood_loss", select_from=7) == (3, False)  # tie: earliest
  assert reporting.select_index(h, "max:ood_loss") == (1, False)  # NaN never wins
  assert reporting.select_index(h, "min:ood_loss", select_from=50) == (0, True)
  sel = reporting.select_rounds_by(h, ["min:ood_loss"], select_from=50)
  assert sel["min:ood_loss"]["select_from_ignored"] and sel["min:ood_loss"]["round"] == 1
  with pytest.raises(ValueError, match="'min:ood_acc'"):
    reporting.select_index(h, "min:ood_acc")
  with pytest.raises(ValueError, match="bad selection rule"):
    reporting.select_index(h, "lowest ood_loss")


def test_last_k_mean_closed_form():
  h = [{"round": r, "acc": r / 10, "tag": "x"} for r in (2, 4, 6, 7, 8)]
  w = reporting.last_k_mean(h, 3)
  assert w == {"k": 3, "first_round": 6, "last_round": 8, "evaluations": 3,
               "acc": pytest.approx((0.6 + 0.7 + 0.8) / 3)}
  assert reporting.last_k_mean(h, 50)["evaluations"] == 5
  with pytest.raises(ValueError, match="k=0"):
    reporting.last_k_mean(h, 0)


def test_reporting_spec_errors():
  with pytest.raises(ValueError, match="bad rule 'ood_loss'"):
    reporting.Reporting(select=["ood_loss"])
  with pytest.raises(ValueError, match="last_k=-1"):
    reporting.Reporting(last_k=-1)
  with pytest.raises(ValueError, match="unknown keys \\['lastk'\\]"):
    reporting.resolve({"lastk": 3}, None)


# ---------------------------------------------------------------------------------------
# Runs.
# ---------------------------------------------------------------------------------------


def _shift_task(info=None):
  """Train clients: label = x0 > 0; the 'ood' set has the labels flipped, so its loss
  rises as training fits the clients (its minimum is early, never the last round)."""
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, 4)).astype(np.float32) for n in (20, 30, 25)]
  ys = [(x[:, 0] > 0).astype(np.int32) for x in xs]
  xo = rng.normal(size=(40, 4)).astype(np.float32)
  yo = (xo[:, 0] <= 0).astype(np.int32)
  xv = [rng.normal(size=(n, 4)).astype(np.float32) for n in (6, 14)]
  yv = [(x[:, 0] > 0).astype(np.int32) for x in xv]
  return Task("shift", "binary", from_client_arrays(xs, ys),
              {"val": from_client_arrays(xv, yv), "ood": from_client_arrays([xo], [yo])},
              models.mlp(4, (6,), 1), dict(info or {}))


_ALG = dict(client_lr=0.5, local_steps=2, batch_size=None)
_REP = reporting.Reporting(select=["min:ood_loss", "max:val_mean_client_accuracy"],
                           select_from=3, last_k=3, ranking=["ood", "val"],
                           fairness=["train", "val"], fairness_groups={"g": ["val", "ood"]})


@pytest.fixture(scope="module")
def shift_run():
  task = _shift_task()
  res = simulation.run(task, make_algorithm("fedavg", **_ALG), rounds=10, eval_every=4,
                       seed=0, progress=False, reporting=_REP)
  return task, res


def test_schedule_selection_and_window(shift_run):
  task, res = shift_run
  h = res.history
  assert [e["round"] for e in h] == [4, 8, 9, 10]  # every 4th + the last 3
  loss = np.array([e["ood_loss"] for e in h])
  rounds = np.array([e["round"] for e in h])
  i = int(np.argmin(np.where(rounds >= 3, loss, np.inf)))
  assert i != len(h) - 1, "test setup: the OOD loss must not be lowest at the end"
  assert res.selected["min:ood_loss"] == h[i]
  v = np.array([e["val_mean_client_accuracy"] for e in h])
  assert res.selected["max:val_mean_client_accuracy"]["round"] == h[int(np.argmax(v))]["round"]
  w = res.last_k_mean
  assert (w["k"], w["first_round"], w["evaluations"]) == (3, 8, 3)
  for key in ("ood_accuracy", "ood_auroc", "train_accuracy_variance"):
    assert w[key] == pytest.approx(np.mean([e[key] for e in h[1:]]))
  rep = res.report()
  assert rep["reporting"]["select_from"] == 3 and rep["last_k_mean"] is w


def test_selected_params_are_that_rounds_model_not_the_last(shift_run):
  """The official FedILC code kept `best_model = global_model`, a live reference that
  ends up as the last model. Here the selected model reproduces its round's metrics."""
  task, res = shift_run
  rule = "min:ood_loss"
  p = res.selected_params[rule]
  evaluate = build_evaluator(task.model, task.kind)
  got = summarize(evaluate(p, task.eval_sets["ood"]), "ood")
  assert got["ood_loss"] == pytest.approx(res.selected[rule]["ood_loss"], rel=1e-6)
  final = summarize(evaluate(res.params, task.eval_sets["ood"]), "ood")
  assert final["ood_loss"] == pytest.approx(res.final["ood_loss"], rel=1e-6)
  assert got["ood_loss"] < final["ood_loss"]
  diff = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), p,
                                      res.params))
  assert max(diff) > 0


def test_ranking_and_fairness_equal_direct_computation(shift_run):
  task, res = shift_run
  last = res.final
  direct = metrics.binary_metrics(task.model, res.params, task.eval_sets["ood"])
  assert last["ood_auroc"] == pytest.approx(direct["auroc"], abs=1e-9)
  assert last["ood_auprc"] == pytest.approx(direct["auprc"], abs=1e-9)
  logits, mask = metrics.predict(task.model, res.params, task.eval_sets["ood"])
  s = logits[..., 0][mask.astype(bool)]
  y = np.asarray(task.eval_sets["ood"].y)[mask.astype(bool)]
  assert last["ood_auroc_thresholded"] == pytest.approx(
      roc_auc_score(y, (s > 0).astype(float)), abs=1e-9)
  evaluate = build_evaluator(task.model, task.kind)
  per = {k: evaluate(res.params, d) for k, d in
         {"train": task.train, **task.eval_sets}.items()}
  acc = per["train"]["correct"] / per["train"]["n"]
  assert last["train_accuracy_variance"] == pytest.approx(np.var(acc))
  p = acc / acc.sum()
  assert last["train_accuracy_entropy"] == pytest.approx(-np.sum(p * np.log(p)))
  g = [per[k]["correct"].sum() / per[k]["n"].sum() for k in ("val", "ood")]
  assert last["g_accuracy_variance"] == pytest.approx(np.var(g))
  v = per["val"]["correct"] / per["val"]["n"]
  assert last["val_mean_client_accuracy"] == pytest.approx(v.mean())


def test_reporting_errors_come_before_compile(monkeypatch):
  def no_compile(*a, **k):
    raise AssertionError("compiled before validating reporting")
  monkeypatch.setattr(simulation, "build_round", no_compile)
  task = _shift_task()
  alg = make_algorithm("fedavg", **_ALG)
  cases = [({"select": ["min:ood_los"]}, "does not record"),
           ({"ranking": ["test"]}, "unknown evaluation set 'test'"),
           ({"fairness": ["oops"]}, "unknown set 'oops'"),
           ({"fairness_groups": {"g": ["val"]}}, "give >= 2"),
           ({"select": ["min:ood_auroc"]}, "does not record")]  # needs ranking=['ood']
  for spec, msg in cases:
    with pytest.raises(ValueError, match=msg):
      simulation.run(task, alg, rounds=2, progress=False, reporting=spec)
  one_class = Task("t", "binary", task.train, {"ood": from_client_arrays(
      [np.zeros((3, 4), np.float32)], [np.ones(3, np.int32)])}, task.model, {})
  with pytest.raises(ValueError, match="one class"):
    simulation.run(one_class, alg, rounds=2, progress=False, reporting={"ranking": ["ood"]})


def test_task_defaults_follow_the_papers():
  fedilc = reporting.for_task(_shift_task({"paper": "FedILC §5.1.1"}))
  assert fedilc.select == ("min:ood_loss",) and fedilc.select_from == 7
  assert fedilc.ranking == ("val", "ood") and fedilc.fairness == ("train", "val")
  assert reporting.for_task(_shift_task({"paper": "FedGMA §5.2"})).last_k == 20
  dom = reporting.for_task(_shift_task({"domains": ["a", "b", "c"]}))
  assert dom.select == ("max:val_mean_client_accuracy",) and not dom.last_k
  assert not reporting.for_task(_shift_task({"paper": "Invariant FedAvg"}))
  own = reporting.for_task(_shift_task({"paper": "FedGMA", "reporting": {"last_k": 5}}))
  assert own.last_k == 5


def test_no_progress_bar_off_a_terminal_only_plain_lines(capfd, tiny_binary):
  """Issue 12: a tqdm bar in a log file is one line per update; stderr is not a
  terminal here, so no bar is drawn: only plain lines (the first with the compile time,
  then one per evaluated round; tests/test_progress.py)."""
  data, model = tiny_binary
  task = Task("tiny", "binary", data, {}, model, {})
  simulation.run(task, make_algorithm("fedavg", local_steps=1), rounds=3, seed=0,
                 progress=True, reporting=None)
  out, err = capfd.readouterr()
  assert "fedavg on tiny" not in err + out and "\r" not in err and "round/s" not in err
  lines = [l for l in err.splitlines() if l.startswith("fedavg seed 0: ")]
  assert "compile" in lines[0] and len(lines) == 4, err  # rounds 1, 2, 3 evaluated
  assert [l.split(",")[0] for l in lines[1:]] == [f"fedavg seed 0: round {r}/3"
                                                  for r in (1, 2, 3)]


# ---------------------------------------------------------------------------------------
# Experiment outputs.
# ---------------------------------------------------------------------------------------


def _fedilc_like(data_dir=None, source="auto", download=False, seed=0):
  t = _shift_task({"paper": "FedILC §test"})
  t.defaults = dict(rounds=9, eval_every=3, local_steps=2, batch_size=None,
                    client_optimizer="sgd", client_lr=0.5, weight_decay=0.0)
  return t


if "_test_fedilc_like" not in task_registry():
  register_task("_test_fedilc_like", paper="test", summary="shift")(_fedilc_like)


@pytest.mark.slow
def test_experiment_writes_selected_and_last_k(tmp_path):
  import io
  from fedjax_inv.runner.experiment import run_experiment
  stream = io.StringIO()
  out = tmp_path / "run"
  cfg = {"task": "_test_fedilc_like", "algorithm": "fedavg,fedprox", "seeds": 1,
         "out": str(out), "last_k": 2}
  summary = run_experiment(cfg, progress=False, stream=stream)
  r = summary["runs"][0]
  assert set(r["selected"]) == {"min:ood_loss"} and r["last_k_mean"]["k"] == 2
  assert r["reporting"]["select_from"] == 7
  assert r["selected"]["min:ood_loss"]["round"] >= 7  # rounds 3, 6 come before round 7
  md = (out / "results.md").read_text()
  assert "ood_accuracy@min:ood_loss" in md and "ood_auroc@min:ood_loss" in md
  assert "ood_auroc_thresholded@min:ood_loss" in md  # the official FedILC variant
  assert "ood_accuracy@last2" in md and "train_accuracy_variance@min:ood_loss" in md
  text = stream.getvalue()
  assert "at min:ood_loss (round " in text and "ood_accuracy@last2" in text
  rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in rows if r["algorithm"] == "fedavg"] == [3, 6, 8, 9]
  assert "ood_auroc" in rows[0] and "train_accuracy_entropy" in rows[0]
  # The table cell is the selected round's value (one seed: mean = that value).
  row = next(x for x in summary["table"] if x["algorithm"] == "fedprox")
  assert row["ood_accuracy@min:ood_loss_mean"] == pytest.approx(
      summary["runs"][1]["selected"]["min:ood_loss"]["ood_accuracy"])
  with pytest.raises(ValueError, match="does not record"):
    run_experiment(dict(cfg, select="min:nothing"), progress=False, stream=stream)
