"""FedSR / FedL2R / FedCMI (Nguyen et al. 2022, §3.3 eq. 9-11, 17-18)."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fedjax_inv import models
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.algorithms.fedsr import fedsr_component, fedsr_model, mc_predict_logits
from fedjax_inv.core.algorithm import CLIENT_OPT_STATE, Batch, Context
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.core.engine import build_round, default_forward, init_state
from fedjax_inv.runner.simulation import run
from fedjax_inv.tasks import Task
from tests import reference as oracle
from tests.reference import batch_indices, round_keys

Z = 3  # z_dim used in the tests
COHORT = 4  # clients per round, of the binary fixture's 5


def softplus(x):
  return np.logaddexp(0.0, x)


@pytest.fixture(scope="module")
def tiny_multiclass():
  """3 clients, 5 features, 3 classes."""
  rng = np.random.default_rng(1)
  xs, ys = [], []
  for i, n in enumerate((20, 30, 25)):
    x = rng.normal(size=(n, 5)).astype(np.float32) + 0.2 * i
    ys.append(((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5)).astype(np.int32))
    xs.append(x)
  data = from_client_arrays(xs, ys)
  # The evaluation set reuses the training arrays (one evaluator compile per run).
  return Task("tiny_multiclass", "multiclass", data, {"ood": data},
              models.mlp(5, (8,), 3), {})


def _ctx(params, client_ref=None):
  return Context(params=params, round=jnp.int32(0), extras={},
                 client={} if client_ref is None else {"fedsr": client_ref},
                 num_clients=jnp.float32(1), cohort=jnp.float32(1))


def _batch(task, n=12, pad=2):
  x = task.train.x[1, :n]
  y = task.train.y[1, :n]
  w = jnp.asarray([1.0] * (n - pad) + [0.0] * pad, jnp.float32)
  return Batch(x=x, y=y, w=w)


def _random_reference(params, seed=3):
  rng = np.random.default_rng(seed)
  ref = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32)
         for k, v in params["reference"].items()}
  return {**params, "reference": ref}


# --------------------------------------------------------------------------------------
# Model transform
# --------------------------------------------------------------------------------------


def test_transformed_model_shapes(tiny_multiclass, tiny_binary):
  base = tiny_multiclass.model
  m = fedsr_model(base, z_dim=Z)
  p = m.init(0)
  assert set(p) == {"featurizer", "classifier", "reference"}
  assert p["classifier"]["kernel"].shape == (Z, 3)
  assert p["reference"]["mu"].shape == (3, Z) and p["reference"]["sigma_raw"].shape == (3, Z)
  np.testing.assert_array_equal(p["reference"]["mu"], 0.0)
  np.testing.assert_array_equal(p["reference"]["sigma_raw"], 1.0)
  x = tiny_multiclass.train.x[0, :7]
  assert m.features(p, x).shape == (7, 2 * Z)             # (μ, pre-σ)
  assert m.classify(p, jnp.zeros((7, Z))).shape == (7, 3)
  assert m.feature_dim == Z
  # Binary task: K = 1 output, r(z|y) over 2 classes; deterministic head: z directly.
  _, bmodel = tiny_binary
  pb = fedsr_model(bmodel, z_dim=Z).init(0)
  assert pb["classifier"]["kernel"].shape == (Z, 1)
  assert pb["reference"]["mu"].shape == (2, Z)
  det = fedsr_model(base, z_dim=Z, probabilistic=False, with_reference=False)
  pd = det.init(0)
  assert set(pd) == {"featurizer", "classifier"}
  assert det.apply(pd, x).shape == (7, 3) and det.features(pd, x).shape == (7, Z)
  # The algorithms install the transform.
  assert set(make_algorithm("fedsr", z_dim=Z).model_for(base).init(0)) == set(p)
  assert "reference" not in make_algorithm("fedl2r", z_dim=Z).model_for(base).init(0)


def test_transform_reads_feature_size_or_raises():
  class TwoLayerHead(nnx.Module):
    def __init__(self, rngs, feature_dim):
      self.featurizer = nnx.Linear(2, 4, rngs=rngs)
      self.classifier = nnx.Sequential(nnx.Linear(4, 6, rngs=rngs), nnx.relu,
                                       nnx.Linear(6, 5, rngs=rngs))
      if feature_dim:
        self.feature_dim = feature_dim

  ok = models.FunctionalModel.from_factory(lambda rngs: TwoLayerHead(rngs, 4))
  m = fedsr_model(ok, z_dim=Z)
  p = m.init(0)
  assert p["classifier"]["kernel"].shape == (Z, 5)        # K read from the base head
  assert m.features(p, jnp.zeros((2, 2))).shape == (2, 2 * Z)
  bad = models.FunctionalModel.from_factory(lambda rngs: TwoLayerHead(rngs, None))
  with pytest.raises(ValueError, match="feature_dim"):
    fedsr_model(bad, z_dim=Z)


# --------------------------------------------------------------------------------------
# Reparameterization and Monte-Carlo prediction
# --------------------------------------------------------------------------------------


def test_reparameterization_moments(tiny_multiclass):
  m = fedsr_model(tiny_multiclass.model, z_dim=Z)
  p = m.init(0)
  comp = fedsr_component(sigma_min=1e-5)
  n = 20000
  x = jnp.tile(tiny_multiclass.train.x[0, :1], (n, 1))
  fwd = comp.call("forward", model=m, params=p, batch=Batch(x=x, y=None, w=None),
                  key=jax.random.key(5))
  h = np.asarray(m.features(p, x[:1]), np.float64)[0]
  mu, sigma = h[:Z], softplus(h[Z:]) + 1e-5               # σ = softplus(pre-σ) + floor
  np.testing.assert_allclose(np.asarray(fwd.aux[0])[0], mu, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(fwd.aux[1])[0], sigma, rtol=1e-5)
  z = np.asarray(fwd.z, np.float64)
  assert np.all(np.abs(z.mean(0) - mu) < 5 * sigma / math.sqrt(n))
  np.testing.assert_allclose(z.std(0), sigma, rtol=0.05)
  np.testing.assert_allclose(np.asarray(fwd.logits), np.asarray(m.classify(p, fwd.z)),
                             rtol=1e-6)


@pytest.mark.parametrize("kind", ["multiclass", "binary"])
def test_eval_forward_averages_probabilities(tiny_multiclass, tiny_binary, kind):
  if kind == "multiclass":
    base, x = tiny_multiclass.model, tiny_multiclass.train.x[0, :6]
  else:
    data, base = tiny_binary
    x = data.x[0, :6]
  m = fedsr_model(base, z_dim=Z)
  p = m.init(1)
  s = 7
  comp = fedsr_component(mc_samples=s)
  key = jax.random.key(11)
  got = np.asarray(comp.call("eval_forward", model=m, params=p, batch=Batch(x=x, y=None, w=None),
                             key=key), np.float64)
  # Manual loop with the same draws.
  h = np.asarray(m.features(p, x), np.float64)
  mu, sigma = h[:, :Z], softplus(h[:, Z:]) + 1e-5
  eps = np.asarray(jax.random.normal(key, (s,) + mu.shape), np.float64)
  probs = 0.0
  for t in range(s):
    logits = np.asarray(m.classify(p, jnp.asarray(mu + sigma * eps[t], jnp.float32)),
                        np.float64)
    if kind == "multiclass":
      e = np.exp(logits - logits.max(1, keepdims=True))
      probs = probs + e / e.sum(1, keepdims=True)
    else:
      probs = probs + 1.0 / (1.0 + np.exp(-logits))
  probs /= s
  if kind == "multiclass":
    np.testing.assert_allclose(got, np.log(probs), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.exp(got).sum(1), 1.0, rtol=1e-5)
  else:
    assert got.shape == (6, 1)
    np.testing.assert_allclose(got, np.log(probs) - np.log1p(-probs), rtol=1e-4, atol=1e-5)


def test_mc_predict_logits_is_stable_for_extreme_logits():
  logits = jnp.asarray([[[200.0]], [[-200.0]]])           # p = (1 + 0) / 2 = 0.5
  np.testing.assert_allclose(np.asarray(mc_predict_logits(logits)), [[0.0]], atol=1e-6)
  big = jnp.asarray([[[300.0, -300.0]], [[300.0, -300.0]]])
  out = np.asarray(mc_predict_logits(big))
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, [[0.0, -600.0]], atol=1e-3)


# --------------------------------------------------------------------------------------
# Loss terms against hand computations
# --------------------------------------------------------------------------------------


def _hand_terms(fwd, params_ref, y, w):
  z = np.asarray(fwd.z, np.float64)
  mu, sigma = (np.asarray(a, np.float64) for a in fwd.aux)
  w = np.asarray(w, np.float64)
  l2r_sq = np.sum(w * np.sum(z ** 2, 1)) / w.sum()
  l2r = np.sum(w * np.sqrt(np.sum(z ** 2, 1))) / w.sum()
  y = np.asarray(y)
  r_mu = np.asarray(params_ref["mu"], np.float64)[y]
  r_s = softplus(np.asarray(params_ref["sigma_raw"], np.float64))[y] + 1e-5
  kl = np.sum(np.log(r_s) - np.log(sigma) + (sigma ** 2 + (mu - r_mu) ** 2) / (2 * r_s ** 2)
              - 0.5, axis=1)
  return l2r_sq, l2r, np.sum(w * kl) / w.sum()


def _model_params_batch(task):
  """FedSR model of ``task`` (z_dim Z), params with a random reference, one batch."""
  m = fedsr_model(task.model, z_dim=Z)
  return m, _random_reference(m.init(0)), _batch(task)


def test_l2r_and_cmi_terms_match_hand_computation(tiny_multiclass):
  m, p, b = _model_params_batch(tiny_multiclass)
  key = jax.random.key(2)
  fwd = fedsr_component().call("forward", model=m, params=p, batch=b, key=key)
  l2r_sq, l2r, cmi = _hand_terms(fwd, p["reference"], b.y, b.w)
  assert cmi > 0.1 and l2r_sq > 0.1
  ctx = _ctx(p)
  def term(**kw):
    c = fedsr_component(r_mode="averaged", **kw)
    return float(c.call("loss", model=m, kind="multiclass", params=p, batch=b, fwd=fwd, ctx=ctx,
                        key=key))
  np.testing.assert_allclose(term(alpha_l2r=0.3, alpha_cmi=0.0), 0.3 * l2r_sq, rtol=1e-5)
  np.testing.assert_allclose(term(alpha_l2r=0.3, alpha_cmi=0.0, l2r_squared=False),
                             0.3 * l2r, rtol=1e-5)
  np.testing.assert_allclose(term(alpha_l2r=0.0, alpha_cmi=0.2), 0.2 * cmi, rtol=1e-5)
  np.testing.assert_allclose(term(alpha_l2r=0.3, alpha_cmi=0.2),
                             0.3 * l2r_sq + 0.2 * cmi, rtol=1e-5)
  # Local mode: the client's own r is used (the params' copy is only an offset).
  r_local = _random_reference(p, seed=9)["reference"]
  c = fedsr_component(alpha_l2r=0.0, alpha_cmi=0.2, r_mode="local")
  got = float(c.call("loss", model=m, kind="multiclass", params=p, batch=b, fwd=fwd,
                     ctx=_ctx(p, r_local), key=key))
  np.testing.assert_allclose(got, 0.2 * _hand_terms(fwd, r_local, b.y, b.w)[2], rtol=1e-5)
  shift = jax.tree.map(lambda a: a + 0.25, p["reference"])
  moved = {**p, "reference": shift}
  got = float(c.call("loss", model=m, kind="multiclass", params=moved, batch=b, fwd=fwd,
                     ctx=_ctx(p, r_local), key=key))
  want_ref = jax.tree.map(lambda a: a + 0.25, r_local)
  np.testing.assert_allclose(got, 0.2 * _hand_terms(fwd, want_ref, b.y, b.w)[2], rtol=1e-5)


def _norm(tree):
  return float(sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree)))


def test_gradients_reach_featurizer_and_reference(tiny_multiclass):
  m, p, b = _model_params_batch(tiny_multiclass)
  key = jax.random.key(4)
  r_local = _random_reference(p, seed=9)["reference"]

  def grads(comp, ctx, model=m, params=p):
    def f(q):
      fwd = (comp.call("forward", model=model, params=q, batch=b, key=key)
             if comp.forward is not None
             else default_forward(model, q, b.x))
      return comp.call("loss", model=model, kind="multiclass", params=q, batch=b, fwd=fwd,
                       ctx=ctx, key=key)
    return jax.grad(f)(params)

  g = grads(fedsr_component(alpha_l2r=1.0, alpha_cmi=0.0), _ctx(p))
  assert _norm(g["featurizer"]) > 1e-6 and _norm(g["classifier"]) == 0.0
  assert _norm(g["reference"]) == 0.0
  g = grads(fedsr_component(alpha_l2r=0.0, alpha_cmi=1.0, r_mode="averaged"), _ctx(p))
  assert _norm(g["featurizer"]) > 1e-6 and _norm(g["classifier"]) == 0.0
  assert _norm(g["reference"]["mu"]) > 1e-6 and _norm(g["reference"]["sigma_raw"]) > 1e-6
  # Local mode: the gradient w.r.t. the offset is the gradient w.r.t. the client's r.
  g_loc = grads(fedsr_component(alpha_l2r=0.0, alpha_cmi=1.0, r_mode="local"),
                _ctx(p, r_local))
  p_as_local = {**p, "reference": r_local}
  g_avg = grads(fedsr_component(alpha_l2r=0.0, alpha_cmi=1.0, r_mode="averaged"),
                _ctx(p_as_local), params=p_as_local)
  chex.assert_trees_all_close(g_loc, g_avg, rtol=1e-5, atol=1e-7)
  # Deterministic FedL2R head: the L2R gradient still reaches the featurizer.
  det = fedsr_model(tiny_multiclass.model, z_dim=Z, probabilistic=False, with_reference=False)
  pd = det.init(0)
  g = grads(fedsr_component(alpha_l2r=1.0, alpha_cmi=0.0, probabilistic=False), _ctx(pd),
            model=det, params=pd)
  assert _norm(g["featurizer"]) > 1e-6


# --------------------------------------------------------------------------------------
# Where r(z|y) lives: the engine against a slow per-client loop
# --------------------------------------------------------------------------------------


def _reference_fedsr(model, data, params, *, rounds, r_mode, a_l2r, a_cmi, lr, mom, wd,
                     steps, bs, key, weighting, persistent):
  """Python loop over clients, each training (w, its own r) with coupled weight decay and
  heavy-ball momentum; server: plain mean of the client models (FedSR eq. 1, official
  ``communicate``) or size-weighted (``weighting='num_examples'``). Written from FedSR
  eq. 9-11, 17-18. ``persistent``: each client's momentum buffer is created once and
  kept across its rounds (the official code creates each client's optimizer once);
  otherwise it restarts at zero every round."""
  n_all = np.asarray(data.n)
  local_r = [params["reference"]] * data.num_clients
  bufs = [None] * data.num_clients  # each client's momentum buffer (None: not created)

  def objective(q, x, y, k):
    h = model.features(q, x)
    mu, sigma = h[:, :Z], jax.nn.softplus(h[:, Z:]) + 1e-5
    z = mu + sigma * jax.random.normal(k, mu.shape)
    ce = oracle.mean_loss("binary", model.classify(q, z), y)  # the oracle's own loss
    r_mu = q["reference"]["mu"][y]
    r_s = jax.nn.softplus(q["reference"]["sigma_raw"][y]) + 1e-5
    kl = jnp.sum(jnp.log(r_s) - jnp.log(sigma)
                 + (sigma ** 2 + (mu - r_mu) ** 2) / (2 * r_s ** 2) - 0.5, axis=1)
    return ce + a_l2r * jnp.mean(jnp.sum(z ** 2, 1)) + a_cmi * jnp.mean(kl)

  grad = jax.jit(jax.grad(objective))
  for rnd in range(rounds):
    idx, ckeys = round_keys(key, rnd, data.num_clients, COHORT)
    deltas, weights = [], []
    for i, ck in zip(idx, ckeys):
      q = dict(params, reference=local_r[i]) if r_mode == "local" else params
      start = q
      buf = bufs[i] if persistent and bufs[i] is not None else jax.tree.map(jnp.zeros_like, q)
      # The engine's documented draws: minibatches from batch_indices; loss key of step s
      # = split(split(k_train)[1], K)[s], whose first split feeds the forward pass.
      k_train, _ = jax.random.split(ck)
      _, k_loss = jax.random.split(k_train)
      for b, kl in zip(batch_indices(ck, steps, int(n_all[i]), bs),
                       jax.random.split(k_loss, steps)):
        g = grad(q, data.x[i][b], data.y[i][b], jax.random.split(kl, 2)[0])
        g = jax.tree.map(lambda g, w: g + wd * w, g, q)
        buf = jax.tree.map(lambda m, g: mom * m + g, buf, g)
        q = jax.tree.map(lambda w, m: w - lr * m, q, buf)
      if r_mode == "local":
        local_r[i] = q["reference"]
      bufs[i] = buf
      deltas.append(jax.tree.map(jnp.subtract, start, q))
      weights.append(float(n_all[i]) if weighting == "num_examples" else 1.0)
    wsum = sum(weights)
    pg = jax.tree.map(lambda *ds: sum(w * d for w, d in zip(weights, ds)) / wsum, *deltas)
    new = jax.tree.map(jnp.subtract, params, pg)
    if r_mode == "local":
      new["reference"] = params["reference"]
    params = new
  return params, local_r


@pytest.mark.parametrize("r_mode,weighting,state", [
    ("local", None, None), ("averaged", "num_examples", None), ("local", None, "restart")])
@pytest.mark.slow
def test_engine_matches_per_client_loop(tiny_binary, r_mode, weighting, state):
  """Default (None): the uniform server mean of FedSR eq. 1; the option: size weights.
  Client optimizer state: persistent by default (official code), or restarted."""
  data, base = tiny_binary
  assert len(set(np.asarray(data.n).tolist())) > 1        # unequal clients: weights matter
  hp = dict(a_l2r=0.1, a_cmi=0.5, lr=0.1, mom=0.9, wd=0.01, steps=3, bs=8)
  extra = {} if weighting is None else {"weighting": weighting}
  if state is not None:
    extra["client_optimizer_state"] = state
  alg = make_algorithm("fedsr", z_dim=Z, alpha_l2r=hp["a_l2r"], alpha_cmi=hp["a_cmi"],
                       r_mode=r_mode, client_lr=hp["lr"], client_optimizer="momentum",
                       weight_decay=hp["wd"], local_steps=hp["steps"], batch_size=hp["bs"],
                       **extra)
  model = alg.model_for(base)
  p0 = model.init(0)
  rf = build_round(model, "binary", alg, data.num_clients, COHORT, execution="scan")
  server, cs = init_state(alg, p0, data.num_clients)
  sampled = set()
  for _ in range(2):
    server, cs, metrics = rf(server, cs, data, jax.random.key(0))
    sampled |= set(np.asarray(metrics["clients"]).tolist())
  # The server state's structure is stable across rounds: the round compiled once.
  assert rf.jitted._cache_size() == 1
  want, want_r = _reference_fedsr(model, data, p0, rounds=2, r_mode=r_mode,
                                  key=jax.random.key(0),
                                  weighting=weighting or "uniform",
                                  persistent=state != "restart", **hp)
  chex.assert_trees_all_close(server.params, want, rtol=1e-4, atol=1e-5)
  moved_ref = _norm(jax.tree.map(jnp.subtract, server.params["reference"], p0["reference"]))
  assert (CLIENT_OPT_STATE in cs) == (state != "restart")
  cs = {k: v for k, v in cs.items() if k != CLIENT_OPT_STATE}
  if r_mode == "averaged":
    assert cs == {} and moved_ref > 1e-8
    return
  assert moved_ref == 0.0                                  # the server's copy never moves
  for i in range(data.num_clients):
    mine = jax.tree.map(lambda a: a[i], cs["fedsr"])
    chex.assert_trees_all_close(mine, want_r[i], rtol=1e-4, atol=1e-5)
    changed = _norm(jax.tree.map(jnp.subtract, mine, p0["reference"])) > 1e-10
    assert changed == (i in sampled)
  # Clients keep different references (they are not averaged).
  assert _norm(jax.tree.map(lambda a: a[min(sampled)] - a[max(sampled)], cs["fedsr"])) > 1e-10


# --------------------------------------------------------------------------------------
# Short runs of every registry name
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fedsr", "fedl2r", "fedcmi"])
@pytest.mark.slow
def test_short_runs_are_finite(tiny_multiclass, tiny_binary, name):
  data, base = tiny_binary
  binary = Task("tiny_binary", "binary", data, {"ood": data}, base, {})
  for task in (tiny_multiclass, binary):
    alg = make_algorithm(name, z_dim=Z, local_steps=2, batch_size=8, mc_samples=4,
                         client_lr=0.1)
    res = run(task, alg, rounds=2, eval_every=2, progress=False)
    for entry in res.history:
      for k, v in entry.items():
        assert np.isfinite(v), (name, task.kind, k, v)
    assert res.final["round"] == 2
    np.testing.assert_allclose(res.final["ood_accuracy"],
                               _recomputed_accuracy(task, alg, res.params), atol=1e-6)


def _recomputed_accuracy(task, alg, params):
  """Pooled accuracy on ``task.eval_sets['ood']``, counted by the oracle from the
  evaluation predictor's logits. The evaluator draws its Monte-Carlo noise for a whole
  client block (``n_max`` rows, padded rows zeroed) with key ``fold_in(key(0), 0)``, so
  the same call reproduces its logits."""
  from fedjax_inv.core.engine import eval_logits_fn
  predict = jax.jit(eval_logits_fn(alg.model_for(task.model), alg))
  key = jax.random.fold_in(jax.random.key(0), 0)
  return oracle.pooled_eval(lambda x: predict(params, x, key), task.kind,
                            task.eval_sets["ood"])["accuracy"]


def test_regression_task_rejected_at_trace():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(10, 4)).astype(np.float32) for _ in range(2)]
  ys = [x[:, 0].astype(np.float32) for x in xs]
  data = from_client_arrays(xs, ys)
  alg = make_algorithm("fedsr", z_dim=Z, local_steps=1, batch_size=4)
  model = alg.model_for(models.mlp(4, (5,), 1))
  rf = build_round(model, "regression", alg, 2, 2, execution="scan")
  server, cs = init_state(alg, model.init(0), 2)
  with pytest.raises(ValueError, match="classification"):
    rf(server, cs, data, jax.random.key(0))


@pytest.mark.parametrize("name,kw,match", [
    ("fedsr", dict(alpha_l2r=-1.0), "alpha_l2r"),
    ("fedsr", dict(alpha_cmi=float("nan")), "alpha_cmi"),
    ("fedsr", dict(alpha_cmi="big"), "alpha_cmi"),
    ("fedsr", dict(z_dim=0), "z_dim"),
    ("fedsr", dict(z_dim=2.5), "z_dim"),
    ("fedsr", dict(mc_samples=0), "mc_samples"),
    ("fedsr", dict(r_mode="global"), "r_mode"),
    ("fedsr", dict(sigma_min=0.0), "sigma_min"),
    ("fedsr", dict(l2r_squared="yes"), "l2r_squared"),
    ("fedsr", dict(weight_decay=-1e-3), "weight_decay"),
    ("fedsr", dict(probabilistic=False), "fixes probabilistic"),
    ("fedsr", dict(mu=0.1), "unknown hyperparameters"),
    ("fedl2r", dict(alpha_l2r=-0.1), "alpha_l2r"),
    ("fedl2r", dict(probabilistic="no"), "probabilistic"),
    ("fedl2r", dict(alpha_cmi=0.1), "fixes alpha_cmi"),
    ("fedcmi", dict(alpha_l2r=0.1), "fixes alpha_l2r"),
    ("fedcmi", dict(alpha_cmi=-1.0), "alpha_cmi"),
    ("fedcmi", dict(client_lr=0.0), "client_lr"),
])
def test_bad_hyperparameters_raise_value_error(name, kw, match):
  with pytest.raises(ValueError, match=match):
    make_algorithm(name, **kw)


def test_cmi_needs_probabilistic_head():
  with pytest.raises(ValueError, match="probabilistic"):
    fedsr_component(alpha_cmi=0.1, probabilistic=False)


def test_defaults_and_hparams():
  alg = make_algorithm("fedsr")
  hp = alg.hparams
  # z_dim None: the task model's own representation size (tests/test_fedsr_head.py).
  assert (hp["alpha_l2r"], hp["alpha_cmi"], hp["z_dim"], hp["mc_samples"]) == \
      (1e-2, 5e-4, None, 20)
  assert alg.weighting == "uniform"
  assert hp["r_mode"] == "local" and hp["l2r_squared"] is True
  assert (alg.local_steps, alg.batch_size) == (5, 64)
  # the official code creates each client's optimizer once (tests/test_client_opt_state.py)
  assert alg.client_optimizer_state == hp["client_optimizer_state"] == "persistent"
  assert make_algorithm("fedl2r").hparams["probabilistic"] is False
  assert make_algorithm("fedcmi").hparams["alpha_l2r"] == 0.0


def test_local_reference_updates_client_state_without_a_message(tiny_multiclass):
  """Issue 22: r_mode='local' updates each client's r (its client-state hook) and sends no
  message at all (no message hook, no aggregator)."""
  c = fedsr_component(alpha_l2r=0.0, alpha_cmi=0.1, r_mode="local")
  assert c.aggregator is None and c.message is None and c.update_client is not None
  p = fedsr_model(tiny_multiclass.model, z_dim=Z).init(0)
  moved = jax.tree.map(lambda a: a + 1.0, p)
  ctx = _ctx(p, client_ref=c.call("init_client", params=p))
  r_new = c.call("update_client", kind="multiclass", params=moved, ctx=ctx)
  chex.assert_trees_all_close(r_new, jax.tree.map(lambda a: a + 1.0, p["reference"]))


def test_adamw_does_not_decay_the_local_reference():
  """Local r with AdamW: decoupled decay would act on the offset, so it is masked out."""
  alg = make_algorithm("fedsr", z_dim=Z, client_optimizer="adam", weight_decay=0.1,
                       client_lr=0.01)
  assert alg.hparams["reference_weight_decay"] is False
  params = fedsr_model(models.mlp(4, (5,), 2), z_dim=Z).init(0)
  params = _random_reference(params)
  zeros = jax.tree.map(jnp.zeros_like, params)
  opt = alg.client_optimizer
  upd, _ = opt.update(zeros, opt.init(params), params)
  np.testing.assert_allclose(np.asarray(upd["featurizer"]["layers"][1]["kernel"]),
                             -0.01 * 0.1 * np.asarray(params["featurizer"]["layers"][1]["kernel"]),
                             rtol=1e-5)
  assert _norm(upd["reference"]) == 0.0
  # Averaged r is an ordinary parameter: decayed like the others.
  avg = make_algorithm("fedsr", z_dim=Z, client_optimizer="adam", weight_decay=0.1,
                       client_lr=0.01, r_mode="averaged")
  upd, _ = avg.client_optimizer.update(zeros, avg.client_optimizer.init(params), params)
  assert _norm(upd["reference"]) > 0.0
