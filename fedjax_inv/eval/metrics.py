"""Evaluation metrics: ranking metrics (AUROC, AUPRC), fairness over clients, on-device
prediction.

* :func:`auroc` / :func:`auprc` — the binary ranking metrics FedILC reports on Color-MNIST
  and eICU (FedILC §5.2, Table 4): scikit-learn's ``roc_auc_score`` (trapezoidal ROC over
  distinct thresholds = Mann–Whitney U with ties counted 1/2) and
  ``average_precision_score`` (step-wise ``Σ (R_n − R_{n−1}) P_n`` over distinct
  thresholds, no interpolation), after this module's input checks.
* :func:`auroc_thresholded` / :func:`auprc_thresholded` — the variant the official FedILC
  code reports: scikit-learn's ``roc_auc_score`` and ``auc(precision_recall_curve)`` on
  thresholded 0/1 predictions (``sigmoid(logit) > 0.5``), optionally averaged over shuffled
  test batches as that code does. It is a balanced accuracy, not a ranking metric: keep it
  next to the continuous :func:`auroc` / :func:`auprc` when comparing with FedILC Table 4.
* :func:`accuracy_variance` / :func:`accuracy_entropy` / :func:`worst_client_accuracy` —
  the fairness measures of FedILC §5.2 / Table 3, which follow q-FFL (Li et al., "Fair
  resource allocation in federated learning", ICLR 2020, cited as [47] in FedILC).
* :func:`predict` / :func:`build_predict` — logits of every client's examples, computed
  on device (``lax.map`` over clients and over blocks of examples, so memory stays
  bounded), and :func:`binary_metrics` on top of it.
* :func:`per_client_accuracy` — per-client accuracies from the output of
  ``fedjax_inv.eval.build_evaluator(...)(params, data)``.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core.data import ClientData
from fedjax_inv.core.engine import eval_logits_fn

__all__ = [
    "accuracy_entropy",
    "accuracy_variance",
    "auprc",
    "auprc_thresholded",
    "auroc",
    "auroc_thresholded",
    "binary_metrics",
    "build_predict",
    "per_client_accuracy",
    "predict",
    "worst_client_accuracy",
]


# ---------------------------------------------------------------------------------------
# Ranking metrics (pure numpy).
# ---------------------------------------------------------------------------------------


def _binary_inputs(scores, labels, fn: str) -> tuple[np.ndarray, np.ndarray]:
  s = np.asarray(scores, np.float64)
  y = np.asarray(labels)
  if s.ndim == 2 and s.shape[1] == 1:
    s = s[:, 0]
  if s.ndim != 1:
    raise ValueError(f"{fn}: scores must have shape [n] or [n, 1], got {s.shape}; pass "
                     "one score (logit or probability of class 1) per example.")
  y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
  if y.shape != s.shape:
    raise ValueError(f"{fn}: {s.shape[0]} scores but labels of shape {y.shape}; pass one "
                     "0/1 label per score.")
  if not np.all(np.isfinite(s)):
    raise ValueError(f"{fn}: scores contain NaN or inf; check the model's outputs.")
  uniq = np.unique(y)
  if not np.all(np.isin(uniq, (0, 1))):
    raise ValueError(f"{fn}: labels must be 0 or 1, got values {uniq[:10].tolist()}.")
  if len(uniq) < 2:
    raise ValueError(f"{fn}: only one class ({uniq.tolist()}) present in labels; the "
                     "metric is undefined. Evaluate on a set with both classes.")
  return s, y.astype(np.int64)


def auroc(scores, labels) -> float:
  """Area under the ROC curve of a binary scorer.

  Args:
    scores: ``[n]`` (or ``[n, 1]``) real scores; higher means class 1 (logits or
      probabilities — any monotone transform gives the same value).
    labels: ``[n]`` labels in {0, 1}.

  Returns:
    AUROC in [0, 1]: the trapezoidal area under (FPR, TPR) over the distinct thresholds,
    equal to ``P(s⁺ > s⁻) + ½ P(s⁺ = s⁻)`` (scikit-learn's ``roc_auc_score``).

  Raises:
    ValueError: shape mismatch, non-finite scores, labels outside {0, 1}, or a single class.

  Source: FedILC §5.2, Table 4(a) ("AUCROC").
  """
  from sklearn.metrics import roc_auc_score
  s, y = _binary_inputs(scores, labels, "auroc")
  return float(roc_auc_score(y, s))


def auprc(scores, labels) -> float:
  """Area under the precision–recall curve as average precision.

  ``AP = Σ_k (R_k − R_{k−1}) P_k`` over the distinct thresholds in decreasing score order
  (``R_0 = 0``; tied scores are one threshold; no interpolation): scikit-learn's
  ``average_precision_score``.

  Args:
    scores: ``[n]`` (or ``[n, 1]``) real scores; higher means class 1.
    labels: ``[n]`` labels in {0, 1}.

  Returns:
    AP in [0, 1]; a random scorer gets about the positive rate.

  Raises:
    ValueError: shape mismatch, non-finite scores, labels outside {0, 1}, or a single class.

  Source: FedILC §5.2, Table 4(b) ("AUCPR").
  """
  from sklearn.metrics import average_precision_score
  s, y = _binary_inputs(scores, labels, "auprc")
  return float(average_precision_score(y, s))


def _thresholded_pair(s: np.ndarray, y: np.ndarray) -> tuple[float, float]:
  """(AUROC, AUPRC) of 0/1 predictions ``s`` as the official FedILC evaluator computes
  them: scikit-learn's ``roc_auc_score(y, s)`` and ``auc(recall, precision)`` of
  ``precision_recall_curve(y, s)``."""
  from sklearn.metrics import auc, precision_recall_curve, roc_auc_score
  precision, recall, _ = precision_recall_curve(y, s)
  return float(roc_auc_score(y, s)), float(auc(recall, precision))


def _thresholded(scores, labels, threshold, batch_size, seed, fn) -> tuple[float, float]:
  s, y = _binary_inputs(scores, labels, fn)
  pred = (s > float(threshold)).astype(np.float64)
  if batch_size is None:
    return _thresholded_pair(pred, y)
  if int(batch_size) != batch_size or batch_size < 2:
    raise ValueError(f"{fn}: batch_size={batch_size!r}; pass an integer >= 2 (the "
                     "official FedILC code uses its test batch size, 32 or 64) or None.")
  batch_size = int(batch_size)
  order = np.random.default_rng(seed).permutation(len(y))
  rocs, prs = [], []
  for start in range(0, len(y) - batch_size + 1, batch_size):
    idx = order[start:start + batch_size]
    if 0 < y[idx].sum() < batch_size:  # full batch with both classes, as the official code
      roc, pr = _thresholded_pair(pred[idx], y[idx])
      rocs.append(roc)
      prs.append(pr)
  if not rocs:
    raise ValueError(f"{fn}: no full batch of {batch_size} examples holds both classes "
                     f"({len(y)} examples); use a smaller batch_size or batch_size=None.")
  return float(np.mean(rocs)), float(np.mean(prs))


def auroc_thresholded(scores, labels, threshold: float = 0.0, batch_size: int | None = None,
                      seed: int = 0) -> float:
  """AUROC of thresholded 0/1 predictions — what the official FedILC code reports.

  The official evaluator (``evaluator_helper.py``, ``mean_roc_auc``) calls scikit-learn's
  ``roc_auc_score(y, preds)`` with ``preds = (sigmoid(logit) > 0.5)`` in {0, 1}, so its
  "AUCROC" is the balanced accuracy ``(TPR + TNR) / 2``, not a ranking metric; it is
  averaged over the full shuffled test batches that contain both classes. Use
  :func:`auroc` for the usual continuous AUROC.

  Args:
    scores: ``[n]`` (or ``[n, 1]``) logits (``threshold=0`` is probability 0.5).
    labels: ``[n]`` labels in {0, 1}.
    threshold: predict 1 where ``score > threshold`` (strict, as the official code).
    batch_size: None (default) — one value over all ``n`` examples; an integer — the
      official batch average: examples shuffled with ``seed``, the mean over consecutive
      full batches of this size that hold both classes (the official shuffles are not
      reproducible, so values differ from theirs by batch sampling noise).
    seed: shuffling seed for ``batch_size``.

  Returns:
    A value in [0, 1]; equals ``(TPR + TNR) / 2`` of the thresholded predictions when
    ``batch_size`` is None.

  Raises:
    ValueError: as :func:`auroc`; ``batch_size`` < 2 or no usable batch.

  Source: FedILC §5.2, Table 4(a), as computed by the official code
  (github.com/mikemikezhu/FedILC, evaluator_helper.py / evaluator.py).
  """
  return _thresholded(scores, labels, threshold, batch_size, seed, "auroc_thresholded")[0]


def auprc_thresholded(scores, labels, threshold: float = 0.0, batch_size: int | None = None,
                      seed: int = 0) -> float:
  """AUPRC of thresholded 0/1 predictions — what the official FedILC code reports.

  The official ``mean_pr_auc`` computes ``auc(recall, precision)`` (trapezoid rule) of
  scikit-learn's ``precision_recall_curve(y, preds)`` with ``preds`` in {0, 1}: the
  curve through (0, 1), (TPR, precision of the positive predictions) and, unless
  TPR = 1, (1, positive rate). Use :func:`auprc` for the usual average precision.

  Its arguments (``scores``, ``labels``, ``threshold``, ``batch_size``, ``seed``) are as in
  :func:`auroc_thresholded`.

  Returns:
    A value in [0, 1] (e.g. ``(1 + π) / 2`` for all-negative predictions, ``π`` = the
    positive rate: the trapezoid rewards the (0, 1) end point).

  Raises:
    ValueError: as :func:`auroc_thresholded`.

  Source: FedILC §5.2, Table 4(b), as computed by the official code
  (github.com/mikemikezhu/FedILC, evaluator_helper.py / evaluator.py).
  """
  return _thresholded(scores, labels, threshold, batch_size, seed, "auprc_thresholded")[1]


# ---------------------------------------------------------------------------------------
# Fairness over clients (pure numpy).
# ---------------------------------------------------------------------------------------


def _accs(client_accuracies, fn: str) -> np.ndarray:
  a = np.asarray(client_accuracies, np.float64).reshape(-1)
  if a.size == 0:
    raise ValueError(f"{fn}: got no client accuracies; pass one accuracy per client.")
  if not np.all(np.isfinite(a)) or np.any(a < 0) or np.any(a > 1):
    raise ValueError(f"{fn}: client accuracies must be fractions in [0, 1], got "
                     f"{a[:10].tolist()}; divide percentages by 100.")
  return a


def accuracy_variance(client_accuracies) -> float:
  """Variance of the accuracy distribution over clients (fairness; lower is fairer).

  ``Var(a) = (1/N) Σ_i (a_i − ā)²`` — population variance (``ddof=0``), as in q-FFL
  (Li et al. 2020), which FedILC follows. FedILC Table 3 reports it ×1000.

  Args:
    client_accuracies: ``[N]`` accuracies in [0, 1], one per client (or sub-environment).

  Raises:
    ValueError: empty input or values outside [0, 1].

  Source: FedILC §5.2 and Table 3 ("Variance").
  """
  return float(np.var(_accs(client_accuracies, "accuracy_variance")))


def accuracy_entropy(client_accuracies) -> float:
  """Entropy of the normalized accuracy vector (fairness; higher is fairer).

  ``H = −Σ_i p_i ln p_i`` with ``p_i = a_i / Σ_j a_j`` (natural log, nats; ``0 ln 0 = 0``).
  ``KL(p ‖ uniform) = ln N − H``, which is why FedILC calls the two interchangeable. The
  maximum ``ln N`` is reached when every client has the same accuracy (FedILC Table 3's
  ≈21.95 ×10 on 9 sub-environments is close to ``ln 9 = 2.197``).

  Args:
    client_accuracies: ``[N]`` accuracies in [0, 1], not all zero.

  Raises:
    ValueError: empty input, values outside [0, 1], or all accuracies zero.

  Source: FedILC §5.2 and Table 3 ("Entropy"); q-FFL (Li et al. 2020), entropy of accuracy.
  """
  a = _accs(client_accuracies, "accuracy_entropy")
  total = a.sum()
  if total <= 0:
    raise ValueError("accuracy_entropy: all client accuracies are 0; the normalized "
                     "accuracy vector is undefined.")
  p = a / total
  nz = p > 0
  return float(-np.sum(p[nz] * np.log(p[nz])))


def worst_client_accuracy(client_accuracies) -> float:
  """Lowest accuracy over clients, ``min_i a_i`` (in [0, 1]).

  Raises:
    ValueError: empty input or values outside [0, 1].

  Source: the worst-case view of fairness in q-FFL (Li et al. 2020) / FedILC §5.2.
  """
  return float(np.min(_accs(client_accuracies, "worst_client_accuracy")))


def per_client_accuracy(evaluator_output: dict) -> np.ndarray:
  """Per-client accuracies ``correct / n`` from ``build_evaluator(...)(params, data)``.

  Args:
    evaluator_output: dict with ``correct`` and ``n`` arrays of shape ``[N]`` (as returned
      by ``fedjax_inv.eval.build_evaluator``).

  Returns:
    ``[N]`` float64 accuracies in [0, 1].

  Raises:
    ValueError: the output has no ``correct`` (a regression task) or mismatched shapes.
  """
  if "correct" not in evaluator_output or "n" not in evaluator_output:
    raise ValueError("per_client_accuracy: expected the evaluator's dict with 'correct' "
                     f"and 'n', got keys {sorted(evaluator_output)}; accuracy is undefined "
                     "for regression tasks.")
  c = np.asarray(evaluator_output["correct"], np.float64)
  n = np.asarray(evaluator_output["n"], np.float64)
  if c.shape != n.shape:
    raise ValueError(f"per_client_accuracy: 'correct' {c.shape} and 'n' {n.shape} differ.")
  return c / np.maximum(n, 1.0)


# ---------------------------------------------------------------------------------------
# On-device prediction.
# ---------------------------------------------------------------------------------------


def build_predict(model, algorithm=None, eval_batch: int = 2048,
                  seed: int = 0) -> Callable[[dict, ClientData], tuple[np.ndarray, np.ndarray]]:
  """Returns ``predict_fn(params, data) -> (logits [N, n_max, K], mask [N, n_max])``.

  Build it once and call it many times (one compilation per data shape). Each client is
  processed in blocks of ``min(eval_batch, n_max)`` examples with ``lax.map`` over
  clients and over blocks, inside one ``jax.jit``.

  Args:
    model: the ``FunctionalModel`` that ``params`` belong to (for an algorithm with a
      ``model_transform`` such as FedSR, pass ``algorithm.model_for(task.model)``).
    algorithm: optional ``Algorithm``; if one of its components defines ``eval_forward``
      (FedSR's Monte-Carlo prediction) or ``forward``, predictions use it with a fixed
      key derived from ``seed`` — the same rule as ``fedjax_inv.eval.build_evaluator``.
    eval_batch: examples per block (>= 1).
    seed: key for stochastic forward passes.

  Raises:
    ValueError: ``eval_batch < 1``.
  """
  if int(eval_batch) < 1:
    raise ValueError(f"eval_batch={eval_batch}; it must be a positive number of examples.")
  key0 = jax.random.key(seed)
  forward = eval_logits_fn(model, algorithm)

  @functools.partial(jax.jit, static_argnames=("block",))
  def _logits(params, x, block):
    nb = x.shape[1] // block

    def one_client(xc):
      xb = xc.reshape((nb, block) + xc.shape[1:])

      def one_block(args):
        i, xbb = args
        out = forward(params, xbb, jax.random.fold_in(key0, i))
        return out.reshape(block, -1)

      out = jax.lax.map(one_block, (jnp.arange(nb), xb))
      return out.reshape((nb * block,) + out.shape[2:])

    return jax.lax.map(one_client, x)

  def predict_fn(params, data: ClientData):
    n_max = data.n_max
    block = min(int(eval_batch), n_max)
    pad = (-n_max) % block
    x = data.x
    if pad:
      x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    logits = np.asarray(_logits(params, x, block=block))[:, :n_max]
    return logits, np.asarray(data.mask())

  return predict_fn


def predict(model, params, data: ClientData, eval_batch: int = 2048, algorithm=None,
            seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Logits of every example of every client, computed on device.

  Args:
    model: ``FunctionalModel`` of ``params`` (see :func:`build_predict`).
    params: parameter pytree.
    data: ``ClientData`` with ``x [N, n_max, ...]``.
    eval_batch: examples per on-device block.
    algorithm: see :func:`build_predict`.
    seed: see :func:`build_predict`.

  Returns:
    ``(logits [N, n_max, K] float32, mask [N, n_max] float32)``; ``mask`` is 1.0 on real
    examples and 0.0 on padding (padding rows hold the logits of zero inputs). ``K = 1``
    for binary and regression tasks.

  Raises:
    ValueError: ``eval_batch < 1``.
  """
  return build_predict(model, algorithm, eval_batch, seed)(params, data)


def binary_metrics(model, params, data: ClientData, eval_batch: int = 2048,
                   algorithm=None) -> dict:
  """AUROC, AUPRC, accuracy and loss of a binary classifier, pooled over all the real
  examples of all clients of ``data``.

  ``model``, ``params``, ``eval_batch`` and ``algorithm`` are as in :func:`predict`.

  Args:
    data: ``ClientData`` with labels in {0, 1}.

  Returns:
    ``{'auroc', 'auprc', 'accuracy', 'loss'}`` floats: AUROC/AUPRC in [0, 1] (scores =
    logits), accuracy = fraction with ``(logit > 0) == label``, loss = mean sigmoid
    cross-entropy in nats.

  Raises:
    ValueError: the model outputs more than one logit, labels outside {0, 1}, or a single
      class in ``data``.

  Source: FedILC §5.2 (Tables 2, 4, 6: loss, AUCROC, AUCPR, accuracy).
  """
  logits, mask = predict(model, params, data, eval_batch=eval_batch, algorithm=algorithm)
  if logits.shape[-1] != 1:
    raise ValueError(f"binary_metrics: the model outputs {logits.shape[-1]} logits per "
                     "example; binary tasks need one (kind='binary').")
  real = mask.astype(bool)
  s = logits[..., 0][real].astype(np.float64)
  y = np.asarray(data.y)[real]
  auc = auroc(s, y)  # validates the labels
  y = y.astype(np.float64)
  loss = np.mean(np.logaddexp(0.0, s) - y * s)
  acc = np.mean((s > 0).astype(np.float64) == y)
  return {"auroc": auc, "auprc": auprc(s, y.astype(np.int64)), "accuracy": float(acc),
          "loss": float(loss)}
