"""Metrics: ranking metrics equal scikit-learn's (ties included), fairness measures match
their closed forms, on-device prediction equals a per-client loop."""
import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from fedjax_inv import models
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.eval import build_evaluator
from fedjax_inv.eval import metrics


@pytest.mark.parametrize("seed", range(6))
def test_auroc_auprc_equal_sklearn_with_ties(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 300))
  y = rng.integers(0, 2, n)
  y[:2] = [0, 1]
  # Few distinct values -> many ties, correlated with the label.
  s = np.round(rng.normal(size=n) + 0.8 * y, 1 if seed % 2 else 0)
  assert metrics.auroc(s, y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)
  assert metrics.auprc(s, y) == pytest.approx(average_precision_score(y, s), abs=1e-12)
  # [n, 1] scores (binary logits) are accepted.
  assert metrics.auroc(s[:, None], y) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_auroc_closed_forms():
  y = np.array([0, 0, 1, 1])
  assert metrics.auroc([0.1, 0.2, 0.8, 0.9], y) == 1.0
  assert metrics.auroc([0.9, 0.8, 0.2, 0.1], y) == 0.0
  assert metrics.auroc([0.5, 0.5, 0.5, 0.5], y) == 0.5   # all tied: half credit
  assert metrics.auprc([0.5, 0.5, 0.5, 0.5], y) == 0.5   # = positive rate
  # One tie between a positive and a negative: (3 + 0.5) / 4.
  assert metrics.auroc([0.1, 0.7, 0.7, 0.9], y) == pytest.approx(0.875)


@pytest.mark.parametrize("fn", [metrics.auroc, metrics.auprc])
def test_ranking_metrics_reject_bad_input(fn):
  with pytest.raises(ValueError, match="one class"):
    fn([0.1, 0.2], [1, 1])
  with pytest.raises(ValueError, match="0 or 1"):
    fn([0.1, 0.2], [0, 2])
  with pytest.raises(ValueError, match="labels of shape"):
    fn([0.1, 0.2, 0.3], [0, 1])
  with pytest.raises(ValueError, match="NaN"):
    fn([0.1, np.nan], [0, 1])


def test_fairness_closed_forms():
  a = np.array([0.6, 0.8, 0.7, 0.9])
  assert metrics.accuracy_variance(a) == pytest.approx(np.mean((a - a.mean()) ** 2))
  p = a / a.sum()
  assert metrics.accuracy_entropy(a) == pytest.approx(-np.sum(p * np.log(p)))
  assert metrics.worst_client_accuracy(a) == 0.6
  # Equal accuracies: zero variance, maximal entropy ln N.
  assert metrics.accuracy_variance([0.7] * 9) == 0.0
  assert metrics.accuracy_entropy([0.7] * 9) == pytest.approx(np.log(9))
  # A zero-accuracy client contributes 0 ln 0 = 0.
  assert metrics.accuracy_entropy([0.0, 0.5, 0.5]) == pytest.approx(np.log(2))
  # Less equal accuracies -> lower entropy.
  assert metrics.accuracy_entropy([0.2, 0.9]) < metrics.accuracy_entropy([0.5, 0.6])


def test_fairness_rejects_bad_input():
  with pytest.raises(ValueError, match="no client"):
    metrics.accuracy_variance([])
  with pytest.raises(ValueError, match="percentages"):
    metrics.accuracy_entropy([80.0, 90.0])
  with pytest.raises(ValueError, match="all client accuracies are 0"):
    metrics.accuracy_entropy([0.0, 0.0])


def _toy():
  rng = np.random.default_rng(1)
  xs, ys = [], []
  for n in (7, 12, 3):
    x = rng.normal(size=(n, 4)).astype(np.float32)
    xs.append(x)
    ys.append((x[:, 0] > 0).astype(np.int32))
  ys[2][:] = [0, 1, 1]
  return from_client_arrays(xs, ys), xs, ys


def test_predict_equals_per_client_apply_and_masks_padding():
  data, xs, _ = _toy()
  model = models.mlp(4, (5,), 1)
  params = model.init(3)
  # eval_batch=5 does not divide n_max=12: exercises block padding.
  logits, mask = metrics.predict(model, params, data, eval_batch=5)
  assert logits.shape == (3, 12, 1) and mask.shape == (3, 12)
  np.testing.assert_array_equal(mask.sum(1), [7, 12, 3])
  for i, x in enumerate(xs):
    want = np.asarray(model.apply(params, x))
    np.testing.assert_allclose(logits[i, : len(x)], want, rtol=1e-5, atol=1e-6)


def test_binary_metrics_and_per_client_accuracy_match_numpy():
  data, xs, ys = _toy()
  model = models.mlp(4, (5,), 1)
  params = model.init(0)
  got = metrics.binary_metrics(model, params, data, eval_batch=4)
  s = np.concatenate([np.asarray(model.apply(params, x))[:, 0] for x in xs]).astype(
      np.float64)
  y = np.concatenate(ys)
  assert got["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-6)
  assert got["auprc"] == pytest.approx(average_precision_score(y, s), abs=1e-6)
  assert got["accuracy"] == pytest.approx(np.mean((s > 0) == y))
  p = 1 / (1 + np.exp(-s))
  assert got["loss"] == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)),
                                      rel=1e-4)
  out = build_evaluator(model, "binary")(params, data)
  acc = metrics.per_client_accuracy(out)
  for i, (x, yy) in enumerate(zip(xs, ys)):
    sc = np.asarray(model.apply(params, x))[:, 0]
    assert acc[i] == pytest.approx(np.mean((sc > 0) == yy))
  with pytest.raises(ValueError, match="regression"):
    metrics.per_client_accuracy({"loss_sum": np.zeros(2), "n": np.ones(2)})


def test_binary_metrics_rejects_multiclass_model():
  data, _, _ = _toy()
  model = models.mlp(4, (5,), 3)
  with pytest.raises(ValueError, match="one"):
    metrics.binary_metrics(model, model.init(0), data)
  with pytest.raises(ValueError, match="eval_batch"):
    metrics.predict(model, model.init(0), data, eval_batch=0)
