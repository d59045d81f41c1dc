"""Masked rows / absent clients have no influence, even when they hold inf or NaN.

Every reduction that takes a padding mask (per-sample ``weights``) or client weights is
checked against an independent plain-jnp computation on the real rows alone (the masked
rows sliced off): (a) the value matches, (b) ``jax.grad`` w.r.t. the inputs is finite
everywhere, matches the gradient of the sliced computation on the real rows and is
exactly 0 on the masked rows. A zero total weight must give a finite value.
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv import models
from fedjax_inv.algorithms import penalties
from fedjax_inv.core import aggregator as core_agg
from fedjax_inv.core import losses
from fedjax_inv.core.data import ClientData
from fedjax_inv import eval as fl_eval

BAD = [np.inf, -np.inf, np.nan]
N = 8
REAL = np.array([0, 2, 3, 5, 6])
MASKED = np.array([1, 4, 7])  # interleaved, not only at the end
W = np.zeros(N, np.float32)
W[REAL] = [1.0, 0.5, 2.0, 1.0, 1.5]  # fractional positive weights still scale
W_REAL = jnp.asarray(W[REAL])
W = jnp.asarray(W)
K = 3
RTOL, ATOL = 2e-5, 1e-6


def _rng(seed=0):
  return np.random.default_rng(seed)


def _poison(x, bad, rows=MASKED):
  """``x`` (numpy, rows on axis 0) with ``bad`` written into ``rows``."""
  x = np.array(x, copy=True)
  x[rows] = bad
  return jnp.asarray(x)


def _scalarize(tree):
  """A fixed, non-uniform linear functional of every leaf (so gradients are dense)."""
  total = 0.0
  for leaf in jax.tree.leaves(tree):
    leaf = jnp.asarray(leaf, jnp.float32)
    c = jnp.cos(1.0 + jnp.arange(leaf.size, dtype=jnp.float32)).reshape(leaf.shape)
    total = total + jnp.sum(c * leaf)
  return total


def _wmean(v, w):
  return jnp.sum(w * v) / jnp.sum(w)


def _check(fn, ref, args, argnums, real=REAL, masked=MASKED, rtol=RTOL, atol=ATOL):
  """(a) value of ``fn(*args)`` equals ``ref`` on the real rows; (b) gradients w.r.t.
  ``args[argnums]`` are finite, equal the sliced computation's on the real rows and are
  exactly 0 on the masked rows. Every arg has its rows on axis 0."""
  real_args = [a[real] for a in args]
  chex.assert_trees_all_close(fn(*args), ref(*real_args), rtol=rtol, atol=atol)
  grads = jax.grad(lambda *a: _scalarize(fn(*a)), argnums)(*args)
  ref_grads = jax.grad(lambda *a: _scalarize(ref(*a)), argnums)(*real_args)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g))), g
  chex.assert_trees_all_close(tuple(g[real] for g in grads), tuple(ref_grads),
                              rtol=rtol, atol=atol)
  for g in grads:
    assert np.all(np.asarray(g)[masked] == 0), g


def _check_zero_weight(fn, args, argnums):
  """All weights 0 (``fn`` closes over them): finite value, finite zero gradients."""
  out = fn(*args)
  for leaf in jax.tree.leaves(out):
    assert np.all(np.isfinite(np.asarray(leaf))), out
  grads = jax.grad(lambda *a: _scalarize(fn(*a)), argnums)(*args)
  for g in jax.tree.leaves(grads):
    assert np.all(np.asarray(g) == 0), g


# --------------------------------------------------------------------------------------
# Plain-jnp references (real rows only)
# --------------------------------------------------------------------------------------


def _bce(f, y):  # softplus(f) - y f
  return jnp.logaddexp(0.0, f) - y * f


def _softmax_ce(f, y):
  return -jnp.take_along_axis(jax.nn.log_softmax(f, -1), y[:, None], -1)[:, 0]


def _binary_inputs(bad, seed=0):
  r = _rng(seed)
  logits = _poison(r.normal(size=(N, 1)).astype(np.float32), bad)
  labels = _poison((r.uniform(size=N) > 0.5).astype(np.float32), bad)
  return logits, labels


def _multiclass_inputs(bad, seed=1):
  r = _rng(seed)
  logits = _poison(r.normal(size=(N, K)).astype(np.float32), bad)
  labels = r.integers(0, K, size=N).astype(np.int32)
  labels[MASKED] = [-1, K, 10 * K]  # garbage labels on the padding too
  return logits, jnp.asarray(labels)


def _regression_inputs(bad, seed=2, dim=1):
  r = _rng(seed)
  pred = _poison(r.normal(size=(N, dim)).astype(np.float32), bad)
  targets = _poison(r.normal(size=(N, dim)).astype(np.float32), bad)
  return pred, targets


# --------------------------------------------------------------------------------------
# penalties.py: cross_entropy / mse / irm_v1 / Fishr variance / l2r
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD)
def test_cross_entropy_binary(bad):
  logits, labels = _binary_inputs(bad)
  _check(lambda f, y: penalties.cross_entropy(f, y, W),
         lambda f, y: _wmean(_bce(f[:, 0], y), W_REAL), (logits, labels), (0, 1))


@pytest.mark.parametrize("bad", BAD)
def test_cross_entropy_multiclass(bad):
  logits, labels = _multiclass_inputs(bad)
  _check(lambda f: penalties.cross_entropy(f, labels, W),
         lambda f: _wmean(_softmax_ce(f, labels[REAL]), W_REAL), (logits,), (0,))


@pytest.mark.parametrize("bad", BAD)
def test_mse(bad):
  pred, targets = _regression_inputs(bad, dim=2)
  _check(lambda p, t: penalties.mse(p, t, W),
         lambda p, t: _wmean(jnp.mean((p - t) ** 2, axis=1), W_REAL),
         (pred, targets), (0, 1))


@pytest.mark.parametrize("bad", BAD)
def test_irm_v1_binary(bad):
  logits, labels = _binary_inputs(bad)

  def ref(f, y):
    f = f[:, 0]
    return _wmean((jax.nn.sigmoid(f) - y) * f, W_REAL) ** 2

  _check(lambda f, y: penalties.irm_v1(f, y, W), ref, (logits, labels), (0, 1))


@pytest.mark.parametrize("bad", BAD)
def test_irm_v1_multiclass(bad):
  logits, labels = _multiclass_inputs(bad)

  def ref(f):
    g = jax.nn.softmax(f, -1) - jax.nn.one_hot(labels[REAL], K)
    return _wmean(jnp.sum(g * f, axis=1), W_REAL) ** 2

  _check(lambda f: penalties.irm_v1(f, labels, W), ref, (logits,), (0,))


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("dim", [1, 2])
def test_irm_v1_mse(bad, dim):
  pred, targets = _regression_inputs(bad, dim=dim)

  def ref(p, t):
    return _wmean(jnp.mean(2.0 * (p - t) * p, axis=1), W_REAL) ** 2

  _check(lambda p, t: penalties.irm_v1(p, t, W, loss="mse"), ref, (pred, targets), (0, 1))


def _ref_grad_variance(z, g, w):
  """Weighted biased variance of the per-sample classifier gradients (z ⊗ g, g)."""
  wsum = jnp.sum(w)
  out = {}
  for name, x in (("kernel", z[:, :, None] * g[:, None, :]), ("bias", g)):
    ww = w.reshape((-1,) + (1,) * (x.ndim - 1))
    mu = jnp.sum(ww * x, axis=0) / wsum
    out[name] = jnp.sum(ww * (x - mu) ** 2, axis=0) / wsum
  return out


@pytest.mark.parametrize("bad", BAD)
def test_fishr_grad_variance_binary(bad):
  logits, labels = _binary_inputs(bad)
  z = _poison(_rng(3).normal(size=(N, 4)).astype(np.float32), bad)

  def ref(z, f, y):
    return _ref_grad_variance(z, jax.nn.sigmoid(f) - y[:, None], W_REAL)

  _check(lambda z, f, y: penalties.per_sample_classifier_grad_variance(z, f, y, W), ref,
         (z, logits, labels), (0, 1, 2))


@pytest.mark.parametrize("bad", BAD)
def test_fishr_grad_variance_multiclass(bad):
  logits, labels = _multiclass_inputs(bad)
  z = _poison(_rng(4).normal(size=(N, 4)).astype(np.float32), bad)

  def ref(z, f):
    return _ref_grad_variance(
        z, jax.nn.softmax(f, -1) - jax.nn.one_hot(labels[REAL], K), W_REAL)

  _check(lambda z, f: penalties.per_sample_classifier_grad_variance(z, f, labels, W), ref,
         (z, logits), (0, 1))


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("squared", [True, False])
def test_l2r(bad, squared):
  z = _poison(_rng(5).normal(size=(N, 2, 3)).astype(np.float32), bad)

  def ref(z):
    sq = jnp.sum(z.reshape(z.shape[0], -1) ** 2, axis=1)
    return _wmean(sq if squared else jnp.sqrt(sq), W_REAL)

  _check(lambda z: penalties.l2r(z, W, squared=squared), ref, (z,), (0,))


@pytest.mark.parametrize("bad", BAD)
def test_penalties_zero_total_weight(bad):
  w0 = jnp.zeros(N)
  every = np.arange(N)
  f2, y2 = _binary_inputs(bad)
  fk, yk = _multiclass_inputs(bad)
  p, t = _regression_inputs(bad)
  f2, y2, fk, p, t = (_poison(a, bad, every) for a in (f2, y2, fk, p, t))
  z = _poison(np.ones((N, 4), np.float32), bad, every)
  _check_zero_weight(lambda f, y: penalties.cross_entropy(f, y, w0), (f2, y2), (0, 1))
  _check_zero_weight(lambda f: penalties.cross_entropy(f, yk, w0), (fk,), (0,))
  _check_zero_weight(lambda p, t: penalties.mse(p, t, w0), (p, t), (0, 1))
  _check_zero_weight(lambda f, y: penalties.irm_v1(f, y, w0), (f2, y2), (0, 1))
  _check_zero_weight(lambda f: penalties.irm_v1(f, yk, w0), (fk,), (0,))
  _check_zero_weight(lambda p, t: penalties.irm_v1(p, t, w0, loss="mse"), (p, t), (0, 1))
  _check_zero_weight(
      lambda z, f: penalties.per_sample_classifier_grad_variance(z, f, yk, w0), (z, fk),
      (0, 1))
  _check_zero_weight(lambda z: penalties.l2r(z, w0, squared=False), (z,), (0,))
  assert float(penalties.cross_entropy(f2, y2, w0)) == 0.0


# --------------------------------------------------------------------------------------
# core/losses.py: weighted_mean / mean_loss
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD)
def test_losses_weighted_mean(bad):
  v = _poison(_rng(6).normal(size=N).astype(np.float32), bad)
  _check(lambda v: losses.weighted_mean(v, W), lambda v: _wmean(v, W_REAL), (v,), (0,))


@pytest.mark.parametrize("bad", BAD)
def test_mean_loss_binary(bad):
  logits, labels = _binary_inputs(bad)
  _check(lambda f, y: losses.mean_loss("binary", f, y, W),
         lambda f, y: _wmean(_bce(f[:, 0], y), W_REAL), (logits, labels), (0, 1))


@pytest.mark.parametrize("bad", BAD)
def test_mean_loss_multiclass(bad):
  logits, labels = _multiclass_inputs(bad)
  _check(lambda f: losses.mean_loss("multiclass", f, labels, W),
         lambda f: _wmean(_softmax_ce(f, labels[REAL]), W_REAL), (logits,), (0,))


@pytest.mark.parametrize("bad", BAD)
def test_mean_loss_regression(bad):
  pred, targets = _regression_inputs(bad)
  targets = targets[:, 0]
  _check(lambda p, t: losses.mean_loss("regression", p, t, W),
         lambda p, t: _wmean((p[:, 0] - t) ** 2, W_REAL), (pred, targets), (0, 1))


@pytest.mark.parametrize("bad", BAD)
def test_losses_zero_total_weight(bad):
  w0 = jnp.zeros(N)
  every = np.arange(N)
  v = _poison(np.ones(N, np.float32), bad, every)
  f2, y2 = (_poison(a, bad, every) for a in _binary_inputs(bad))
  fk, yk = _multiclass_inputs(bad)
  fk = _poison(fk, bad, every)
  _check_zero_weight(lambda v: losses.weighted_mean(v, w0), (v,), (0,))
  _check_zero_weight(lambda f, y: losses.mean_loss("binary", f, y, w0), (f2, y2), (0, 1))
  _check_zero_weight(lambda f: losses.mean_loss("multiclass", f, yk, w0), (fk,), (0,))
  _check_zero_weight(lambda f, y: losses.mean_loss("regression", f, y, w0),
                     (f2, y2), (0, 1))
  assert float(losses.weighted_mean(v, w0)) == 0.0


# --------------------------------------------------------------------------------------
# eval/__init__.py: the evaluator's per-client sums
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_masked_example_sums(bad, kind):
  if kind == "binary":
    logits, labels = _binary_inputs(bad)
    ref_loss = lambda f, y: _bce(f[:, 0], y)  # noqa: E731
    ref_correct = lambda f, y: ((f[:, 0] > 0) == (y > 0.5)).astype(jnp.float32)  # noqa
    args, argnums = (logits, labels), (0, 1)
  elif kind == "multiclass":
    logits, labels = _multiclass_inputs(bad)
    ref_loss = _softmax_ce
    ref_correct = lambda f, y: (jnp.argmax(f, -1) == y).astype(jnp.float32)  # noqa
    args, argnums = (logits, labels), (0,)
  else:
    logits, labels = _regression_inputs(bad)
    labels = labels[:, 0]
    ref_loss = lambda f, y: (f[:, 0] - y) ** 2  # noqa: E731
    ref_correct = None
    args, argnums = (logits, labels), (0, 1)

  def fn(f, y):
    loss_sum, correct = fl_eval.masked_example_sums(kind, f, y, W)
    return loss_sum if ref_correct is None else (loss_sum, correct)

  def ref(f, y):
    loss_sum = jnp.sum(W_REAL * ref_loss(f, y))
    return loss_sum if ref_correct is None else (
        loss_sum, jnp.sum(W_REAL * ref_correct(f, y)))

  if kind == "multiclass":
    _check(lambda f: fn(f, labels), lambda f: ref(f, labels[REAL]), (logits,), (0,))
  else:
    _check(fn, ref, args, argnums)
  # Zero total weight (every row padding).
  every = np.arange(N)
  f0 = _poison(logits, bad, every)
  _check_zero_weight(lambda f: fl_eval.masked_example_sums(kind, f, labels, jnp.zeros(N)),
                     (f0,), (0,))


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("kind", ["binary", "multiclass", "regression"])
def test_build_evaluator_padded_rows(bad, kind):
  r = _rng(7)
  sizes = (5, 3)
  n_max, feat = 7, 4
  num_out = K if kind == "multiclass" else 1
  model = models.mlp(feat, (6,), num_out)
  params = model.init(0)
  x = r.normal(size=(len(sizes), n_max, feat)).astype(np.float32)
  if kind == "regression":
    y = r.normal(size=(len(sizes), n_max)).astype(np.float32)
  else:
    y = r.integers(0, num_out if kind == "multiclass" else 2,
                   size=(len(sizes), n_max)).astype(np.int32)
  for i, n in enumerate(sizes):
    x[i, n:] = bad
    if kind == "regression":
      y[i, n:] = bad
    else:
      y[i, n:] = -1
  data = ClientData(x=jnp.asarray(x), y=jnp.asarray(y), n=jnp.asarray(sizes, jnp.int32))
  # eval_batch=3 also pads each client to a multiple of the block.
  out = fl_eval.build_evaluator(model, kind, eval_batch=3)(params, data)
  for i, n in enumerate(sizes):
    f = model.apply(params, jnp.asarray(x[i, :n]))
    yy = jnp.asarray(y[i, :n])
    if kind == "binary":
      loss = jnp.sum(_bce(f[:, 0], yy.astype(jnp.float32)))
      correct = jnp.sum((f[:, 0] > 0) == (yy == 1))
    elif kind == "multiclass":
      loss = jnp.sum(_softmax_ce(f, yy))
      correct = jnp.sum(jnp.argmax(f, -1) == yy)
    else:
      loss = jnp.sum((f[:, 0] - yy) ** 2)
    np.testing.assert_allclose(out["loss_sum"][i], loss, rtol=1e-5, atol=1e-6)
    if kind != "regression":
      assert out["correct"][i] == int(correct)
  assert np.all(np.isfinite(out["loss_sum"]))


# --------------------------------------------------------------------------------------
# core/aggregator.py and aggregators.py: client weights (absent clients: weight 0)
# --------------------------------------------------------------------------------------


def _engine_sum(aggregator, tree, weights):
  """What the engine does: lift every client (vmap), sum over clients, finalize."""
  stats = jax.vmap(aggregator.lift)(tree, weights)
  return aggregator.finalize(jax.tree.map(lambda s: jnp.sum(s, axis=0), stats))


def _updates(bad, seed=8, clients=MASKED):
  """Client updates ``{'w': [N, 3, 2], 'b': [N, 2]}`` with ``bad`` on absent clients;
  no exact zeros and both signs on the real clients."""
  r = _rng(seed)
  w = r.normal(size=(N, 3, 2)).astype(np.float32)
  b = r.normal(size=(N, 2)).astype(np.float32)
  w[REAL[:2], 0, 0] = np.abs(w[REAL[:2], 0, 0]) + 0.1
  w[REAL[2:], 0, 0] = -np.abs(w[REAL[2:], 0, 0]) - 0.1
  w[REAL, 1, 1] = np.abs(w[REAL, 1, 1]) + 0.1  # a unanimous coordinate
  return {"w": _poison(w, bad, clients), "b": _poison(b, bad, clients)}


def _check_agg(aggregator, ref, bad, rtol=RTOL, atol=ATOL):
  tree = _updates(bad)
  fn = lambda t: _engine_sum(aggregator, t, W)  # noqa: E731
  real_tree = jax.tree.map(lambda x: x[REAL], tree)
  chex.assert_trees_all_close(fn(tree), ref(real_tree), rtol=rtol, atol=atol)
  g = jax.grad(lambda t: _scalarize(fn(t)))(tree)
  g_ref = jax.grad(lambda t: _scalarize(ref(t)))(real_tree)
  for leaf in jax.tree.leaves(g):
    assert np.all(np.isfinite(np.asarray(leaf))), g
    assert np.all(np.asarray(leaf)[MASKED] == 0), g
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[REAL], g), g_ref,
                              rtol=rtol, atol=atol)
  # Zero total weight: every client absent.
  every = np.arange(N)
  tree0 = jax.tree.map(lambda x: _poison(x, bad, every), tree)
  _check_zero_weight(lambda t: _engine_sum(aggregator, t, jnp.zeros(N)), (tree0,), (0,))


def _ref_mean(t):
  return jax.tree.map(lambda x: jnp.tensordot(W_REAL, x, axes=1) / jnp.sum(W_REAL), t)


def _ref_agreement(t):
  return jax.tree.map(lambda x: jnp.abs(jnp.mean(jnp.sign(x), axis=0)), t)


def _ref_geo(t):
  def leaf(g):  # no exact zeros among the real clients
    e = g.shape[0]
    la = jnp.log(jnp.abs(g))

    def side(sel):
      n = jnp.sum(sel, axis=0)
      gm = jnp.exp(jnp.sum(jnp.where(sel, la, 0.0), axis=0) / jnp.maximum(n, 1))
      return n / e * jnp.where(n > 0, gm, 0.0)

    return side(g > 0) - side(g < 0)

  return jax.tree.map(leaf, t)


def _ref_mask(a, tau, rule):
  if rule == "gma":
    return jnp.where(a >= tau, 1.0, a)
  return jnp.where(a >= tau, 1.0, 0.0)


@pytest.mark.parametrize("bad", BAD)
def test_core_weighted_mean(bad):
  _check_agg(core_agg.weighted_mean(), _ref_mean, bad)
  assert aggs.weighted_mean is core_agg.weighted_mean


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("zeros", ["both", "negative"])
@pytest.mark.slow
def test_geometric_mean_aggregator(bad, zeros):
  _check_agg(aggs.geometric_mean_aggregator(zeros), _ref_geo, bad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", BAD)
def test_sign_agreement(bad):
  _check_agg(aggs.sign_agreement(), _ref_agreement, bad)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("rule", ["gma", "and_mask"])
@pytest.mark.parametrize("tau", [0.3, 0.7])
def test_gma_and_mask_aggregators(bad, rule, tau):
  build = aggs.gma if rule == "gma" else aggs.and_mask_aggregator

  def ref(t):
    masks = jax.tree.map(lambda a: _ref_mask(a, tau, rule), _ref_agreement(t))
    return jax.tree.map(jnp.multiply, _ref_mean(t), masks)

  _check_agg(build(core_agg.weighted_mean(), tau), ref, bad)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("rule", ["gma", "and_mask"])
@pytest.mark.parametrize("base", ["mean", "geometric"])
def test_masking_aggregator_carry_mask(bad, rule, base):
  tau = 0.7
  base_agg, base_ref = ((core_agg.weighted_mean(), _ref_mean) if base == "mean"
                        else (aggs.geometric_mean_aggregator(), _ref_geo))

  def ref(t):
    masks = jax.tree.map(lambda a: _ref_mask(a, tau, rule), _ref_agreement(t))
    return aggs.MaskedPseudoGradient(base_ref(t), masks)

  _check_agg(aggs.masking_aggregator(base_agg, tau, rule, carry_mask=True), ref, bad)


def _ref_geo_stats(g, zeros="both"):
  """Σ over rows of the lifted geometric-mean statistics, plain jnp (no exact zeros)."""
  pos, neg = g > 0, g < 0
  la = jnp.log(jnp.abs(g))
  f = lambda b: jnp.sum(b.astype(jnp.float32), axis=0)  # noqa: E731
  z = jnp.zeros(g.shape[1:], jnp.float32)
  return aggs._GeoStats(n_pos=f(pos), n_neg=f(neg),
                        log_pos=jnp.sum(jnp.where(pos, la, 0.0), axis=0),
                        log_neg=jnp.sum(jnp.where(neg, la, 0.0), axis=0),
                        zero_pos=z, zero_neg=z)


@pytest.mark.parametrize("bad", BAD)
def test_summed_geo_stats(bad):
  g = _updates(bad)["w"]
  _check(lambda g: aggs.summed_geo_stats(g, W), _ref_geo_stats, (g,), (0,),
         rtol=1e-5, atol=1e-5)
  _check_zero_weight(lambda g: aggs.summed_geo_stats(g, jnp.zeros(N)),
                     (_poison(g, bad, np.arange(N)),), (0,))


@pytest.mark.parametrize("bad", BAD)
def test_outer_product_geo_stats(bad):
  r = _rng(9)
  a = _poison(r.normal(size=(N, 3)).astype(np.float32), bad)
  d = _poison(r.normal(size=(N, 2)).astype(np.float32), bad)

  def ref(a, d):
    return _ref_geo_stats(a[:, :, None] * d[:, None, :])

  _check(lambda a, d: aggs.outer_product_geo_stats(a, d, W), ref, (a, d), (0, 1),
         rtol=1e-5, atol=1e-5)
  every = np.arange(N)
  _check_zero_weight(lambda a, d: aggs.outer_product_geo_stats(a, d, jnp.zeros(N)),
                     (_poison(a, bad, every), _poison(d, bad, every)), (0, 1))


@pytest.mark.parametrize("bad", BAD)
def test_per_sample_irm_v1(bad):
  """Invariant FedAvg's literal eq. 15 (per-sample IRMv1) masks its inputs too."""
  from fedjax_inv.algorithms.invariance import per_sample_irm_v1
  rng = _rng(11)
  logits = _poison(rng.normal(size=N).astype(np.float32), bad)
  labels = jnp.asarray((rng.random(N) > 0.5).astype(np.float32))

  def ref(f, y):  # ((σ(f_i) − y_i) f_i)², weighted mean, written out
    return _wmean(((jax.nn.sigmoid(f) - y) * f) ** 2, W_REAL)
  _check(lambda f, y: per_sample_irm_v1(f, y, W), ref, (logits, labels), (0,))


@pytest.mark.parametrize("bad", BAD)
def test_fedsr_cmi_term(bad):
  """FedSR's CMI term KL(N(μ, σ) ‖ r(z|y)) over a batch with padded rows."""
  from fedjax_inv.algorithms.fedsr import fedsr_component
  from fedjax_inv.core.algorithm import Batch, Context, Forward
  rng = _rng(12)
  d = 4
  mu = _poison(rng.normal(size=(N, d)).astype(np.float32), bad)
  sigma = _poison(rng.uniform(0.5, 1.5, size=(N, d)).astype(np.float32), bad)
  y = jnp.asarray(rng.integers(0, 3, size=N).astype(np.int32))
  from fedjax_inv.algorithms.fedsr_model import REFERENCE
  comp = fedsr_component(alpha_l2r=0.0, alpha_cmi=1.0, r_mode="averaged")
  params0 = {REFERENCE: {"mu": jnp.zeros((3, d)), "sigma_raw": jnp.zeros((3, d))}}
  ctx = Context(params=params0, round=jnp.zeros((), jnp.int32), extras={}, client={},
                num_clients=jnp.float32(1), cohort=jnp.float32(1))

  def fn(m, s):
    batch = Batch(x=jnp.zeros((N, 1)), y=y, w=W)
    return comp.call("loss", kind="multiclass", params=params0, batch=batch, fwd=Forward(m, m, (m,
                     s)), ctx=ctx)

  def ref(m, s):  # analytic KL(N(m, s²) ‖ N(0, r²)), r = softplus(0) + 1e-5, over z_dim
    r = jnp.log(2.0) + 1e-5
    kl = jnp.sum(jnp.log(r / s) + (s ** 2 + m ** 2) / (2 * r ** 2) - 0.5, -1)
    return _wmean(kl, W_REAL)
  _check(fn, ref, (mu, sigma), (0, 1))
