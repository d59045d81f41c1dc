"""Behaviour tests for fedjax_inv.algorithms.penalties (IRMv1, Fishr, FedProx, FedSR terms)."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_inv.algorithms.penalties import (
    classifier_per_sample_grads, cross_entropy, fishr_penalty, gaussian_kl, irm_v1, l2r,
    mse, per_sample_classifier_grad_variance, prox_term)

RTOL, ATOL = 1e-5, 1e-6


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _binary_data(rng, n=32):
  f = rng.normal(scale=2.0, size=n).astype(np.float32)
  y = rng.integers(0, 2, size=n)
  return f, y


def _multi_data(rng, n=32, k=4):
  f = rng.normal(scale=2.0, size=(n, k)).astype(np.float32)
  y = rng.integers(0, k, size=n).astype(np.int32)
  return f, y


def _dL_dscale(f, y, w=None):
  """Closed form dL/dw at w=1 of L(w) = mean_i l(w f_i, y_i), float64."""
  f = np.asarray(f, np.float64)
  if f.ndim == 1 or f.shape[1] == 1:
    f = f.reshape(-1)
    per = (_sigmoid(f) - np.asarray(y, np.float64).reshape(-1)) * f
  else:
    onehot = np.eye(f.shape[1])[np.asarray(y)]
    per = np.sum((_softmax(f) - onehot) * f, axis=1)
  return np.average(per, weights=w)


# --------------------------------------------------------------------------------------
# cross_entropy / mse
# --------------------------------------------------------------------------------------


def test_cross_entropy_matches_optax():
  rng = np.random.default_rng(0)
  f, y = _binary_data(rng)
  expected = np.mean(optax.sigmoid_binary_cross_entropy(f, y.astype(np.float32)))
  for logits, labels in ((f, y), (f[:, None], y.astype(np.float32)), (f, y[:, None])):
    np.testing.assert_allclose(cross_entropy(logits, labels), expected, rtol=RTOL)
  fm, ym = _multi_data(rng)
  expected = np.mean(optax.softmax_cross_entropy_with_integer_labels(fm, ym))
  np.testing.assert_allclose(cross_entropy(fm, ym), expected, rtol=RTOL)
  # Extreme logits stay finite.
  big = jnp.array([100.0, -100.0, 50.0])
  assert np.isfinite(float(cross_entropy(big, jnp.array([0, 1, 0]))))


def test_cross_entropy_weights_equal_unpadded_subset():
  rng = np.random.default_rng(1)
  fm, ym = _multi_data(rng, n=20)
  mask = np.zeros(20, np.float32)
  mask[:13] = 1.0
  np.testing.assert_allclose(
      cross_entropy(fm, ym, mask), cross_entropy(fm[:13], ym[:13]), rtol=RTOL)
  w = rng.uniform(0.5, 2.0, size=20).astype(np.float32)
  per = optax.softmax_cross_entropy_with_integer_labels(fm, ym)
  np.testing.assert_allclose(cross_entropy(fm, ym, w), np.average(per, weights=w), rtol=RTOL)
  assert float(cross_entropy(fm, ym, np.zeros(20))) == 0.0  # all padding


def test_cross_entropy_shape_errors():
  with pytest.raises(ValueError, match="labels"):
    cross_entropy(jnp.zeros(5), jnp.zeros(4))
  with pytest.raises(ValueError, match="labels"):
    cross_entropy(jnp.zeros((5, 3)), jnp.zeros((5, 3), jnp.int32))
  with pytest.raises(ValueError, match="integer"):
    cross_entropy(jnp.zeros((5, 3)), jnp.zeros(5, jnp.float32))
  with pytest.raises(ValueError, match="logits"):
    cross_entropy(jnp.zeros((5, 3, 2)), jnp.zeros(5, jnp.int32))
  with pytest.raises(ValueError, match="weights"):
    cross_entropy(jnp.zeros((5, 3)), jnp.zeros(5, jnp.int32), jnp.ones(4))


def test_mse():
  rng = np.random.default_rng(2)
  p = rng.normal(size=(10, 3)).astype(np.float32)
  t = rng.normal(size=(10, 3)).astype(np.float32)
  np.testing.assert_allclose(mse(p, t), np.mean((p - t) ** 2), rtol=RTOL)
  np.testing.assert_allclose(mse(p[:, :1], t[:, 0]), np.mean((p[:, 0] - t[:, 0]) ** 2),
                             rtol=RTOL)
  w = np.r_[np.ones(6), np.zeros(4)].astype(np.float32)
  np.testing.assert_allclose(mse(p, t, w), mse(p[:6], t[:6]), rtol=RTOL)
  with pytest.raises(ValueError, match="shape"):
    mse(p, t[:, :2])


# --------------------------------------------------------------------------------------
# IRMv1
# --------------------------------------------------------------------------------------


def test_irm_v1_binary_closed_form():
  rng = np.random.default_rng(3)
  f, y = _binary_data(rng)
  expected = _dL_dscale(f, y) ** 2
  for logits, labels in ((f, y), (f[:, None], y.astype(np.float32))):
    np.testing.assert_allclose(irm_v1(logits, labels), expected, rtol=1e-4, atol=1e-9)
  assert float(irm_v1(f, y)) > 0


def test_irm_v1_multiclass_closed_form():
  rng = np.random.default_rng(4)
  f, y = _multi_data(rng)
  np.testing.assert_allclose(irm_v1(f, y), _dL_dscale(f, y) ** 2, rtol=1e-4, atol=1e-9)


def test_irm_v1_weights_equal_unpadded_subset():
  rng = np.random.default_rng(5)
  f, y = _multi_data(rng, n=24)
  mask = np.r_[np.ones(17), np.zeros(7)].astype(np.float32)
  f_pad = f.copy()
  f_pad[17:] = 1e3  # padded rows carry garbage
  np.testing.assert_allclose(
      irm_v1(f_pad, y, mask), irm_v1(f[:17], y[:17]), rtol=1e-5, atol=1e-9)
  fb, yb = _binary_data(rng, n=24)
  np.testing.assert_allclose(
      irm_v1(fb, yb, mask), _dL_dscale(fb[:17], yb[:17]) ** 2, rtol=1e-4, atol=1e-9)


def _optimal_scale(h, y):
  """argmin_s mean l(s h_i, y_i) (1-D convex in s) by bisection on dL/ds, float64."""
  h = np.asarray(h, np.float64)
  def dl_ds(s):
    return _dL_dscale(s * h, y) / s  # dL/dw(at s h) = s dL/ds
  lo, hi = 0.05, 20.0
  assert dl_ds(lo) < 0 < dl_ds(hi)
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if dl_ds(mid) < 0 else (lo, mid)
  return 0.5 * (lo + hi)


@pytest.mark.parametrize("kind", ["binary", "multiclass"])
def test_irm_v1_zero_when_scale_is_optimal(kind):
  rng = np.random.default_rng(6)
  n, k = 64, 3
  # Labels drawn from the model itself, so the optimal scale is finite (near 1).
  if kind == "binary":
    h = rng.normal(scale=2.0, size=n)
    y = (rng.uniform(size=n) < _sigmoid(h)).astype(np.int32)
  else:
    h = rng.normal(scale=2.0, size=(n, k))
    y = np.array([rng.choice(k, p=p) for p in _softmax(h)], np.int32)
  s = _optimal_scale(h, y)
  f = (s * h).astype(np.float32)
  assert abs(_dL_dscale(f, y)) < 1e-5  # the construction: mean(dl/df * f) = 0
  assert float(irm_v1(f, y)) < 1e-10
  # ... and clearly positive once the scale is off.
  assert float(irm_v1(2.0 * f, y)) > 1e-4


def test_irm_v1_mse_closed_form_and_errors():
  rng = np.random.default_rng(7)
  f = rng.normal(size=16).astype(np.float32)
  t = rng.normal(size=16).astype(np.float32)
  expected = np.mean(2 * (f.astype(np.float64) - t) * f) ** 2
  np.testing.assert_allclose(irm_v1(f, t, loss="mse"), expected, rtol=1e-4)
  np.testing.assert_allclose(irm_v1(f, f, loss="mse"), 0.0, atol=1e-12)
  with pytest.raises(ValueError, match="loss"):
    irm_v1(f, t, loss="hinge")


def test_irm_v1_is_differentiable_and_jittable():
  rng = np.random.default_rng(8)
  f, y = _multi_data(rng, n=8, k=3)
  g = jax.jit(jax.grad(lambda x: irm_v1(x, y)))(jnp.asarray(f))
  assert g.shape == f.shape and np.all(np.isfinite(np.asarray(g)))


# --------------------------------------------------------------------------------------
# Fishr
# --------------------------------------------------------------------------------------


def _linear_layer(rng, d, k):
  return {"kernel": jnp.asarray(rng.normal(size=(d, k)).astype(np.float32)),
          "bias": jnp.asarray(rng.normal(size=(k,)).astype(np.float32))}


def _vmap_grads(params, z, y):
  """Reference: per-sample grads of each sample's own loss via jax.vmap(jax.grad)."""
  def one(p, zi, yi):
    return cross_entropy((zi @ p["kernel"] + p["bias"])[None], yi[None])
  return jax.jit(jax.vmap(jax.grad(one), in_axes=(None, 0, 0)))(params, z, y)


@pytest.mark.parametrize("k", [1, 3])
def test_per_sample_grads_and_variance_match_vmap_grad(k):
  rng = np.random.default_rng(9)
  n, d = 12, 5
  params = _linear_layer(rng, d, k)
  z = jnp.asarray(rng.normal(size=(n, d)).astype(np.float32))
  logits = z @ params["kernel"] + params["bias"]
  if k == 1:
    y = jnp.asarray(rng.integers(0, 2, size=n).astype(np.float32))
    logit_grads = jax.nn.sigmoid(logits) - y[:, None]
  else:
    y = jnp.asarray(rng.integers(0, k, size=n).astype(np.int32))
    logit_grads = jax.nn.softmax(logits) - jax.nn.one_hot(y, k)
  ref = _vmap_grads(params, z, y)

  got = classifier_per_sample_grads(z, logit_grads)
  assert got["kernel"].shape == (n, d, k) and got["bias"].shape == (n, k)
  for name in ("kernel", "bias"):
    np.testing.assert_allclose(got[name], ref[name], rtol=RTOL, atol=ATOL)

  var = per_sample_classifier_grad_variance(z, logits, y)
  assert var["kernel"].shape == (d, k) and var["bias"].shape == (k,)
  for name in ("kernel", "bias"):
    np.testing.assert_allclose(var[name], np.var(np.asarray(ref[name]), axis=0),
                               rtol=1e-4, atol=ATOL)

  # Weights: padding rows are ignored (equal to the unpadded subset) ...
  mask = jnp.asarray(np.r_[np.ones(8), np.zeros(4)].astype(np.float32))
  masked = per_sample_classifier_grad_variance(z, logits, y, mask)
  subset = per_sample_classifier_grad_variance(z[:8], logits[:8], y[:8])
  for name in ("kernel", "bias"):
    np.testing.assert_allclose(masked[name], subset[name], rtol=1e-4, atol=ATOL)
  # ... and general weights give the centered weighted variance.
  w = rng.uniform(0.1, 3.0, size=n)
  weighted = per_sample_classifier_grad_variance(z, logits, y, jnp.asarray(w, jnp.float32))
  for name in ("kernel", "bias"):
    r = np.asarray(ref[name], np.float64)
    mu = np.average(r, axis=0, weights=w)
    expected = np.average((r - mu) ** 2, axis=0, weights=w)
    np.testing.assert_allclose(weighted[name], expected, rtol=1e-4, atol=ATOL)


def test_per_sample_errors():
  with pytest.raises(ValueError, match="disagree"):
    classifier_per_sample_grads(jnp.ones((4, 3)), jnp.ones((5, 2)))
  with pytest.raises(ValueError, match="features"):
    classifier_per_sample_grads(jnp.ones((4,)), jnp.ones((4, 2)))


def test_fishr_penalty_matches_numpy_loop():
  rng = np.random.default_rng(10)
  e = 4
  tree = {"kernel": rng.uniform(size=(e, 5, 3)).astype(np.float32),
          "bias": rng.uniform(size=(e, 3)).astype(np.float32)}
  expected = 0.0
  for leaf in tree.values():
    leaf = leaf.astype(np.float64)
    mean = sum(leaf[i] for i in range(e)) / e
    expected += sum(np.sum((leaf[i] - mean) ** 2) for i in range(e)) / e
  got = fishr_penalty(jax.tree.map(jnp.asarray, tree))
  assert got.shape == ()
  np.testing.assert_allclose(got, expected, rtol=RTOL)
  moved = jax.tree.map(lambda x: jnp.moveaxis(jnp.asarray(x), 0, -1), tree)
  np.testing.assert_allclose(fishr_penalty(moved, axis=-1), expected, rtol=RTOL)
  # Identical clients: no penalty.
  same = {"kernel": jnp.tile(jnp.asarray(tree["kernel"][:1]), (3, 1, 1))}
  np.testing.assert_allclose(fishr_penalty(same), 0.0, atol=1e-12)
  with pytest.raises(ValueError, match="axis"):
    fishr_penalty(tree, axis=3)
  with pytest.raises(ValueError, match="leaf"):
    fishr_penalty({})


# --------------------------------------------------------------------------------------
# FedProx / FedSR
# --------------------------------------------------------------------------------------


def test_prox_term():
  w = {"a": jnp.array([1.0, 2.0]), "b": [jnp.array([[3.0]])]}
  w0 = {"a": jnp.array([0.0, 4.0]), "b": [jnp.array([[1.0]])]}
  # ||w - w0||^2 = 1 + 4 + 4 = 9.
  np.testing.assert_allclose(prox_term(w, w0, 0.1), 0.5 * 0.1 * 9.0, rtol=1e-6)
  np.testing.assert_allclose(prox_term(w, w, 3.0), 0.0)
  g = jax.grad(lambda p: prox_term(p, w0, 2.0))(w)  # mu * (w - w0)
  np.testing.assert_allclose(g["a"], [2.0, -4.0], rtol=1e-6)
  with pytest.raises(ValueError, match="structure"):
    prox_term(w, {"a": w0["a"]}, 0.1)
  with pytest.raises(ValueError, match="shape"):
    prox_term(w, {"a": jnp.zeros(3), "b": w0["b"]}, 0.1)
  with pytest.raises(ValueError, match="mu"):
    prox_term(w, w0, -1.0)


def test_gaussian_kl():
  # 1-D closed form, and a hand-computed value: KL(N(0,1) || N(1,2^2)) = log 2 + 2/8 - 1/2.
  np.testing.assert_allclose(
      gaussian_kl(jnp.array([0.0]), jnp.array([1.0]), jnp.array([1.0]), jnp.array([2.0])),
      [np.log(2.0) + 2.0 / 8.0 - 0.5], rtol=1e-6)
  rng = np.random.default_rng(11)
  mq, mp = rng.normal(size=(2, 6, 3))
  sq, sp = rng.uniform(0.3, 2.0, size=(2, 6, 3))
  per = np.log(sp / sq) + (sq ** 2 + (mq - mp) ** 2) / (2 * sp ** 2) - 0.5
  got = gaussian_kl(*(jnp.asarray(a, jnp.float32) for a in (mq, sq, mp, sp)))
  assert got.shape == (6,)
  np.testing.assert_allclose(got, per.sum(-1), rtol=1e-5, atol=1e-6)
  # Monte-Carlo check of one 1-D KL: E_q[log q(z) - log p(z)].
  z = 0.3 + 0.7 * rng.normal(size=200_000)
  logq = -0.5 * ((z - 0.3) / 0.7) ** 2 - np.log(0.7)
  logp = -0.5 * ((z + 0.5) / 1.5) ** 2 - np.log(1.5)
  np.testing.assert_allclose(
      gaussian_kl(jnp.array([0.3]), jnp.array([0.7]), jnp.array([-0.5]), jnp.array([1.5])),
      [np.mean(logq - logp)], rtol=2e-2)
  # Zero for equal distributions; broadcasting a [D] reference against [n, D].
  np.testing.assert_allclose(gaussian_kl(mq, sq, mq, sq), np.zeros(6), atol=1e-6)
  bc = gaussian_kl(jnp.asarray(mq), jnp.asarray(sq), jnp.zeros(3), jnp.ones(3))
  assert bc.shape == (6,)
  with pytest.raises(ValueError, match="broadcast"):
    gaussian_kl(jnp.zeros((6, 3)), jnp.ones((6, 3)), jnp.zeros(4), jnp.ones(4))
  with pytest.raises(ValueError, match="axis"):
    gaussian_kl(0.0, 1.0, 0.0, 1.0)


def test_l2r_modes_and_weights():
  z = jnp.array([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
  np.testing.assert_allclose(l2r(z), (25.0 + 0.0 + 1.0) / 3.0, rtol=1e-6)  # paper
  np.testing.assert_allclose(l2r(z, squared=False), (5.0 + 0.0 + 1.0) / 3.0, rtol=1e-6)
  np.testing.assert_allclose(l2r(z, jnp.array([1.0, 0.0, 1.0])), 13.0, rtol=1e-6)
  np.testing.assert_allclose(l2r(z.reshape(3, 2, 1)), l2r(z), rtol=1e-6)  # flattened
  g = jax.grad(lambda x: l2r(x, squared=False))(z)  # finite at z_i = 0
  assert np.all(np.isfinite(np.asarray(g)))
  np.testing.assert_allclose(g[0], np.array([3.0, 4.0]) / 5.0 / 3.0, rtol=1e-6)
  with pytest.raises(ValueError, match="weights"):
    l2r(z, jnp.ones(2))


# ---------------------------------------------------------------------------------------
# The weighted mean every penalty reduces with (mutation testing, tests/README.md)
# ---------------------------------------------------------------------------------------


def test_weighted_mean_fractional_weights_below_one_and_padded_inf_nan():
  """Σ w v / Σ w for weights summing to 0.75 (not 1, not > 1); zero-weight rows holding
  inf/NaN change neither the value nor any gradient (the helper's documented contract)."""
  from fedjax_inv.algorithms.penalties import _weighted_mean
  v = jnp.asarray([1.0, 2.0, jnp.inf, jnp.nan])
  w = jnp.asarray([0.25, 0.5, 0.0, 0.0])
  np.testing.assert_allclose(float(_weighted_mean(v, w)), (0.25 + 1.0) / 0.75, rtol=1e-6)
  gv, gw = jax.grad(_weighted_mean, argnums=(0, 1))(v, w)
  np.testing.assert_allclose(np.asarray(gv), [0.25 / 0.75, 0.5 / 0.75, 0.0, 0.0],
                             rtol=1e-6, atol=0)
  mean = (0.25 + 1.0) / 0.75  # ∂/∂w_i = (v_i - mean) / Σw on the kept rows, 0 elsewhere
  np.testing.assert_allclose(np.asarray(gw), [(1.0 - mean) / 0.75, (2.0 - mean) / 0.75,
                                              -mean / 0.75, -mean / 0.75], rtol=1e-5)
  # the public path: cross-entropy with the same weights
  logits = jnp.asarray([[0.3], [-1.2], [2.0], [0.0]])
  labels = jnp.asarray([1, 0, 1, 0])
  ce = np.logaddexp(0, np.asarray(logits)[:, 0]) - np.asarray(labels) * np.asarray(logits)[:, 0]
  np.testing.assert_allclose(float(cross_entropy(logits, labels, w)),
                             (0.25 * ce[0] + 0.5 * ce[1]) / 0.75, rtol=1e-6)


def test_weighted_mean_all_zero_weights_value_and_gradients():
  """All weights 0: the value is 0 and the gradients w.r.t. values and weights are finite
  (the 1/Σw branch that ``where`` discards must not put 0/0 into them)."""
  from fedjax_inv.algorithms.penalties import _weighted_mean
  v = jnp.asarray([1.0, jnp.inf, 3.0])
  w = jnp.zeros(3)
  assert float(_weighted_mean(v, w)) == 0.0
  gv, gw = jax.grad(_weighted_mean, argnums=(0, 1))(v, w)
  np.testing.assert_array_equal(np.asarray(gv), 0.0)
  assert np.all(np.isfinite(np.asarray(gw))), gw


@pytest.mark.parametrize("fn", ["cross_entropy", "irm_v1", "mse"])
def test_integer_inputs_are_read_as_float32_and_float16_stays_float16(fn):
  """Integer logits / predictions are cast to float32 first (same value as the float
  call); a float16 input is kept in float16 (no silent up-cast of the caller's dtype)."""
  import fedjax_inv.algorithms.penalties as P
  f = getattr(P, fn)
  x = np.asarray([[2], [-1], [0], [3]])
  y = np.asarray([1, 0, 1, 1]) if fn != "mse" else np.asarray([1.5, -1.0, 0.5, 2.0])
  w = jnp.asarray([1.0, 1.0, 0.0, 1.0])
  want = f(jnp.asarray(x, jnp.float32), jnp.asarray(y), w)
  got = f(jnp.asarray(x, jnp.int32), jnp.asarray(y), w)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
  half = f(jnp.asarray(x, jnp.float16), jnp.asarray(y), w)
  assert half.dtype == jnp.float16
  np.testing.assert_allclose(float(half), float(want), rtol=2e-2)


def test_classifier_per_sample_grads_reads_1d_logit_grads_as_one_column():
  z = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32))
  g = jnp.asarray([0.5, -1.0, 2.0, 0.0, 1.5])
  chex.assert_trees_all_close(classifier_per_sample_grads(z, g),
                              classifier_per_sample_grads(z, g[:, None]), rtol=0, atol=0)
  assert classifier_per_sample_grads(z, g)["kernel"].shape == (5, 3, 1)
