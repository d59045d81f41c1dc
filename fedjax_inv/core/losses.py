"""Per-example losses and metrics for the three task kinds (binary, multiclass, regression).

Conventions (used by every task, model and penalty):
  * ``binary``: logits ``[n, 1]`` (or ``[n]``), labels in {0, 1}; sigmoid cross-entropy.
  * ``multiclass``: logits ``[n, K]`` with K >= 2, integer labels; softmax cross-entropy.
  * ``regression``: predictions ``[n, 1]`` (or ``[n]``), float targets; squared error.
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


def weighted_mean(values: jax.Array, weights: jax.Array | None) -> jax.Array:
  """``Σ w v / Σ w`` (plain mean if ``weights`` is None); 0 when all weights are 0."""
  if weights is None:
    return jnp.mean(values)
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-12)


def mean_loss(kind: str, logits, labels, weights=None) -> jax.Array:
  """Scalar (weighted) mean loss over examples; ``weights`` ``[n]`` masks padding."""
  return weighted_mean(per_example_loss(kind, logits, labels), weights)


def per_example_correct(kind: str, logits, labels) -> jax.Array:
  """``[n]`` float 1.0 where the prediction is right (classification only)."""
  if kind == "binary":
    return ((logits.reshape(labels.shape) > 0).astype(jnp.int32)
            == labels.astype(jnp.int32)).astype(jnp.float32)
  if kind == "multiclass":
    return (jnp.argmax(logits, -1) == labels.astype(jnp.int32)).astype(jnp.float32)
  raise ValueError(f"accuracy is undefined for loss kind {kind!r}.")
