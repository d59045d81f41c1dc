"""Per-example losses and metrics for the three task kinds (binary, multiclass, regression).

Conventions (used by every task, model and penalty):
  * ``binary``: logits ``[n, 1]`` (or ``[n]``), labels in {0, 1}; sigmoid cross-entropy.
  * ``multiclass``: logits ``[n, K]`` with K >= 2, integer labels; softmax cross-entropy.
  * ``regression``: predictions ``[n, 1]`` (or ``[n]``), float targets; squared error.

Masking: ``weights`` ``[n]`` (the 0/1 padding mask of a padded client batch, or any
nonnegative per-example weights) masks rows by ``where``, never by multiplication alone:
a row with weight 0 has no influence on a value or a gradient even when its logits,
labels or per-example loss hold inf or NaN ("double where": the row is replaced by a
finite constant before any non-linear op and dropped with ``where`` after it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

KINDS = ("binary", "multiclass", "regression")


def check_kind(kind: str) -> None:
  if kind not in KINDS:
    raise ValueError(f"loss kind {kind!r} is not one of {KINDS}.")


def per_example_loss(kind: str, logits: jax.Array, labels: jax.Array) -> jax.Array:
  """``[n]`` per-example loss (nats for cross-entropy, squared units for regression)."""
  if kind == "binary":
    return optax.sigmoid_binary_cross_entropy(logits.reshape(labels.shape),
                                              labels.astype(logits.dtype))
  if kind == "multiclass":
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels.astype(jnp.int32))
  if kind == "regression":
    return jnp.square(logits.reshape(labels.shape) - labels.astype(logits.dtype))
  raise ValueError(f"loss kind {kind!r} is not one of {KINDS}.")


def mask_rows(x: jax.Array, keep: jax.Array, fill=0) -> jax.Array:
  """``x`` ``[n, ...]`` with the rows where ``keep`` ``[n]`` (bool) is False set to ``fill``.

  The first ``where`` of the double-where pattern: call it on the *inputs* of a per-row
  computation so that a masked row holding inf/NaN never reaches a non-linear op (its
  output would be dropped by a later ``where``, but its local derivative, e.g.
  ``0 * inf``, would still put NaN into the gradient). The cotangent of a masked row is
  exactly 0. ``keep`` may also be any shape that is a prefix of ``x.shape``.
  """
  x = jnp.asarray(x)
  keep = jnp.asarray(keep)
  keep = keep.reshape(keep.shape + (1,) * (x.ndim - keep.ndim))
  return jnp.where(keep, x, jnp.asarray(fill, x.dtype))


def weighted_mean(values: jax.Array, weights: jax.Array | None) -> jax.Array:
  """``Σ w v / Σ w`` over ``values`` ``[n]`` with ``weights`` ``[n]`` (plain mean if
  ``weights`` is None); 0 when all weights are 0.

  A row with ``w = 0`` has no influence on the value or on the gradient (w.r.t.
  ``values`` and ``weights``), even when its value is inf or NaN; fractional positive
  weights scale as usual. (Upstream computations that produce ``values`` must mask their
  own inputs, e.g. with :func:`mask_rows`, for their gradients to stay finite.)
  """
  if weights is None:
    return jnp.mean(values)
  keep = weights > 0
  v = jnp.where(keep, values, jnp.zeros_like(values))
  wv = v * weights
  total = jnp.sum(jnp.where(keep, wv, jnp.zeros_like(wv)))
  # Divide by Σw exactly whenever it is positive (however small); the discarded branch of
  # the outer where divides by 1, so no 0/0 reaches the value or the gradient.
  wsum = jnp.sum(weights)
  positive = wsum > 0
  return jnp.where(positive, total / jnp.where(positive, wsum, jnp.ones_like(wsum)),
                   jnp.zeros_like(total))


def mean_loss(kind: str, logits, labels, weights=None) -> jax.Array:
  """Scalar (weighted) mean loss over examples.

  Args:
    kind: ``'binary'``, ``'multiclass'`` or ``'regression'``.
    logits: ``[n, 1]``/``[n]`` (binary, regression) or ``[n, K]`` (multiclass).
    labels: ``[n]`` labels or regression targets.
    weights: optional ``[n]`` nonnegative per-example weights (padding mask). A row with
      weight 0 has no influence on the loss or on its gradient w.r.t. logits and labels
      (its cotangent is exactly 0), even with inf/NaN logits or labels, or an
      out-of-range class index. (A model whose *inputs* hold inf/NaN on padded rows can
      still produce NaN parameter gradients in its own backward pass: mask the inputs
      too, e.g. with :func:`mask_rows`.)

  Returns:
    ``Σ w ℓ / Σ w`` (plain mean without weights; 0 when all weights are 0).
  """
  if weights is not None:
    keep = jnp.asarray(weights) > 0
    logits, labels = mask_rows(logits, keep), mask_rows(labels, keep)
  return weighted_mean(per_example_loss(kind, logits, labels), weights)


def per_example_correct(kind: str, logits, labels) -> jax.Array:
  """``[n]`` float 1.0 where the prediction is right (classification only)."""
  if kind == "binary":
    return ((logits.reshape(labels.shape) > 0).astype(jnp.int32)
            == labels.astype(jnp.int32)).astype(jnp.float32)
  if kind == "multiclass":
    return (jnp.argmax(logits, -1) == labels.astype(jnp.int32)).astype(jnp.float32)
  raise ValueError(f"accuracy is undefined for loss kind {kind!r}.")
