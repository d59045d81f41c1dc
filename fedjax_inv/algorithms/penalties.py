"""Losses and invariance penalties used by the algorithms (pure functions of arrays), and
the chunked per-example sum that several of them share (``sum_over_examples``).

Conventions shared by every function here:

* ``n`` is the per-client sample axis (always axis 0). ``weights`` is an optional ``[n]``
  nonnegative per-sample weight, typically the 0/1 padding mask of a padded client batch;
  with weights every "mean over samples" becomes ``Σ_i w_i v_i / Σ_i w_i`` (and is 0 when
  ``Σ_i w_i = 0``, i.e. an all-padding batch), so padded rows never change a result.
  Masked rows (``w_i = 0``) have no influence on the value nor on the gradient even when
  they hold inf or NaN (in logits, labels, targets or features): every kernel replaces
  them with a finite constant *before* any non-linear op and drops them with ``where``
  after it (the "double where"), so neither the forward nor the backward pass sees them.
* Classification losses take **binary** logits ``[n]`` or ``[n, 1]`` with labels in {0, 1}
  (int or float; sigmoid binary cross-entropy), or **multiclass** logits ``[n, K]``,
  ``K >= 2``, with integer labels ``[n]`` in ``[0, K)`` (softmax cross-entropy).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _check_weights(weights, n: int):
  if weights is None:
    return None
  weights = jnp.asarray(weights)
  if weights.shape != (n,):
    raise ValueError(
        f"weights must have shape [n]=({n},), got {tuple(weights.shape)}.")
  return weights


def _mask_rows(x, keep, fill=0):
  """``x [n, ...]`` with the rows where ``keep [n]`` (bool) is False set to ``fill``.

  The first ``where`` of the double-where pattern: a masked row may hold inf/NaN, which
  must not reach a non-linear op (its value would be discarded by the final ``where``,
  but its local derivative, e.g. ``0 * inf``, would still put NaN into the gradient).
  The cotangent of a masked row is exactly 0. ``None`` passes through.
  """
  if x is None:
    return None
  keep = keep.reshape(keep.shape + (1,) * (x.ndim - keep.ndim))
  return jnp.where(keep, x, jnp.asarray(fill, x.dtype))


def _mask_inputs(weights, *xs):
  """``xs`` (each ``[n, ...]``) with the rows of zero weight zeroed (unchanged when
  ``weights`` is None)."""
  if weights is None:
    return xs
  keep = weights > 0
  return tuple(_mask_rows(x, keep) for x in xs)


def _weighted_mean(values: jax.Array, weights) -> jax.Array:
  """Mean of per-sample ``values [n]``; weighted ``Σ w v / Σ w`` (0 if ``Σ w = 0``).

  Rows with ``w = 0`` contribute nothing to the value or the gradient (w.r.t. ``values``
  or ``weights``), even when their value is inf/NaN.
  """
  if weights is None:
    return jnp.mean(values)
  w = weights.astype(values.dtype)
  keep = w > 0
  wsum = jnp.sum(w)
  safe = jnp.where(wsum > 0, wsum, jnp.ones_like(wsum))
  # Double where: a non-finite value in a zero-weight (padded) row can leak in neither as
  # 0 * inf in the value nor as 0 * inf / NaN in the gradient.
  v = _mask_rows(values, keep)
  total = jnp.sum(jnp.where(keep, w * v, jnp.zeros_like(v)))
  return jnp.where(wsum > 0, total / safe, jnp.zeros_like(wsum))


def _classification_inputs(logits, labels):
  """Validates shapes (no computation); returns (logits, labels, binary) as jax arrays."""
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  if logits.ndim == 1 or (logits.ndim == 2 and logits.shape[1] == 1):
    n = logits.shape[0]
    if labels.shape not in ((n,), (n, 1)):
      raise ValueError(
          f"binary logits of shape {tuple(logits.shape)} need labels of shape ({n},) "
          f"or ({n}, 1), got {tuple(labels.shape)}.")
    return logits, labels, True
  if logits.ndim == 2:
    n, _ = logits.shape
    if labels.shape != (n,):
      raise ValueError(
          f"multiclass logits of shape {tuple(logits.shape)} need integer labels of "
          f"shape ({n},), got {tuple(labels.shape)}.")
    if not jnp.issubdtype(labels.dtype, jnp.integer):
      raise ValueError(
          f"multiclass labels must be integer class indices, got dtype {labels.dtype}.")
    return logits, labels, False
  raise ValueError(
      "logits must have shape [n] or [n, 1] (binary) or [n, K] (multiclass), got "
      f"{tuple(logits.shape)}.")


def _prepare(logits, labels, binary: bool):
  """(Traceable) float logits; binary logits/labels flattened to ``[n]`` float."""
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    logits = logits.astype(jnp.float32)
  if binary:
    n = logits.shape[0]
    return logits.reshape(n), labels.reshape(n).astype(logits.dtype)
  return logits, labels


def _per_sample_ce(logits, labels, binary: bool) -> jax.Array:
  if binary:  # -y log σ(f) - (1-y) log(1-σ(f)) = softplus(f) - y f, stable for any f.
    return jnp.logaddexp(jnp.zeros_like(logits), logits) - labels * logits
  lse = jax.nn.logsumexp(logits, axis=-1)
  picked = jnp.take_along_axis(logits, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
  return lse - picked


def _logit_grads(logits, labels, binary: bool) -> jax.Array:
  """∂ℓ_i/∂logits_i: ``[n, 1]`` (σ(f) − y) for binary, ``[n, K]`` softmax − onehot."""
  if binary:
    return (jax.nn.sigmoid(logits) - labels)[:, None]
  k = logits.shape[-1]
  return jax.nn.softmax(logits, axis=-1) - jax.nn.one_hot(labels, k, dtype=logits.dtype)


# ---------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------


def cross_entropy(logits, labels, weights=None) -> jax.Array:
  """Mean (or weighted-mean) cross-entropy.

  Args:
    logits: binary ``[n]`` or ``[n, 1]``; multiclass ``[n, K]`` with ``K >= 2``.
    labels: binary: ``[n]`` (or ``[n, 1]``) in {0, 1}, int or float; multiclass: ``[n]``
      integer class indices.
    weights: optional ``[n]`` nonnegative per-sample weights (padding mask); rows with
      weight 0 have no influence on the value or the gradient, even with inf/NaN logits
      or labels (or out-of-range class indices).

  Returns:
    Scalar ``mean_i ℓ_i`` or ``Σ w_i ℓ_i / Σ w_i`` (0 if ``Σ w = 0``), with ``ℓ`` the
    sigmoid binary cross-entropy (binary) or softmax cross-entropy (multiclass);
    identical to ``optax.sigmoid_binary_cross_entropy`` /
    ``optax.softmax_cross_entropy_with_integer_labels`` averaged.

  Raises:
    ValueError: logits not ``[n]``, ``[n, 1]`` or ``[n, K]``; labels shape not matching
      the logits; non-integer multiclass labels; weights not ``[n]``.

  Source: standard ERM loss (FedILC §5.1, Invariant FedAvg eq. 14-15 use BCE for the
  binary tasks).
  """
  logits, labels, binary = _classification_inputs(logits, labels)
  weights = _check_weights(weights, logits.shape[0])
  return _cross_entropy_kernel(logits, labels, weights, binary)


@functools.partial(jax.jit, static_argnums=(3,))
def _cross_entropy_kernel(logits, labels, weights, binary: bool) -> jax.Array:
  logits, labels = _mask_inputs(weights, logits, labels)
  logits, labels = _prepare(logits, labels, binary)
  return _weighted_mean(_per_sample_ce(logits, labels, binary), weights)


def mse(pred, targets, weights=None) -> jax.Array:
  """Mean squared error.

  Args:
    pred: ``[n, *out]`` predictions (``[n]``, ``[n, 1]`` or ``[n, D]``).
    targets: same shape as ``pred``; ``[n]`` targets are also accepted with ``[n, 1]``
      predictions.
    weights: optional ``[n]`` nonnegative per-sample weights (padding mask); rows with
      weight 0 have no influence on the value or the gradient, even with inf/NaN.

  Returns:
    Scalar: the mean over samples of the per-sample mean of ``(pred - targets)**2`` over
    the output dims (i.e. the plain mean over all elements when unweighted); weighted:
    ``Σ w_i e_i / Σ w_i`` (0 if ``Σ w = 0``).

  Raises:
    ValueError: ``pred`` is 0-d; shape mismatch between ``pred`` and ``targets``;
      weights not ``[n]``.

  Source: Invariant FedAvg §4.1 (linear-regression task, IRM Example 1 of Arjovsky et al.).
  """
  return _mse_kernel(*_mse_inputs(pred, targets, weights))


def _mse_inputs(pred, targets, weights):
  """Validates shapes; ``[n, 1]`` predictions against ``[n]`` targets become ``[n]``."""
  pred = jnp.asarray(pred)
  targets = jnp.asarray(targets)
  if pred.ndim == 0:
    raise ValueError("pred must have a leading sample axis [n, ...], got a scalar.")
  if pred.shape != targets.shape:
    if pred.ndim == 2 and pred.shape[1] == 1 and targets.shape == (pred.shape[0],):
      pred = pred.reshape(pred.shape[0])
    else:
      raise ValueError(
          f"pred shape {tuple(pred.shape)} does not match targets shape "
          f"{tuple(targets.shape)}.")
  return pred, targets, _check_weights(weights, pred.shape[0])


@jax.jit
def _mse_kernel(pred, targets, weights) -> jax.Array:
  pred, targets = _mask_inputs(weights, pred, targets)
  if not jnp.issubdtype(pred.dtype, jnp.floating):
    pred = pred.astype(jnp.float32)
  n = pred.shape[0]
  err = (pred - targets.astype(pred.dtype)) ** 2
  per_sample = err.reshape(n, -1).mean(axis=1) if err.ndim > 1 else err
  return _weighted_mean(per_sample, weights)


# ---------------------------------------------------------------------------------------
# IRMv1 (Invariant FedAvg eq. 13-15)
# ---------------------------------------------------------------------------------------


def irm_v1(logits, labels, weights=None, *, loss: str = "cross_entropy") -> jax.Array:
  """IRMv1 penalty: ``(d/dw L(w · logits) at w = 1)^2`` for a dummy scalar classifier w.

  ``L(w) = mean_i ℓ(w f_i, y_i)`` (weighted mean with ``weights``), so the derivative is
  ``mean_i ∂ℓ/∂f(f_i, y_i) · f_i``: binary ``(σ(f_i) − y_i) f_i``, multiclass
  ``Σ_k (softmax_k(f_i) − onehot_k(y_i)) f_ik``. Computed with ``jax.grad`` of the dummy
  scale, so it is differentiable w.r.t. the logits (it is meant to be added to a client's
  loss). It is 0 exactly when the scale w = 1 is stationary for the client's loss.

  Args:
    logits: binary ``[n]``/``[n, 1]`` or multiclass ``[n, K]`` (see ``cross_entropy``);
      with ``loss="mse"``: predictions ``[n, ...]`` (see ``mse``).
    labels: as in ``cross_entropy`` (or regression targets for ``loss="mse"``).
    weights: optional ``[n]`` nonnegative per-sample weights (padding mask). A row with
      weight 0 has no influence on the penalty or on its gradient (w.r.t. logits and
      labels), even when it holds inf/NaN: it is zeroed before the dummy scale
      ``w · logits`` (whose derivative would otherwise be ``Σ_i 0 · f_i = NaN``).
    loss: ``"cross_entropy"`` (default) or ``"mse"`` (the regression task; derivative
      ``mean_i 2 (f_i − y_i) f_i``).

  Returns:
    Scalar penalty ``>= 0`` (in the logits' float dtype).

  Raises:
    ValueError: ``loss`` not in {"cross_entropy", "mse"}; the shape errors of
      ``cross_entropy`` / ``mse``.

  Source: Invariant FedAvg §3.3 eq. 13 (IRMv1 of Arjovsky et al. 2019, w_0 = 1 a scalar),
  eq. 15 (added to each client's loss, weighted by λ).
  """
  if loss == "cross_entropy":
    logits, labels, binary = _classification_inputs(logits, labels)
    weights = _check_weights(weights, logits.shape[0])
    loss_fn = _ce_binary if binary else _ce_multiclass
  elif loss == "mse":
    logits, labels, weights = _mse_inputs(logits, labels, weights)
    loss_fn = _mse_kernel
  else:
    raise ValueError(f"loss must be 'cross_entropy' or 'mse', got {loss!r}.")
  return _irm_v1_kernel(logits, labels, weights, loss_fn)


# Module-level (hashable, cache-stable) loss functions for the static argument below.
def _ce_binary(logits, labels, weights):
  return _cross_entropy_kernel(logits, labels, weights, True)


def _ce_multiclass(logits, labels, weights):
  return _cross_entropy_kernel(logits, labels, weights, False)


@functools.partial(jax.jit, static_argnums=(3,))
def _irm_v1_kernel(logits, labels, weights, loss_fn) -> jax.Array:
  # Masked rows are zeroed before ``logits * w``: d/dw of the loss is Σ_i ∂ℓ/∂f_i · f_i,
  # and a masked row's 0 · inf would be NaN (loss_fn zeroes them again; harmless).
  logits, labels = _mask_inputs(weights, logits, labels)
  if not jnp.issubdtype(logits.dtype, jnp.floating):
    logits = logits.astype(jnp.float32)
  scale = jnp.ones((), logits.dtype)
  grad = jax.grad(lambda w: loss_fn(logits * w, labels, weights))(scale)
  return grad ** 2


# ---------------------------------------------------------------------------------------
# Fishr (FedILC §3.2)
# ---------------------------------------------------------------------------------------


def classifier_per_sample_grads(features, logit_grads) -> dict:
  """Per-sample gradients of a final linear layer ``logits = z @ W + b``, closed form.

  For sample ``i`` with ``g_i = ∂ℓ_i/∂logits_i``: ``∂ℓ_i/∂W = outer(z_i, g_i)`` and
  ``∂ℓ_i/∂b = g_i`` (gradients of each sample's own loss ``ℓ_i``, not of the batch mean).

  Args:
    features: ``[n, d]`` inputs ``z`` of the linear layer.
    logit_grads: ``[n, K]`` (or ``[n]``, read as ``[n, 1]``) per-sample loss gradients
      w.r.t. the logits.

  Returns:
    ``{'kernel': [n, d, K], 'bias': [n, K]}`` (Flax ``Dense`` parameter names).

  Raises:
    ValueError: features not 2-D; logit_grads not 1-D/2-D; sample counts differ.

  Source: Fishr (Rame et al. 2022, §3, gradients of the classifier only), as used in
  FedILC §3.2 / §5.
  """
  z = jnp.asarray(features)
  g = jnp.asarray(logit_grads)
  if z.ndim != 2:
    raise ValueError(f"features must have shape [n, d], got {tuple(z.shape)}.")
  if g.ndim == 1:
    g = g[:, None]
  if g.ndim != 2:
    raise ValueError(f"logit_grads must have shape [n, K] or [n], got {tuple(g.shape)}.")
  if z.shape[0] != g.shape[0]:
    raise ValueError(
        f"features ({z.shape[0]} samples) and logit_grads ({g.shape[0]} samples) "
        "disagree on n.")
  return _per_sample_grads_kernel(z, g)


@jax.jit
def _per_sample_grads_kernel(z, g) -> dict:
  dtype = jnp.result_type(z.dtype, g.dtype, jnp.float32)
  z, g = z.astype(dtype), g.astype(dtype)
  return {"kernel": jnp.einsum("nd,nk->ndk", z, g), "bias": g}


def per_sample_classifier_grad_variance(features, logits, labels, weights=None) -> dict:
  """Fishr statistic: per-coordinate variance over samples of the classifier's gradients.

  The diagonal of the per-sample gradient covariance ``C_e`` of the final linear layer
  (``logits = z @ W + b``): with ``G_i`` the per-sample gradient
  (``classifier_per_sample_grads`` of ``∂ℓ_i/∂logits``, i.e. ``σ(f) − y`` as ``[n, 1]``
  for binary, ``softmax − onehot`` for multiclass), returns the **centered**, biased
  (``1/n``, unbiased=False) variance ``mean_i (G_i − mean_j G_j)^2`` — as in FedILC's
  ``C_e`` (§3.2) and DomainBed's Fishr (``(g − g.mean(0)).pow(2).mean(0)``). With
  ``weights``: ``μ = Σ w_i G_i / Σ w``, ``var = Σ w_i (G_i − μ)^2 / Σ w`` (0 if
  ``Σ w = 0``), so padded rows (weight 0) are ignored: they have no influence on the
  value or on the gradient (w.r.t. features, logits, labels) even with inf/NaN in them.

  Args:
    features: ``[n, d]`` classifier inputs ``z``.
    logits: binary ``[n]``/``[n, 1]`` or multiclass ``[n, K]``, equal to ``z @ W + b``.
    labels: as in ``cross_entropy``.
    weights: optional ``[n]`` nonnegative per-sample weights (padding mask).

  Returns:
    ``{'kernel': [d, K], 'bias': [K]}`` (``K = 1`` for binary).

  Raises:
    ValueError: the shape errors of ``cross_entropy`` and ``classifier_per_sample_grads``
      (including features/logits disagreeing on ``n``); weights not ``[n]``.

  Source: FedILC §3.2 (gradient covariance C_e, diagonal only as in §5); Fishr
  (Rame et al. 2022).
  """
  logits, labels, binary = _classification_inputs(logits, labels)
  n = logits.shape[0]
  weights = _check_weights(weights, n)
  z = jnp.asarray(features)
  if z.ndim != 2 or z.shape[0] != n:
    raise ValueError(
        f"features must have shape [n={n}, d] to match the logits, got {tuple(z.shape)}.")
  return _grad_variance_kernel(z, logits, labels, weights, binary)


@functools.partial(jax.jit, static_argnums=(4,))
def _grad_variance_kernel(features, logits, labels, weights, binary: bool) -> dict:
  features, logits, labels = _mask_inputs(weights, features, logits, labels)
  logits, labels = _prepare(logits, labels, binary)
  n = logits.shape[0]
  grads = _per_sample_grads_kernel(features, _logit_grads(logits, labels, binary))

  def var(x):
    if weights is None:
      mu = jnp.mean(x, axis=0)
      return jnp.mean((x - mu) ** 2, axis=0)
    w = weights.astype(x.dtype).reshape((n,) + (1,) * (x.ndim - 1))
    wsum = jnp.sum(w)
    safe = jnp.where(wsum > 0, wsum, jnp.ones_like(wsum))
    keep = w > 0  # zero-weight (padded) rows cannot leak non-finite values in.
    mu = jnp.sum(jnp.where(keep, w * x, 0.0), axis=0) / safe
    v = jnp.sum(jnp.where(keep, w * (x - mu) ** 2, 0.0), axis=0) / safe
    return jnp.where(wsum > 0, v, jnp.zeros_like(v))

  return {k: var(v) for k, v in grads.items()}


def fishr_penalty(variances: PyTree, axis: int = 0) -> jax.Array:
  """Fishr penalty across clients: ``(1/E) Σ_e ‖C_e − C̄‖²``, ``C̄ = (1/E) Σ_e C_e``.

  Args:
    variances: pytree (e.g. the output of ``per_sample_classifier_grad_variance`` stacked
      over clients); every leaf has the client axis (size ``E``) at ``axis``.
    axis: position of the client axis in every leaf.

  Returns:
    Scalar: the squared Frobenius distance to the client mean, averaged over clients and
    summed over all leaves.

  Raises:
    ValueError: empty pytree; ``axis`` out of range for a leaf; an empty client axis.

  Source: FedILC §3.2 (L_Fishr), Alg. 1-2.
  """
  leaves = jax.tree.leaves(variances)
  if not leaves:
    raise ValueError("variances must contain at least one array leaf.")
  leaves = [jnp.asarray(leaf) for leaf in leaves]
  for c in leaves:
    if not isinstance(axis, int) or c.ndim == 0 or not -c.ndim <= axis < c.ndim:
      raise ValueError(
          f"axis={axis!r} is out of range for a leaf of shape {tuple(c.shape)}.")
    if c.shape[axis] == 0:
      raise ValueError(f"the client axis (axis={axis}) of a leaf is empty.")
  return _fishr_kernel(leaves, axis)


@functools.partial(jax.jit, static_argnums=(1,))
def _fishr_kernel(leaves, axis: int) -> jax.Array:
  total = None
  for c in leaves:
    if not jnp.issubdtype(c.dtype, jnp.floating):
      c = c.astype(jnp.float32)
    dev = c - jnp.mean(c, axis=axis, keepdims=True)
    term = jnp.sum(dev ** 2) / c.shape[axis]
    total = term if total is None else total + term
  return total


# ---------------------------------------------------------------------------------------
# Per-example sums, chunked (bounded memory: chunk × parameters): Fishr+Intra-Geo's
# per-example gradients (algorithms/intra_geo.py) and FedCurv's Fisher (fedcurv.py)
# ---------------------------------------------------------------------------------------


def sum_over_examples(fn: Callable, x, y, w, chunk: int):
  """``Σ_i fn(x_i, y_i, w_i)`` over the ``B`` examples of ``x [B, ...]``, ``y [B]``,
  ``w [B]``: ``vmap`` within chunks of ``chunk`` examples, ``lax.scan`` across chunks.
  The tail is padded with weight-0 examples, which ``fn`` must map to zero statistics.

  Args:
    fn: ``fn(x_i, y_i, w_i) -> pytree`` of one example (traceable; ``vmap``-ed).
    x, y, w: ``[B, ...]``, ``[B, ...]``, ``[B]`` (``w``: 1 real, 0 padding).
    chunk: examples per vectorized chunk (memory ``O(chunk × fn's output)``).

  Returns:
    The pytree of ``fn``'s outputs summed over the examples.
  """
  b = x.shape[0]
  s = max(1, min(int(chunk), b))
  pad = (-b) % s
  if pad:
    x = jnp.concatenate([x, jnp.zeros((pad,) + x.shape[1:], x.dtype)])
    y = jnp.concatenate([y, jnp.zeros((pad,) + y.shape[1:], y.dtype)])
    w = jnp.concatenate([w, jnp.zeros((pad,), w.dtype)])
  k = (b + pad) // s

  def chunk_sum(xc, yc, wc):
    return jax.tree.map(lambda a: jnp.sum(a, axis=0), jax.vmap(fn)(xc, yc, wc))

  if k == 1:
    return chunk_sum(x, y, w)
  xs, ys, ws = (a.reshape((k, s) + a.shape[1:]) for a in (x, y, w))
  zeros = jax.tree.map(lambda t: jnp.zeros(t.shape, t.dtype),
                       jax.eval_shape(chunk_sum, xs[0], ys[0], ws[0]))

  def body(carry, inp):
    return jax.tree.map(jnp.add, carry, chunk_sum(*inp)), None

  out, _ = jax.lax.scan(body, zeros, (xs, ys, ws))
  return out


def zero_where(keep, tree):
  """Every leaf of ``tree`` where ``keep`` (a bool, broadcast), else zeros of its shape."""
  return jax.tree.map(lambda a: jnp.where(keep, a, jnp.zeros_like(a)), tree)


# ---------------------------------------------------------------------------------------
# FedProx / FedSR regularisers
# ---------------------------------------------------------------------------------------


def prox_term(params: PyTree, global_params: PyTree, mu) -> jax.Array:
  """FedProx proximal term ``(μ/2) ‖w − w_t‖²`` summed over all pytree leaves.

  Args:
    params: the client's current parameters ``w`` (pytree).
    global_params: the round's global parameters ``w_t`` (same structure and shapes).
    mu: proximal coefficient ``μ >= 0`` (Python number or scalar array).

  Returns:
    Scalar.

  Raises:
    ValueError: the two pytrees differ in structure or in a leaf's shape; ``mu`` negative
      (checked when concrete).

  Source: Li et al. 2020 (FedProx), eq. 2; a base algorithm of FedGMA Alg. 1.
  """
  s1, s2 = jax.tree.structure(params), jax.tree.structure(global_params)
  if s1 != s2:
    raise ValueError(f"params and global_params differ in structure: {s1} vs {s2}.")
  try:
    if float(mu) < 0:
      raise ValueError(f"mu must be >= 0, got {mu!r}.")
  except (jax.errors.ConcretizationTypeError, TypeError):
    pass  # traced mu: cannot be checked.
  pairs = []
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(global_params)):
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.shape != b.shape:
      raise ValueError(
          f"params leaf shape {tuple(a.shape)} != global_params leaf shape "
          f"{tuple(b.shape)}.")
    pairs.append((a, b))
  return _prox_kernel(pairs, mu)


@jax.jit
def _prox_kernel(pairs, mu) -> jax.Array:
  total = jnp.zeros((), jnp.float32)
  for a, b in pairs:
    total = total + jnp.sum((a - b) ** 2)
  return 0.5 * mu * total


def gaussian_kl(mu_q, sigma_q, mu_p, sigma_p) -> jax.Array:
  """Analytic ``KL(N(μ_q, σ_q²) ‖ N(μ_p, σ_p²))`` for diagonal Gaussians, summed over the last axis.

  Per element: ``log(σ_p/σ_q) + (σ_q² + (μ_q − μ_p)²) / (2σ_p²) − 1/2``.

  Args:
    mu_q, sigma_q: ``[..., D]`` mean and standard deviation (> 0) of ``q = p(z|x)``.
    mu_p, sigma_p: broadcastable to the same shape, of the reference ``r(z|y)``
      (e.g. ``[n, D]`` gathered by label, or ``[D]``).

  Returns:
    ``[...]``: one KL per row (e.g. ``[n]`` per sample; FedSR's ℓ^CMI is its mean).
    Standard deviations must be positive (non-positive values give NaN/Inf; not checked,
    so the function stays traceable).

  Raises:
    ValueError: the four shapes are not broadcastable, or broadcast to a scalar (no
      last axis to sum over).

  Source: FedSR §3.3 eq. 17-18 (CMI regulariser ℓ^CMI with Gaussian p(z|x) and r(z|y)).
  """
  args = [jnp.asarray(a) for a in (mu_q, sigma_q, mu_p, sigma_p)]
  try:
    shape = np.broadcast_shapes(*(a.shape for a in args))
  except ValueError as e:
    raise ValueError(
        "mu_q, sigma_q, mu_p, sigma_p shapes are not broadcastable: "
        f"{[tuple(a.shape) for a in args]}.") from e
  if len(shape) == 0:
    raise ValueError("gaussian_kl needs at least one axis (the last is summed over).")
  return _gaussian_kl_kernel(*args, shape)


@functools.partial(jax.jit, static_argnums=(4,))
def _gaussian_kl_kernel(mu_q, sigma_q, mu_p, sigma_p, shape) -> jax.Array:
  dtype = jnp.result_type(mu_q, sigma_q, mu_p, sigma_p, jnp.float32)
  mq, sq, mp, sp = (a.astype(dtype) for a in (mu_q, sigma_q, mu_p, sigma_p))
  kl = (jnp.log(sp) - jnp.log(sq)
        + (sq ** 2 + (mq - mp) ** 2) / (2.0 * sp ** 2) - 0.5)
  return jnp.sum(jnp.broadcast_to(kl, shape), axis=-1)


def l2r(z, weights=None, squared: bool = True) -> jax.Array:
  """FedSR's L2 representation regulariser: mean over samples of ``‖z_i‖²`` (or ``‖z_i‖``).

  Args:
    z: ``[n, ...]`` representations (trailing dims are flattened per sample).
    weights: optional ``[n]`` nonnegative per-sample weights (padding mask); rows with
      weight 0 have no influence on the value or the gradient, even with inf/NaN.
    squared: ``True`` (the paper, eq. 10-11) uses ``‖z_i‖_2²``; ``False`` uses ``‖z_i‖_2``
      as FedSR's official code does (``z.norm(dim=1).mean()``).

  Returns:
    Scalar ``mean_i ‖z_i‖²`` (or weighted mean; 0 if ``Σ w = 0``).

  Raises:
    ValueError: ``z`` is 0-d; weights not ``[n]``.

  Source: FedSR §3.3 eq. 10-11 (ℓ^L2R).
  """
  z = jnp.asarray(z)
  if z.ndim == 0:
    raise ValueError("z must have a leading sample axis [n, ...], got a scalar.")
  weights = _check_weights(weights, z.shape[0])
  return _l2r_kernel(z, weights, bool(squared))


@functools.partial(jax.jit, static_argnums=(2,))
def _l2r_kernel(z, weights, squared: bool) -> jax.Array:
  (z,) = _mask_inputs(weights, z)
  if not jnp.issubdtype(z.dtype, jnp.floating):
    z = z.astype(jnp.float32)
  n = z.shape[0]
  sq = jnp.sum(z.reshape(n, -1) ** 2, axis=1)
  if not squared:
    # Safe sqrt: the gradient at z_i = 0 is 0 instead of NaN.
    pos = sq > 0
    sq = jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, jnp.ones_like(sq))), jnp.zeros_like(sq))
  return _weighted_mean(sq, weights)
