"""Invariant FedAvg (IRMv1) and FedIIR: schedule, closed forms, slow reference loops."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.algorithms import fediir, invariance
from fedjax_inv.core.algorithm import Batch, Context
from fedjax_inv.core.engine import build_round, default_forward, init_state
from tests.reference import batch_indices, round_keys
from tests.trees import max_abs_diff

COHORT = 4  # of the 5 tiny_binary clients


def _sigmoid(f):
  return 1.0 / (1.0 + jnp.exp(-f))


def _leaves_close(a, b, rtol=2e-4, atol=2e-6):
  # Same structure (containers, keys) and leaf shapes, then values.
  chex.assert_trees_all_close(a, b, rtol=rtol, atol=atol)


def _engine(model, data, alg, rounds, strategy="scan", seed=0):
  rf = build_round(model, "binary", alg, data.num_clients, COHORT, execution=strategy)
  server, cs = init_state(alg, model.init(seed), data.num_clients)
  history = []
  for _ in range(rounds):
    before = server.params
    server, cs, m = rf(server, cs, data, jax.random.key(seed))
    history.append((before, np.asarray(m["clients"])))
  return server, history


def _client_batches(data, i, ck, local_steps, batch_size):
  n = int(data.n[i])
  x, y = np.asarray(data.x[i]), np.asarray(data.y[i])
  for bidx in batch_indices(ck, local_steps, n, batch_size):
    if bidx is None:
      yield x, y, (np.arange(len(x)) < n).astype(np.float32)
    else:
      yield x[bidx], y[bidx], np.ones(len(bidx), np.float32)


def _reference_round(data, params, grad, rnd, *, local_steps, batch_size, lr,
                     weighting="num_examples", seed=0, extra=()):
  """One round, Python loop over clients, plain SGD with ``grad(p, x, y, w, *extra)``."""
  idx, ckeys = round_keys(jax.random.key(seed), rnd, data.num_clients, COHORT)
  deltas, weights = [], []
  for i, ck in zip(idx, ckeys):
    p = params
    for xb, yb, wb in _client_batches(data, i, ck, local_steps, batch_size):
      p = jax.tree.map(lambda w, g: w - lr * g, p, grad(p, xb, yb, wb, *extra))
    deltas.append(jax.tree.map(jnp.subtract, params, p))
    weights.append(float(data.n[i]) if weighting == "num_examples" else 1.0)
  tot = sum(weights)
  mean = jax.tree.map(lambda *d: sum(w * x for w, x in zip(weights, d)) / tot, *deltas)
  return jax.tree.map(jnp.subtract, params, mean)


# ---------------------------------------------------------------------------------------
# Closed-form pieces written out by hand (binary cross-entropy, logits f = model output).
# ---------------------------------------------------------------------------------------


def _bce_parts(model, p, x, y, w):
  f = model.apply(p, x).reshape(-1)
  y = y.astype(f.dtype)
  wsum = jnp.sum(w)
  risk = jnp.sum(w * (jnp.logaddexp(0.0, f) - y * f)) / wsum
  dscale = (_sigmoid(f) - y) * f  # per-sample ∂ℓ_i(s f_i)/∂s at s = 1
  return f, risk, dscale, wsum


def _irm_grad(model, lam, per_sample=False):
  """Jitted gradient of ``(R + λ·IRMv1)/max(λ, 1)``, IRMv1 written in closed form."""
  def objective(p, x, y, w):
    _, risk, d, wsum = _bce_parts(model, p, x, y, w)
    pen = jnp.sum(w * d ** 2) / wsum if per_sample else (jnp.sum(w * d) / wsum) ** 2
    return (risk + lam * pen) / max(lam, 1.0)
  return jax.jit(jax.grad(objective))


def _classifier_grad_closed_form(model, p, x, y, w):
  """∇_ω R for the final Dense layer: ``(Σ w (σ(f)−y) z / Σ w, Σ w (σ(f)−y) / Σ w)``."""
  z = model.features(p, x)
  f = model.classify(p, z).reshape(-1)
  r = w * (_sigmoid(f) - y.astype(f.dtype)) / jnp.sum(w)
  return {"bias": jnp.sum(r)[None], "kernel": (r @ z)[:, None]}


def _fediir_grad(model, gamma):
  """Jitted gradient of ``R + (γ/2)‖∇_ω R − target‖²`` (``target`` the last argument)."""
  def objective(p, x, y, w, target):
    _, risk, _, _ = _bce_parts(model, p, x, y, w)
    g = _classifier_grad_closed_form(model, p, x, y, w)
    sq = sum(jnp.sum((g[k] - target[k]) ** 2) for k in ("bias", "kernel"))
    return risk + 0.5 * gamma * sq
  return jax.jit(jax.grad(objective))


def _global_classifier_grad(model, data, params, clients, weighting):
  """Mean over ``clients`` of the full-batch closed-form ``∇_ω R_c(params)``."""
  cf = jax.jit(lambda p, x, y, w: _classifier_grad_closed_form(model, p, x, y, w))
  gs, ws = [], []
  for i in clients:
    n = int(data.n[i])
    x, y = np.asarray(data.x[i]), np.asarray(data.y[i])
    gs.append(cf(params, x, y, (np.arange(len(x)) < n).astype(np.float32)))
    ws.append(float(n) if weighting == "num_examples" else 1.0)
  return jax.tree.map(lambda *g: sum(w * a for w, a in zip(ws, g)) / sum(ws), *gs)


# ---------------------------------------------------------------------------------------
# Invariant FedAvg
# ---------------------------------------------------------------------------------------


def test_irm_schedule_switches_at_warmup():
  lam = [float(invariance.irm_schedule(t, 1e4, 3)) for t in range(5)]
  assert lam == [0.0, 0.0, 0.0, 1e4, 1e4]
  lam = [float(invariance.irm_schedule(t, 50.0, 2, warmup_weight=1.0)) for t in range(3)]
  assert lam == [1.0, 1.0, 50.0]


@pytest.mark.parametrize("strategy", ["vmap"])
@pytest.mark.slow
def test_inv_fedavg_during_warmup_is_fedavg(tiny_binary, strategy):
  data, model = tiny_binary
  kw = dict(client_lr=0.1, local_steps=3, batch_size=8)
  inv, _ = _engine(model, data, make_algorithm("inv_fedavg", penalty_weight=1e4,
                                               warmup_rounds=2, **kw), 2, strategy)
  avg, _ = _engine(model, data, make_algorithm("fedavg", **kw), 2, strategy)
  _leaves_close(inv.params, avg.params, rtol=1e-6, atol=1e-7)
  # Guard: once the penalty is on, the same round gives a different model.
  on, _ = _engine(model, data, make_algorithm("inv_fedavg", penalty_weight=1e4,
                                              warmup_rounds=1, **kw), 2, strategy)
  assert max_abs_diff(on.params, avg.params) > 1e-4


@pytest.mark.parametrize("lam", [0.5, 100.0])
@pytest.mark.parametrize("irm_mode", ["client", "per_sample"])
@pytest.mark.slow
def test_inv_fedavg_matches_reference_loop(tiny_binary, lam, irm_mode):
  """Round 0 is FedAvg (warm-up), round 1 minimizes (R + λ·IRMv1)/max(λ, 1)."""
  data, model = tiny_binary
  batch_size = None if irm_mode == "client" else 8  # full batch exercises the padding
  kw = dict(client_lr=0.2, local_steps=2, batch_size=batch_size)
  alg = make_algorithm("inv_fedavg", penalty_weight=lam, warmup_rounds=1,
                       irm_mode=irm_mode, **kw)
  got, _ = _engine(model, data, alg, rounds=2)
  erm, irm = _irm_grad(model, 0.0), _irm_grad(model, lam, irm_mode == "per_sample")
  ref = dict(local_steps=2, batch_size=batch_size, lr=0.2)
  p1 = _reference_round(data, model.init(0), erm, 0, **ref)
  p = _reference_round(data, p1, irm, 1, **ref)
  _leaves_close(got.params, p)
  # Guard: the unpenalized second round would be detectably different.
  assert max_abs_diff(_reference_round(data, p1, erm, 1, **ref), p) > 1e-5


def test_per_sample_irm_v1_closed_form():
  rng = np.random.default_rng(0)
  f = rng.normal(size=(7, 1)).astype(np.float32) * 2
  y = rng.integers(0, 2, 7)
  w = np.array([1, 1, 0, 1, 1, 0, 1], np.float32)
  d = (1 / (1 + np.exp(-f[:, 0])) - y) * f[:, 0]
  want = np.sum(w * d ** 2) / np.sum(w)
  got = invariance.per_sample_irm_v1(f, y, w)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  client = (np.sum(w * d) / np.sum(w)) ** 2
  assert float(got) > client  # Jensen; equal only if all d_i agree
  # Multiclass: d_i = Σ_k (softmax − onehot)_ik f_ik.
  logits = rng.normal(size=(6, 3)).astype(np.float32)
  labels = rng.integers(0, 3, 6)
  p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
  d = np.sum((p - np.eye(3)[labels]) * logits, axis=1)
  np.testing.assert_allclose(float(invariance.per_sample_irm_v1(logits, labels)),
                             np.mean(d ** 2), rtol=1e-5)
  # Regression: d_i = 2 (f_i − y_i) f_i.
  pred = rng.normal(size=(5, 1)).astype(np.float32)
  tgt = rng.normal(size=(5,)).astype(np.float32)
  d = 2 * (pred[:, 0] - tgt) * pred[:, 0]
  np.testing.assert_allclose(
      float(invariance.per_sample_irm_v1(pred, tgt, loss="mse")), np.mean(d ** 2),
      rtol=1e-5)


def test_inv_fedavg_hparams_recorded():
  alg = make_algorithm("inv_fedavg", penalty_weight=3.0, warmup_rounds=7,
                       irm_mode="per_sample", client_lr=0.05)
  assert alg.hparams["penalty_weight"] == 3.0
  assert alg.hparams["warmup_rounds"] == 7
  assert alg.hparams["irm_mode"] == "per_sample"
  assert alg.hparams["warmup_weight"] == 0.0
  assert alg.hparams["client_lr"] == 0.05
  assert [c.name for c in alg.components] == ["irm"]


# ---------------------------------------------------------------------------------------
# FedIIR
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("weighting", ["uniform", "num_examples"])
@pytest.mark.slow
def test_fediir_pre_stage_is_mean_classifier_gradient(tiny_binary, weighting):
  data, model = tiny_binary
  alg = make_algorithm("fediir", gamma=0.5, ema=0.95, client_lr=0.1, local_steps=2,
                       batch_size=8, weighting=weighting)
  server, hist = _engine(model, data, alg, rounds=1)
  p0, clients = hist[0]
  want = _global_classifier_grad(model, data, p0, clients, weighting)
  _leaves_close(server.extras["fediir"]["g"], want, rtol=1e-5, atol=1e-7)
  assert int(server.extras["fediir"]["count"]) == 1
  assert float(jnp.abs(want["kernel"]).max()) > 1e-3


@pytest.mark.parametrize("ema_init", ["first", "zeros"])
def test_fediir_ema_matches_hand_loop(tiny_binary, ema_init):
  data, model = tiny_binary
  v = 0.9
  alg = make_algorithm("fediir", gamma=0.5, ema=v, ema_init=ema_init, client_lr=0.1,
                       local_steps=2, batch_size=8)
  server, hist = _engine(model, data, alg, rounds=3, strategy="vmap")
  g = None
  for _t, (params_t, clients_t) in enumerate(hist):
    g_bar = _global_classifier_grad(model, data, params_t, clients_t, "uniform")
    if g is None:
      g = g_bar if ema_init == "first" else jax.tree.map(lambda b: (1 - v) * b, g_bar)
    else:
      g = jax.tree.map(lambda m, b: v * m + (1 - v) * b, g, g_bar)
  _leaves_close(server.extras["fediir"]["g"], g, rtol=1e-5, atol=1e-7)
  # Guard: the model moved, so the EMA differs from the last round's plain mean.
  assert max_abs_diff(g, g_bar) > 1e-5


def _fediir_ctx(params, target):
  return Context(params=params, round=jnp.int32(0),
                 extras={"fediir": {"g": target, "count": jnp.int32(1)}}, client={},
                 num_clients=jnp.float32(5), cohort=jnp.float32(4))


def test_fediir_penalty_value_and_featurizer_gradient(tiny_binary):
  """The penalty's gradient reaches the featurizer (second order through ∇_ω R)."""
  data, model = tiny_binary
  gamma = 2.0
  comp = fediir.fediir_component(gamma=gamma)
  params = model.init(1)
  x, y = data.x[1, :16], data.y[1, :16]
  w = jnp.ones(16)
  batch = Batch(x=x, y=y, w=w)
  target = jax.tree.map(lambda a: 0.3 * jnp.ones_like(a), params["classifier"])
  ctx = _fediir_ctx(params, target)

  @jax.jit
  def penalty(p):
    return comp.call("loss", model=model, kind="binary", params=p, batch=batch,
                     fwd=default_forward(model, p, x), ctx=ctx)

  g_cf = _classifier_grad_closed_form(model, params, x, y, w)
  want = 0.5 * gamma * sum(float(jnp.sum((g_cf[k] - target[k]) ** 2)) for k in g_cf)
  np.testing.assert_allclose(float(penalty(params)), want, rtol=1e-5)

  grads = jax.jit(jax.grad(penalty))(params)
  feat = jax.tree.leaves(grads["featurizer"])
  assert max(float(jnp.max(jnp.abs(a))) for a in feat) > 1e-4
  # Directional finite difference along a featurizer-only direction.
  direction = jax.tree.map(lambda a: jnp.zeros_like(a), params)
  k = jax.random.key(3)
  direction["featurizer"] = jax.tree.map(
      lambda a: jax.random.normal(k, a.shape), params["featurizer"])
  eps = 1e-2
  shift = lambda s: jax.tree.map(lambda a, d: a + s * d, params, direction)  # noqa: E731
  fd = (float(penalty(shift(eps))) - float(penalty(shift(-eps)))) / (2 * eps)
  ad = sum(jax.tree.leaves(jax.tree.map(lambda g, d: float(jnp.sum(g * d)), grads,
                                        direction)))
  np.testing.assert_allclose(ad, fd, rtol=2e-2)
  assert abs(ad) > 1e-3

  # A first-order port (inner gradient treated as a constant) would get exactly zero
  # featurizer gradient — the silent failure this test guards against.
  def detached(p):
    g = jax.lax.stop_gradient(fediir.classifier_risk_grad(
        model, "binary", p, model.features(p, x), y, w))
    return fediir.gradient_alignment(g, target, gamma)
  dead = jax.jit(jax.grad(detached))(params)
  chex.assert_trees_all_equal(dead, jax.tree.map(jnp.zeros_like, params))


@pytest.mark.parametrize("strategy", ["vmap"])
def test_fediir_round_matches_reference_loop(tiny_binary, strategy):
  data, model = tiny_binary
  gamma, v = 3.0, 0.8
  kw = dict(client_lr=0.2, local_steps=2, batch_size=8)
  alg = make_algorithm("fediir", gamma=gamma, ema=v, **kw)
  got, hist = _engine(model, data, alg, rounds=2, strategy=strategy)
  grad = _fediir_grad(model, gamma)
  p = model.init(0)
  g = None
  for t in range(2):
    idx, _ = round_keys(jax.random.key(0), t, data.num_clients, COHORT)
    g_bar = _global_classifier_grad(model, data, p, idx, "uniform")
    g = g_bar if g is None else jax.tree.map(lambda m, b: v * m + (1 - v) * b, g, g_bar)
    p = _reference_round(data, p, grad, t, lr=0.2, local_steps=2, batch_size=8,
                         weighting="uniform", extra=(g,))
  _leaves_close(got.params, p)
  plain, _ = _engine(model, data, make_algorithm("fedavg", weighting="uniform", **kw), 2,
                     strategy)
  assert max_abs_diff(plain.params, p) > 1e-5


def test_fediir_hparams_and_defaults():
  alg = make_algorithm("fediir")
  assert alg.hparams["ema"] == 0.95 and alg.hparams["ema_init"] == "first"
  assert alg.hparams["gamma"] == 1e-2 and alg.weighting == "uniform"
  alg = make_algorithm("fediir", gamma=5.0, ema=0.0, weighting="num_examples")
  assert (alg.hparams["gamma"], alg.hparams["ema"], alg.weighting) == (
      5.0, 0.0, "num_examples")


# ---------------------------------------------------------------------------------------
# Bad hyperparameters fail in the factory
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw,match", [
    ("inv_fedavg", dict(penalty_weight=-1.0), "penalty_weight"),
    ("inv_fedavg", dict(penalty_weight=float("nan")), "penalty_weight"),
    ("inv_fedavg", dict(irm_mode="batch"), "irm_mode"),
    ("inv_fedavg", dict(warmup_rounds=-3), "warmup_rounds"),
    ("inv_fedavg", dict(warmup_rounds=2.5), "warmup_rounds"),
    ("inv_fedavg", dict(warmup_weight=-0.1), "warmup_weight"),
    ("inv_fedavg", dict(lambda_=1.0), "unknown hyperparameters"),
    ("fediir", dict(ema=1.0), "ema"),
    ("fediir", dict(ema=-0.1), "ema"),
    ("fediir", dict(gamma=-1e-3), "gamma"),
    ("fediir", dict(ema_init="ones"), "ema_init"),
    ("fediir", dict(client_lr=0.0), "client_lr"),
])
def test_bad_hyperparameters_raise(name, kw, match):
  with pytest.raises(ValueError, match=match):
    make_algorithm(name, **kw)


def test_inv_fedavg_warns_when_the_run_ends_before_the_warmup(tiny_binary):
  """Issue 9.8: with rounds <= warmup_rounds, inv_fedavg equals FedAvg; say so."""
  from fedjax_inv.runner.simulation import run, warn_short_schedule
  data, model = tiny_binary
  alg = make_algorithm("inv_fedavg", penalty_weight=1e4, warmup_rounds=5)
  assert warn_short_schedule(alg, 6) is None
  assert warn_short_schedule(make_algorithm("fedavg"), 1) is None
  with pytest.warns(UserWarning, match=r"rounds=5 <= warmup_rounds=5.*never switches on"):
    assert "--hp warmup_rounds" in warn_short_schedule(alg, 5)

  class _Task:
    train, eval_sets, kind, info, name = data, {}, "binary", {}, "tiny"
  _Task.model = model
  with pytest.warns(UserWarning, match="warmup_rounds=5"):
    run(_Task(), alg, rounds=2, progress=False, reporting=None)


def test_lambda_schedule_is_an_optax_schedule():
  """Issue 14: λ(t) is an optax schedule; the default is the warm-up step, and any other
  schedule (here a linear ramp) replaces it in the client objective's λ and loss scale."""
  import types

  import optax
  step = invariance.penalty_schedule(1e4, 3)
  assert [float(step(t)) for t in range(5)] == [0.0, 0.0, 0.0, 1e4, 1e4]
  ramp = optax.linear_schedule(0.0, 100.0, 10)
  comp = invariance.irm_component(lambda_schedule=ramp)
  scales = [float(comp.call("loss_scale", ctx=types.SimpleNamespace(round=jnp.int32(t))))
            for t in (0, 1, 5, 10, 20)]
  assert scales == [1.0, 10.0, 50.0, 100.0, 100.0]  # max(λ(t), 1)
  alg = make_algorithm("inv_fedavg", lambda_schedule=ramp)
  assert "warmup_rounds" not in alg.hparams  # the step knobs do not apply
  assert alg.hparams["lambda_schedule"]
  with pytest.raises(ValueError, match="lambda_schedule"):
    invariance.irm_component(lambda_schedule=3.0)
