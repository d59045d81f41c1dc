"""fedjax_inv.models.federated: Reddi et al. 2021's EMNIST CNN, Shakespeare LSTM and
CIFAR-100 ResNet-18 — parameter counts worked out by hand from the layer sizes, forwards
against independent re-implementations from the same parameters, key-driven dropout, and
jit(vmap) over a client axis."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from fedjax_inv.models import FunctionalModel
from fedjax_inv.models import federated as fm

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def cnn():
  return fm.femnist_cnn(62)


@pytest.fixture(scope="module")
def lstm():
  return fm.char_lstm(80)


def _np(tree):
  return jax.tree.map(np.asarray, tree)


# ---------------------------------------------------------------------------------------
# Parameter counts (by hand from the layer sizes) and shapes.
# ---------------------------------------------------------------------------------------


def test_femnist_cnn_param_count_and_shapes(cnn):
  conv1 = 3 * 3 * 1 * 32 + 32                    # 320
  conv2 = 3 * 3 * 32 * 64 + 64                   # 18,496
  dense = 12 * 12 * 64 * 128 + 128               # 1,179,776 (28 → 26 → 24 → pool 12)
  head = 128 * 62 + 62                           # 7,998
  assert conv1 + conv2 + dense + head == 1_206_590
  assert cnn.num_params() == 1_206_590
  # TFF's docstring for only_digits=True (10 classes): 1,199,882.
  assert fm.femnist_cnn(10).num_params() == 1_199_882
  assert cnn.feature_dim == 128 and cnn.stochastic
  params = cnn.init(0)
  assert set(params) == {"featurizer", "classifier"}
  x = jax.random.uniform(jax.random.key(1), (5, 28, 28))
  z = cnn.features(params, x)
  assert z.shape == (5, 128)
  assert cnn.classify(params, z).shape == (5, 62)
  # [B, 28, 28] and [B, 28, 28, 1] are the same input.
  np.testing.assert_array_equal(np.asarray(cnn.apply(params, x)),
                                np.asarray(cnn.apply(params, x[..., None])))


def test_char_lstm_param_count_and_shapes(lstm):
  v, e, h = 80, 8, 256
  embed = v * e                                  # 640
  layer1 = e * 4 * h + h * 4 * h + 4 * h         # 271,360 (input kernel, recurrent + bias)
  layer2 = h * 4 * h + h * 4 * h + 4 * h         # 525,312
  head = h * v + v                               # 20,560
  assert embed + layer1 + layer2 + head == 817_872
  assert lstm.num_params() == 817_872
  assert lstm.feature_dim == 256 and not getattr(lstm, "stochastic", False)
  params = lstm.init(0)
  # Keras' unit_forget_bias: the fused [i, f, g, o] bias is 1 on the forget gate only.
  b = np.asarray(params["featurizer"]["cells"][0]["dense_h"]["bias"])
  np.testing.assert_array_equal(b, np.r_[np.zeros(h), np.ones(h), np.zeros(2 * h)])
  emb = np.asarray(params["featurizer"]["embed"]["embedding"])
  assert emb.min() >= -0.05 and emb.max() <= 0.05
  x = jax.random.randint(jax.random.key(1), (4, 80), 0, v).astype(jnp.float32)
  assert lstm.features(params, x).shape == (4, 256)
  assert lstm.apply(params, x).shape == (4, 80)


def test_resnet18_param_count():
  model = fm.cifar100_resnet18()
  # Trunk: 7×7 stem (3→64) + GN, then per stage (widths 64, 128, 256, 512; 2 basic blocks
  # of two 3×3 convs + GN each; a 1×1 projection conv + GN where the width changes).
  def gn(c):
    return 2 * c
  trunk = 7 * 7 * 3 * 64 + gn(64)
  cin = 64
  for w in (64, 128, 256, 512):
    for i in range(2):
      c0 = cin if i == 0 else w
      trunk += 9 * c0 * w + gn(w) + 9 * w * w + gn(w)
      if i == 0 and c0 != w:
        trunk += c0 * w + gn(w)
    cin = w
  assert trunk == 11_176_512
  projection = 512 * 512 + 512
  head = 512 * 100 + 100
  assert model.num_params() == trunk + projection + head == 11_490_468
  assert model.feature_dim == 512
  gn_shapes = {tuple(v.shape) for k, v in _flat(model.template) if "norm" in k}
  assert gn_shapes <= {(64,), (128,), (256,), (512,)}


def _flat(state):
  out = []
  def walk(d, prefix):
    for k, v in d.items():
      if isinstance(v, dict):
        walk(v, prefix + (str(k),))
      else:
        out.append(("/".join(prefix + (str(k),)), v))
  walk(nnx.to_pure_dict(state), ())
  return out


def test_resnet18_uses_two_groups():
  model = fm.cifar100_resnet18()
  m = model._merge(model.init(0))  # pylint: disable=protected-access
  assert m.featurizer.stem_norm.num_groups == 2
  assert all(b.norm1.num_groups == 2 and b.norm2.num_groups == 2 for b in m.featurizer.blocks)
  assert not m.featurizer.small_input and not m.featurizer.normalize


# ---------------------------------------------------------------------------------------
# Forward passes against independent re-implementations.
# ---------------------------------------------------------------------------------------


def _ref_cnn(params, x):
  """Conv-ReLU-Conv-ReLU-pool-dense-ReLU(-dense) with lax.conv_general_dilated."""
  f = params["featurizer"]
  hi = lax.Precision.HIGHEST

  def conv(h, p):
    y = lax.conv_general_dilated(h, p["kernel"], (1, 1), "VALID",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=hi)
    return y + p["bias"]

  h = x.reshape(x.shape[0], 28, 28, 1)
  h = jax.nn.relu(conv(jax.nn.relu(conv(h, f["conv1"])), f["conv2"]))   # [B, 24, 24, 64]
  h = h.reshape(h.shape[0], 12, 2, 12, 2, 64).max(axis=(2, 4))          # [B, 12, 12, 64]
  z = jax.nn.relu(jnp.dot(h.reshape(h.shape[0], -1), f["dense"]["kernel"], precision=hi)
                  + f["dense"]["bias"])
  c = params["classifier"]
  return z, jnp.dot(z, c["kernel"], precision=hi) + c["bias"]


def test_femnist_cnn_forward_matches_reference(cnn):
  params = cnn.init(3)
  x = jax.random.uniform(jax.random.key(4), (6, 28, 28))
  z_ref, logits_ref = _ref_cnn(params, x)
  np.testing.assert_allclose(np.asarray(cnn.features(params, x)), np.asarray(z_ref), **TOL)
  np.testing.assert_allclose(np.asarray(cnn.apply(params, x)), np.asarray(logits_ref), **TOL)
  np.testing.assert_allclose(np.asarray(cnn.apply(params, x, None)), np.asarray(logits_ref),
                             **TOL)


def _sigmoid(a):
  return 1.0 / (1.0 + np.exp(-a))


def _ref_lstm(params, ids):
  """Embedding lookup and LSTM cell equations in float64 numpy, gates in flax's fused
  order [i, f, g, o]: c' = σ(f)c + σ(i)tanh(g), h' = σ(o)tanh(c')."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  f = p["featurizer"]
  seq = f["embed"]["embedding"][ids]                       # [B, T, E]
  for layer in sorted(f["cells"]):
    cell = f["cells"][layer]
    wi, wh, b = cell["dense_i"]["kernel"], cell["dense_h"]["kernel"], cell["dense_h"]["bias"]
    hdim = wh.shape[0]
    c = np.zeros((ids.shape[0], hdim))
    h = np.zeros((ids.shape[0], hdim))
    outs = []
    for t in range(seq.shape[1]):
      y = seq[:, t] @ wi + h @ wh + b
      i, fg, g, o = (y[:, k * hdim:(k + 1) * hdim] for k in range(4))
      c = _sigmoid(fg) * c + _sigmoid(i) * np.tanh(g)
      h = _sigmoid(o) * np.tanh(c)
      outs.append(h)
    seq = np.stack(outs, axis=1)
  z = seq[:, -1]
  return z, z @ p["classifier"]["kernel"] + p["classifier"]["bias"]


def test_char_lstm_forward_matches_reference(lstm):
  params = lstm.init(5)
  ids = np.random.default_rng(0).integers(0, 80, size=(4, 80))
  x = jnp.asarray(ids, jnp.float32)
  z_ref, logits_ref = _ref_lstm(params, ids)
  np.testing.assert_allclose(np.asarray(lstm.features(params, x)), z_ref, **TOL)
  np.testing.assert_allclose(np.asarray(lstm.apply(params, x)), logits_ref, **TOL)
  # jit gives the same.
  np.testing.assert_allclose(np.asarray(jax.jit(lstm.apply)(params, x)), logits_ref, **TOL)


# ---------------------------------------------------------------------------------------
# Dropout.
# ---------------------------------------------------------------------------------------


def test_dropout_keys(cnn):
  params = cnn.init(0)
  x = jax.random.uniform(jax.random.key(2), (4, 28, 28))
  z_ref, _ = _ref_cnn(params, x)
  z0 = cnn.features(params, x)                         # no key: no dropout
  np.testing.assert_allclose(np.asarray(z0), np.asarray(z_ref), **TOL)
  np.testing.assert_array_equal(np.asarray(z0), np.asarray(cnn.features(params, x, None)))
  np.testing.assert_array_equal(np.asarray(z0), np.asarray(cnn.features(params, x)))
  za = cnn.features(params, x, jax.random.key(10))
  za2 = cnn.features(params, x, jax.random.key(10))
  zb = cnn.features(params, x, jax.random.key(11))
  np.testing.assert_array_equal(np.asarray(za), np.asarray(za2))   # same key, same masks
  assert not np.allclose(np.asarray(za), np.asarray(zb))          # other key, other masks
  assert not np.allclose(np.asarray(za), np.asarray(z0))
  la = cnn.apply(params, x, jax.random.key(10))
  np.testing.assert_allclose(np.asarray(la), np.asarray(cnn.classify(params, za)), **TOL)
  # Dense-layer dropout 0.5: about half of z's non-zero units are zeroed.
  alive = np.asarray(z0) > 0
  dropped = (np.asarray(za) == 0) & alive
  assert 0.35 < dropped.sum() / alive.sum() < 0.65
  # dropout=False: a plain model; a key changes nothing.
  plain = fm.femnist_cnn(62, dropout=False)
  assert type(plain) is FunctionalModel and not getattr(plain, "stochastic", False)
  m = plain._merge(params)  # pylint: disable=protected-access
  np.testing.assert_array_equal(np.asarray(m.featurizer(x, jax.random.key(3))),
                                np.asarray(plain.features(params, x)))


def test_dropout_preserves_mean_scale():
  x = jax.random.uniform(jax.random.key(0), (512,), minval=0.5, maxval=1.5)
  keys = jax.random.split(jax.random.key(1), 4000)
  for rate in (0.25, 0.5):
    draws = np.asarray(jax.vmap(lambda k, r=rate: fm.dropout(x, r, k))(keys))
    assert abs((draws == 0).mean() - rate) < 0.01
    np.testing.assert_allclose(draws.mean(), np.asarray(x).mean(), rtol=0.01)
    # per unit: E = x (4000 draws: standard error ≤ x·sqrt(rate/(1-rate)/4000) ≈ 1.6%)
    np.testing.assert_allclose(draws.mean(axis=0), np.asarray(x), rtol=0.08)
  np.testing.assert_array_equal(np.asarray(fm.dropout(x, 0.5, None)), np.asarray(x))
  with pytest.raises(ValueError, match="dropout rate"):
    fm.dropout(x, 1.0, keys[0])


def test_model_dropout_is_inverted():
  """With only the dense-layer dropout on (rate1=0), E_key[z] equals the no-dropout z."""
  model = fm.StochasticModel.from_factory(lambda rngs: fm.FemnistCNN(62, 0.0, 0.5, rngs=rngs))
  params = model.init(0)
  x = jax.random.uniform(jax.random.key(2), (2, 28, 28))
  z0 = np.asarray(model.features(params, x))
  keys = jax.random.split(jax.random.key(3), 2000)
  zs = np.asarray(jax.jit(jax.vmap(lambda k: model.features(params, x, k)))(keys))
  np.testing.assert_allclose(zs.mean(axis=0).sum(), z0.sum(), rtol=0.02)
  # Each unit is either dropped (0) or kept and scaled by 1 / (1 - 0.5) = 2.
  twice = np.broadcast_to(2 * z0, zs.shape)
  kept = zs != 0
  np.testing.assert_allclose(zs[kept], twice[kept], **TOL)
  assert 0.45 < 1 - kept[:, z0 > 0].mean() < 0.55


# ---------------------------------------------------------------------------------------
# jit(vmap) over a client axis of 3.
# ---------------------------------------------------------------------------------------


def _stack(model, seeds):
  return jax.tree.map(lambda *a: jnp.stack(a), *[model.init(s) for s in seeds])


def _client(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


def test_vmap_jit_cnn(cnn):
  params = _stack(cnn, (0, 1, 2))
  x = jax.random.uniform(jax.random.key(0), (3, 4, 28, 28))
  keys = jax.random.split(jax.random.key(1), 3)
  out = jax.jit(jax.vmap(cnn.apply))(params, x)
  out_k = jax.jit(jax.vmap(cnn.apply))(params, x, keys)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(out[i]),
                               np.asarray(cnn.apply(_client(params, i), x[i])), **TOL)
    np.testing.assert_allclose(np.asarray(out_k[i]),
                               np.asarray(cnn.apply(_client(params, i), x[i], keys[i])), **TOL)
  # Per-client gradients with dropout on, as a local step computes them.
  def loss(p, xi, k):
    return jnp.mean(jax.nn.logsumexp(cnn.apply(p, xi, k), axis=-1))
  grads = jax.jit(jax.vmap(jax.grad(loss)))(params, x, keys)
  leaves = jax.tree.leaves(grads)
  assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
  assert all(g.shape[0] == 3 for g in leaves)


def test_vmap_jit_lstm():
  model = fm.char_lstm(30, hidden=32, seq_len=12)
  params = _stack(model, (0, 1, 2))
  x = jax.random.randint(jax.random.key(0), (3, 5, 12), 0, 30).astype(jnp.float32)
  out = jax.jit(jax.vmap(model.apply))(params, x)
  assert out.shape == (3, 5, 30)
  for i in range(3):
    _, ref = _ref_lstm(_client(params, i), np.asarray(x[i]).astype(int))
    np.testing.assert_allclose(np.asarray(out[i]), ref, **TOL)
  def loss(p, xi):
    return jnp.mean(jax.nn.logsumexp(model.apply(p, xi), axis=-1))
  grads = jax.jit(jax.vmap(jax.grad(loss)))(params, x)
  g = grads["featurizer"]["cells"][0]["dense_h"]["kernel"]
  assert g.shape == (3, 32, 128) and np.isfinite(np.asarray(g)).all()
  assert np.abs(np.asarray(g)).sum() > 0


def test_vmap_jit_resnet18():
  model = fm.cifar100_resnet18()
  params = _stack(model, (0, 1, 2))
  x = jax.random.normal(jax.random.key(0), (3, 2, 24, 24, 3))
  out = jax.jit(jax.vmap(model.apply))(params, x)
  assert out.shape == (3, 2, 100)
  assert np.isfinite(np.asarray(out)).all()
  ref = jax.jit(model.apply)
  for i in range(3):
    np.testing.assert_allclose(np.asarray(out[i]), np.asarray(ref(_client(params, i), x[i])),
                               rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Errors.
# ---------------------------------------------------------------------------------------


def test_bad_sizes_raise(cnn, lstm):
  with pytest.raises(ValueError, match="num_classes"):
    fm.femnist_cnn(0)
  with pytest.raises(ValueError, match="positive sizes"):
    fm.char_lstm(0)
  with pytest.raises(ValueError, match="positive sizes"):
    fm.char_lstm(80, hidden=0)
  with pytest.raises(ValueError, match="num_classes"):
    fm.cifar100_resnet18(0)
  with pytest.raises(ValueError, match=r"\[B, 28, 28\]"):
    cnn.apply(cnn.init(0), jnp.zeros((2, 32, 32, 1)))
  with pytest.raises(ValueError, match=r"\[B, 80\]"):
    lstm.apply(lstm.init(0), jnp.zeros((2, 81)))
