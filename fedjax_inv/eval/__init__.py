"""Evaluation on device: per-client sums of loss / correct predictions, mapped over clients."""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core import losses
from fedjax_inv.core.data import ClientData
from fedjax_inv.core.engine import eval_logits_fn


def masked_example_sums(kind: str, logits, labels, weights) -> tuple:
  """Weighted sums over a block of examples of the per-example loss and correctness.

  Args:
    kind: ``'binary'``, ``'multiclass'`` or ``'regression'``.
    logits: ``[B, 1]``/``[B]`` (binary, regression) or ``[B, K]`` (multiclass).
    labels: ``[B]`` labels or regression targets.
    weights: ``[B]`` nonnegative weights (the 0/1 mask of real vs padded examples).

  Returns:
    ``(loss_sum, correct)`` scalars: ``Σ_i w_i ℓ_i`` and ``Σ_i w_i 1[right_i]``
    (``correct`` is 0 for regression). A row with weight 0 has no influence on either
    value or on the gradient w.r.t. logits and labels, even when its logits or labels
    hold inf/NaN (double ``where``: the row is zeroed before the loss, dropped after it).
  """
  weights = jnp.asarray(weights)
  keep = weights > 0
  logits, labels = losses.mask_rows(logits, keep), losses.mask_rows(labels, keep)

  def wsum(v):
    wv = v * weights
    return jnp.sum(jnp.where(keep, wv, jnp.zeros_like(wv)))

  loss_sum = wsum(losses.per_example_loss(kind, logits, labels))
  if kind == "regression":
    return loss_sum, jnp.zeros((), loss_sum.dtype)
  return loss_sum, wsum(losses.per_example_correct(kind, logits, labels))


def build_evaluator(model, kind: str, algorithm=None, eval_batch: int = 2048,
                    seed: int = 0) -> Callable:
  """Returns ``evaluate(params, data: ClientData) -> dict`` of per-client numpy arrays.

  Output (each ``[N]`` over the ``N`` clients of ``data``): ``loss_sum`` (summed
  per-example loss), ``correct`` (number of right predictions; absent for regression),
  ``n`` (examples). Clients are mapped with ``lax.map`` and each client's examples in
  blocks of ``eval_batch``, so memory stays bounded for large evaluation sets.
  If an algorithm component defines ``eval_forward`` (FedSR's Monte-Carlo prediction),
  it is used with a fixed evaluation key; otherwise the deterministic model.
  Padded examples (past ``n[i]``) have no influence on any output, even when their
  inputs or labels hold inf/NaN: they are zeroed before the forward pass and dropped
  with ``where`` (:func:`masked_example_sums`).
  """
  losses.check_kind(kind)
  predict = eval_logits_fn(model, algorithm)

  key0 = jax.random.key(seed)

  @functools.partial(jax.jit, static_argnames=("block",))
  def _eval(params, x, y, n, block):
    nb = x.shape[1] // block

    def one_client(args):
      xc, yc, nc = args
      xb = xc.reshape((nb, block) + xc.shape[1:])
      yb = yc.reshape((nb, block))

      def one_block(args2):
        i, xbb, ybb = args2
        w = ((i * block + jnp.arange(block)) < nc).astype(jnp.float32)
        xbb = losses.mask_rows(xbb, w > 0)  # padded inputs never reach the model
        logits = predict(params, xbb, jax.random.fold_in(key0, i))
        return masked_example_sums(kind, logits, ybb, w)

      ls, cs = jax.lax.map(one_block, (jnp.arange(nb), xb, yb))
      return jnp.sum(ls), jnp.sum(cs)

    return jax.lax.map(one_client, (x, y, n))

  def evaluate(params, data: ClientData) -> dict:
    n_max = data.n_max
    block = min(eval_batch, n_max)
    pad = (-n_max) % block
    x, y = data.x, data.y
    if pad:
      x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
      y = jnp.pad(y, [(0, 0), (0, pad)])
    loss_sum, correct = _eval(params, x, y, data.n, block=block)
    out = {"loss_sum": np.asarray(loss_sum), "n": np.asarray(data.n)}
    if kind != "regression":
      out["correct"] = np.asarray(correct)
    return out

  return evaluate


def summarize(per_client: dict, prefix: str) -> dict:
  """Metrics of one evaluation set from the evaluator's per-client sums.

  Args:
    per_client: ``build_evaluator(...)(params, data)`` — ``loss_sum``, ``n`` (and
      ``correct`` for classification), each ``[N]`` over the set's ``N`` clients.
    prefix: the set's name (``train``, ``val``, ``ood``, ...).

  Returns:
    ``{prefix}_loss`` (mean per-example loss, pooled over all examples) and, for
    classification, ``{prefix}_accuracy`` (pooled fraction in [0, 1]),
    ``{prefix}_worst_client_accuracy`` (lowest per-client accuracy) and, when ``N > 1``,
    ``{prefix}_mean_client_accuracy`` (unweighted mean of the per-client accuracies: with
    one client per source domain, DomainBed's and FedIIR's training-domain validation
    accuracy); for regression ``{prefix}_mse`` (= the loss).

  Source: DomainBed ``model_selection.IIDAccuracySelectionMethod`` and FedIIR's
  ``main.py`` (mean over domains) for the per-client mean.
  """
  n = per_client["n"].astype(np.float64)
  out = {f"{prefix}_loss": float(per_client["loss_sum"].sum() / n.sum())}
  if "correct" in per_client:
    acc = per_client["correct"] / np.maximum(n, 1.0)
    out[f"{prefix}_accuracy"] = float(per_client["correct"].sum() / n.sum())
    out[f"{prefix}_worst_client_accuracy"] = float(np.min(acc))
    if len(n) > 1:
      out[f"{prefix}_mean_client_accuracy"] = float(np.mean(acc))
  else:
    out[f"{prefix}_mse"] = out[f"{prefix}_loss"]
  return out


def summary_keys(kind: str, prefix: str, num_clients: int) -> set:
  """The keys :func:`summarize` returns for a set of ``num_clients`` clients of a task of
  loss kind ``kind`` (computed without evaluating anything)."""
  if kind == "regression":
    return {f"{prefix}_loss", f"{prefix}_mse"}
  keys = {f"{prefix}_loss", f"{prefix}_accuracy", f"{prefix}_worst_client_accuracy"}
  if num_clients > 1:
    keys.add(f"{prefix}_mean_client_accuracy")
  return keys
