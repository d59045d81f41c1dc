"""FedILC family and FedCurv: every registry name equals a slow Python loop over clients.

The references below share only the documented randomness with the engine (sampled
clients, minibatch indices: ``tests.reference``) and are written from the papers'
formulas with ``jax.grad`` and the aggregators' array functions. FedSGD-type clients send
``w − (w − 1.0·g)`` (one ``sgd(1.0)`` step), which the references reproduce literally.
"""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv import models
from fedjax_inv.algorithms import penalties
from fedjax_inv.algorithms import make_algorithm, registry
from fedjax_inv.algorithms import fedcurv, fedilc, fedsgd_type, fishr
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import Batch, Context, Objective
from fedjax_inv.core.data import ClientData
from fedjax_inv.core.engine import build_round, full_batch, init_state
from tests import reference as oracle
from tests.reference import batch_indices, round_keys, tmap
from tests.trees import max_abs_diff

RTOL, ATOL = 2e-4, 2e-5
NAMES = ("geometric", "fishr_inter_geo", "fishr_intra_geo", "fishr_intra_arith", "fedcurv",
         "fedcurv_shoham")


# ---------------------------------------------------------------------------------------
# Slow references
# ---------------------------------------------------------------------------------------


def _client(data, i):
  n = int(data.n[i])
  return np.asarray(data.x[i])[:n], np.asarray(data.y[i])[:n], n


def _mean_loss(model, p, x, y):
  return oracle.mean_loss("binary", model.apply(p, x), y)  # the oracle's own loss


def _example_loss(model, p, x, y):
  return oracle.per_example_loss("binary", model.apply(p, x[None]), y[None])[0]


def _fishr_loss(model, p, x, y, w):
  """L_Fishr = (1/E) Σ_e ‖C_e − C̄‖², vmapped over the E sampled clients' full data
  (``x [E, n_max, ...]``, padding rows masked by ``w [E, n_max]``)."""
  def var(x, y, w):
    z = model.features(p, x)
    return penalties.per_sample_classifier_grad_variance(z, model.classify(p, z), y, w)
  return penalties.fishr_penalty(jax.vmap(var)(x, y, w))


_JITTED = {}


def _jitted(tag, model, fn):
  """One jitted function per (tag, model): references reuse their compilations."""
  key = (tag, id(model))
  if key not in _JITTED:
    _JITTED[key] = jax.jit(fn)
  return _JITTED[key]


def _fishr_grad(model):
  return _jitted("fishr", model, jax.grad(lambda p, x, y, w: _fishr_loss(model, p, x, y, w)))


def _server_step(kind, params, pg, state, lr, wd=0.0, b1=0.9, b2=0.999, eps=1e-8):
  """Hand-written server optimizers: plain SGD, or AdamW (bias-corrected, decoupled)."""
  if kind == "sgd":
    return tmap(lambda w, g: w - lr * g, params, pg), state
  t = state["t"] + 1
  m = tmap(lambda m, g: b1 * m + (1 - b1) * g, state["m"], pg)
  v = tmap(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], pg)
  new = tmap(lambda w, m, v: w - lr * ((m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t))
                                                                + eps) + wd * w),
             params, m, v)
  return new, {"t": t, "m": m, "v": v}


def reference_fedsgd_type(model, data, params, *, rounds, cohort, key, client_grad,
                          aggregate, fishr_lambda=0.0, batch_size=None, server="sgd",
                          server_lr=0.1, weight_decay=0.0):
  """FedILC Alg. 1-2 with a Python loop: ``w ← opt(w, aggregate(msgs) + λ∇L_Fishr)``.

  ``client_grad(p, x, y) -> gradient`` on the client's batch; ``aggregate(msgs, ns)``
  combines the FedSGD messages ``w − (w − g)``.
  """
  N = data.num_clients
  state = {"t": 0, "m": tmap(jnp.zeros_like, params), "v": tmap(jnp.zeros_like, params)}
  for rnd in range(rounds):
    idx, ckeys = round_keys(key, rnd, N, cohort)
    msgs, ns = [], []
    for i, ck in zip(idx, ckeys):
      x, y, n = _client(data, i)
      (bidx,) = batch_indices(ck, 1, n, batch_size)
      xb, yb = (x, y) if bidx is None else (x[bidx], y[bidx])
      g = client_grad(params, xb, yb)
      msgs.append(tmap(lambda w, g: w - (w - 1.0 * g), params, g))
      ns.append(float(n))
    pg = aggregate(msgs, ns)
    if fishr_lambda:
      gf = _fishr_grad(model)(params, data.x[idx], data.y[idx], data.mask()[idx])
      pg = tmap(lambda a, b: a + fishr_lambda * b, pg, gf)
    params, state = _server_step(server, params, pg, state, server_lr, weight_decay)
  return params


def _stack(trees):
  return tmap(lambda *a: jnp.stack(a), *trees)


def wgm_aggregate(zeros="both"):
  return lambda msgs, ns: aggs.weighted_geometric_mean(_stack(msgs), zeros=zeros)


def weighted_mean_aggregate(msgs, ns):
  return tmap(lambda *a: sum(n * m for n, m in zip(ns, a)) / sum(ns), *msgs)


def mean_grad(model):
  return _jitted("mean", model, jax.grad(lambda p, x, y: _mean_loss(model, p, x, y)))


def _example_grad(model):
  return _jitted("example", model, jax.grad(lambda p, x, y: _example_loss(model, p, x, y)))


def per_example_wgm_grad(model, zeros="both"):
  """Alg. 2's client: weightedgeo over the per-example gradients (loop over examples)."""
  grad1 = _example_grad(model)

  def client_grad(p, x, y):
    gs = [grad1(p, x[i], y[i]) for i in range(len(x))]
    return aggs.weighted_geometric_mean(_stack(gs), zeros=zeros)
  return client_grad


def group_wgm_grad(model, groups, zeros="both"):
  """FedILC §5: weightedgeo over m contiguous groups (example r → group ⌊r·m/n⌋)."""
  g_mean = mean_grad(model)

  def client_grad(p, x, y):
    n = len(x)
    gs = []
    for j in range(groups):
      members = [r for r in range(n) if (r * groups) // n == j]
      if members:
        gs.append(g_mean(p, x[members], y[members]))
    return aggs.weighted_geometric_mean(_stack(gs), zeros=zeros)
  return client_grad


def reference_fedcurv(model, data, params, *, rounds, cohort, key, lam, local_steps,
                      batch_size, client_lr, server_lr=1.0):
  """FedCurv (Shoham et al. 2019) with explicit per-client (F_j, θ_j) and a direct
  Σ_{j≠i} F_j(θ − θ_j)² penalty; server SGD on the size-weighted mean of w − θ_i."""
  N = data.num_clients
  stored = {}  # client -> (F_j, θ_j) of its last participation
  grad1 = _example_grad(model)

  def local_loss(p, x, y, others):
    pen = 0.0
    for f, th in others:
      # tmap pairs F_j, θ and θ_j leaf by leaf (and raises if their structures differ).
      pen = pen + sum(jax.tree.leaves(
          tmap(lambda fl, pl, tl: jnp.sum(fl * (pl - tl) ** 2), f, p, th)))
    return _mean_loss(model, p, x, y) + lam * pen

  g_local = jax.jit(jax.grad(local_loss))
  for rnd in range(rounds):
    idx, ckeys = round_keys(key, rnd, N, cohort)
    snapshot = dict(stored)
    deltas, ns = [], []
    for i, ck in zip(idx, ckeys):
      x, y, n = _client(data, i)
      others = [v for j, v in snapshot.items() if j != int(i)]
      p = params
      for bidx in batch_indices(ck, local_steps, n, batch_size):
        xb, yb = (x, y) if bidx is None else (x[bidx], y[bidx])
        p = tmap(lambda w, g: w - client_lr * g, p, g_local(p, xb, yb, others))
      gs = [grad1(p, x[k], y[k]) for k in range(n)]
      fisher = tmap(lambda *a: sum(t * t for t in a) / n, *gs)
      stored[int(i)] = (fisher, p)
      deltas.append(tmap(jnp.subtract, params, p))
      ns.append(float(n))
    pg = weighted_mean_aggregate(deltas, ns)
    params = tmap(lambda w, g: w - server_lr * g, params, pg)
  return params, stored


# ---------------------------------------------------------------------------------------
# Cases: name -> (make_algorithm kwargs, reference)
# ---------------------------------------------------------------------------------------

LAM = 3.0
CASES = {
    # Server AdamW with a larger step so that the comparison is not trivial; FedSGD on
    # minibatches of 8; the paper's zero convention ('both').
    "geometric": dict(
        kw=dict(server_optimizer="adamw", server_lr=0.05, weight_decay=0.01, batch_size=8,
                zeros="both"),
        ref=lambda model: dict(client_grad=mean_grad(model), aggregate=wgm_aggregate(),
                               batch_size=8, server="adamw", server_lr=0.05,
                               weight_decay=0.01)),
    "fishr_inter_geo": dict(
        kw=dict(fishr_lambda=LAM, fishr_reduction="mean", server_optimizer="sgd",
                server_lr=0.3, weight_decay=0.0, zeros="both"),
        ref=lambda model: dict(client_grad=mean_grad(model), aggregate=wgm_aggregate(),
                               fishr_lambda=LAM, server_lr=0.3)),
    "fishr_intra_geo": dict(
        kw=dict(fishr_lambda=LAM, fishr_reduction="mean", server_optimizer="sgd",
                server_lr=0.3, weight_decay=0.0, intra_chunk=16, intra_group_size=None,
                zeros="both"),
        ref=lambda model: dict(client_grad=per_example_wgm_grad(model),
                               aggregate=weighted_mean_aggregate, fishr_lambda=LAM,
                               server_lr=0.3)),
    "fishr_intra_arith": dict(
        kw=dict(fishr_lambda=LAM, fishr_reduction="mean", server_optimizer="sgd",
                server_lr=0.3, weight_decay=0.0),
        ref=lambda model: dict(client_grad=mean_grad(model),
                               aggregate=weighted_mean_aggregate, fishr_lambda=LAM,
                               server_lr=0.3)),
}
FEDCURV = dict(kw=dict(curv_lambda=5.0, client_lr=0.1, local_steps=2, batch_size=8,
                       server_optimizer="sgd", server_lr=1.0, weight_decay=0.0),
               ref=dict(lam=5.0, client_lr=0.1, local_steps=2, batch_size=8, server_lr=1.0))


@functools.lru_cache(maxsize=None)
def _engine(name, kw_items, strategy, data_key, rounds, cohort, seed=0):
  """Runs the engine (cached: several tests share one compiled run)."""
  data, model = _DATA[data_key]
  alg = make_algorithm(name, **dict(kw_items))
  rf = build_round(model, "binary", alg, data.num_clients, cohort, execution=strategy,
                   chunk_size=2)
  server, cs = init_state(alg, model.init(seed), data.num_clients)
  for _ in range(rounds):
    server, cs, metrics = rf(server, cs, data, jax.random.key(seed))
  return server, cs, metrics


_DATA = {}


def run_engine(name, kw, strategy, data_key="tiny", rounds=2, cohort=4):
  return _engine(name, tuple(sorted(kw.items())), strategy, data_key, rounds, cohort)


@pytest.fixture(scope="module", autouse=True)
def _register_data(tiny_binary):
  data, model = tiny_binary
  _DATA["tiny"] = (data, model)
  _DATA["pool4"] = (data.take(np.arange(4)), model)
  # Same clients, padded further with junk (padding must not matter).
  extra = 13
  junk = np.random.default_rng(1)
  x = np.asarray(data.x).copy()
  y = np.asarray(data.y).copy()
  mask = np.arange(x.shape[1])[None, :] >= np.asarray(data.n)[:, None]
  x[mask] = junk.normal(scale=50.0, size=x[mask].shape)
  y[mask] = 1
  x = np.concatenate([x, junk.normal(scale=50.0, size=(x.shape[0], extra, x.shape[2]))], 1)
  y = np.concatenate([y, np.ones((y.shape[0], extra), y.dtype)], 1)
  _DATA["tiny_junk_padded"] = (ClientData(x=jnp.asarray(x, jnp.float32), y=jnp.asarray(y),
                                          n=data.n), model)
  yield
  _engine.cache_clear()
  _REFS.clear()
  _JITTED.clear()


def _assert_trees_close(got, want, rtol=RTOL, atol=ATOL):
  # Structure (containers, keys, leaf count) and leaf shapes must match, not just the
  # leaves that a zip over the two leaf lists would reach.
  chex.assert_trees_all_close(got, want, rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------
# Reference equality
# ---------------------------------------------------------------------------------------


_REFS = {}


def case_reference(name):
  """The slow reference of ``CASES[name]`` (computed once, shared by the strategies)."""
  if name not in _REFS:
    data, model = _DATA["tiny"]
    _REFS[name] = reference_fedsgd_type(model, data, model.init(0), rounds=2, cohort=4,
                                        key=jax.random.key(0), **CASES[name]["ref"](model))
  return _REFS[name]


@pytest.mark.parametrize("strategy", ["vmap", "scan"])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.slow
def test_fedsgd_type_equals_python_loop(name, strategy):
  model = _DATA["tiny"][1]
  server, _, _ = run_engine(name, CASES[name]["kw"], strategy)
  _assert_trees_close(server.params, case_reference(name))
  assert max_abs_diff(server.params, model.init(0)) > 1e-3  # not a no-op round


def test_fishr_inter_geo_chunked_equals_python_loop():
  server, _, _ = run_engine("fishr_inter_geo", CASES["fishr_inter_geo"]["kw"], "chunked")
  _assert_trees_close(server.params, case_reference("fishr_inter_geo"))


def test_fishr_term_changes_the_update():
  """Guards the Fishr references: the λ term moves the result measurably."""
  data, model = _DATA["tiny"]
  with_fishr, _, _ = run_engine("fishr_intra_arith", CASES["fishr_intra_arith"]["kw"], "scan")
  without = reference_fedsgd_type(model, data, model.init(0), rounds=2, cohort=4,
                                  key=jax.random.key(0), client_grad=mean_grad(model),
                                  aggregate=weighted_mean_aggregate, server_lr=0.3)
  assert max_abs_diff(with_fishr.params, without) > 1e-3


def _estimator_inputs(model, kind, params):
  """A one-client Context at ``params`` and the default value-and-grad estimator of the
  task loss, as the engine hands them to a ``grad_estimator``."""
  ctx = Context(params=params, round=jnp.int32(0), extras={}, client={},
                num_clients=jnp.float32(1), cohort=jnp.float32(1))

  def vg(p, batch, key):
    return jax.value_and_grad(
        lambda q: losses.mean_loss(kind, model.apply(q, batch.x), batch.y, batch.w))(p)
  return ctx, Objective(vg, model, kind, task_only=False)


def test_intra_geo_groups_with_negative_zeros_equal_python_loop():
  """Mini-batch geometric mean (intra_groups=3 over a minibatch of 8) with FedILC code's
  zero convention, against the loop over groups (the engine case above uses per-example
  environments and the paper's 'both')."""
  data, model = _DATA["tiny"]
  params = model.init(0)
  ctx, vg = _estimator_inputs(model, "binary", params)

  comp = fedilc.intra_geo_component(3, zeros="negative")
  est = jax.jit(lambda p, b: comp.call("grad_estimator", objective=vg, params=p, batch=b,
                                        ctx=ctx, key=jax.random.key(0)))
  reference = group_wgm_grad(model, 3, "negative")
  for i, seed in ((0, 1), (3, 2)):
    bidx = np.random.default_rng(seed).integers(0, int(data.n[i]), 8)
    x, y = np.asarray(data.x[i])[bidx], np.asarray(data.y[i])[bidx]
    loss, got = est(params, Batch(x=x, y=y, w=jnp.ones(8)))
    _assert_trees_close(got, reference(params, x, y), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(float(loss), float(_mean_loss(model, params, x, y)), rtol=1e-5)


def fedcurv_reference(lam):
  if ("fedcurv", lam) not in _REFS:
    data, model = _DATA["pool4"]
    _REFS["fedcurv", lam] = reference_fedcurv(model, data, model.init(0), rounds=3,
                                              cohort=3, key=jax.random.key(0),
                                              **dict(FEDCURV["ref"], lam=lam))
  return _REFS["fedcurv", lam]


@pytest.mark.parametrize("strategy", ["vmap", "scan"])
@pytest.mark.slow
def test_fedcurv_shoham_equals_python_loop(strategy):
  server, cs, _ = run_engine("fedcurv_shoham", FEDCURV["kw"], strategy, "pool4", rounds=3,
                             cohort=3)
  want, stored = fedcurv_reference(FEDCURV["ref"]["lam"])
  _assert_trees_close(server.params, want)
  # Per-client state = the client's last contribution; never-sampled clients hold zeros.
  for i in range(4):
    f_i = jax.tree.map(lambda a: a[i], cs["fedcurv"]["f"])
    if i in stored:
      _assert_trees_close(f_i, stored[i][0], rtol=1e-3, atol=1e-6)
      ft = jax.tree.map(lambda a: a[i], cs["fedcurv"]["f_theta"])
      _assert_trees_close(ft, tmap(jnp.multiply, stored[i][0], stored[i][1]), 1e-3, 1e-6)
    else:
      assert all(float(jnp.max(jnp.abs(a))) == 0.0 for a in jax.tree.leaves(f_i))
  # The server sums are the sums over the pool of every client's latest contribution.
  for key in ("f", "f_theta", "f_theta2"):
    pool_sum = jax.tree.map(lambda a: jnp.sum(a, axis=0), cs["fedcurv"][key])
    _assert_trees_close(server.extras["fedcurv"][key], pool_sum, 1e-4, 1e-7)


def test_fedcurv_penalty_is_active():
  """λ > 0 changes training vs λ = 0 in the reference (so the comparison above tests it)."""
  with_pen, _ = fedcurv_reference(FEDCURV["ref"]["lam"])
  without, _ = fedcurv_reference(0.0)
  assert max_abs_diff(with_pen, without) > 1e-4


def test_fedcurv_penalty_closed_form():
  """Σ_{j≠i} F_j(θ − θ_j)² from the pool sums equals the direct sum over j."""
  rng = np.random.default_rng(3)
  shape = {"a": (3, 2), "b": (4,)}
  mk = lambda: {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shape.items()}  # noqa: E731
  fs = [tmap(jnp.abs, mk()) for _ in range(4)]
  ths = [mk() for _ in range(4)]
  theta = mk()
  contrib = [{"f": f, "f_theta": tmap(jnp.multiply, f, t),
              "f_theta2": tmap(lambda a, b: a * b * b, f, t)} for f, t in zip(fs, ths)]
  sums = tmap(lambda *a: sum(a), *contrib)
  for i in range(4):
    want = sum(float(jnp.sum(f[k] * (theta[k] - t[k]) ** 2))
               for j, (f, t) in enumerate(zip(fs, ths)) if j != i for k in shape)
    got = float(fedcurv.fedcurv_penalty(theta, sums, contrib[i]))
    np.testing.assert_allclose(got, want, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# The Fishr message protocol equals jax.grad of L_Fishr
# ---------------------------------------------------------------------------------------


def test_fishr_protocol_equals_jax_grad_of_penalty():
  data, model = _DATA["tiny"]
  params = model.init(0)
  comp = fedilc.fishr_component(1.0, "mean")  # Alg. 1's (1/E) scale, as _fishr_loss

  want_value, want_grad = jax.jit(jax.value_and_grad(
      lambda p: _fishr_loss(model, p, data.x, data.y, data.mask())))(params)
  key = jax.random.key(0)

  def ctx_with(state):
    return Context(params=params, round=jnp.int32(0), extras={"fishr": state}, client={},
                   num_clients=jnp.float32(5), cohort=jnp.float32(5))

  @jax.jit
  def protocol(p, x, y, n):
    """Clients send v_e (client weights n_e must not matter: uniform mean), the server
    stores v̄, clients send their VJPs, the server averages them."""
    def summed(agg, msg_fn):
      lifted = jax.vmap(lambda x, y, n: agg.lift(msg_fn(x, y, n), n.astype(jnp.float32)))(
          x, y, n)
      return agg.finalize(tmap(lambda a: jnp.sum(a, axis=0), lifted))

    ctx = ctx_with(comp.call("init_server", params=p))
    view = dict(model=model, kind="binary", params=p, key=key)
    mean = summed(comp.pre_aggregator, lambda x, y, n: comp.call(
        "pre_message", batch=full_batch(x, y, n), ctx=ctx, **view))
    state = comp.call("pre_update", state=ctx.extras["fishr"], aggregate=mean, ctx=ctx)
    ctx = ctx_with(state)
    return state, summed(comp.aggregator, lambda x, y, n: comp.call(
        "message", batch=full_batch(x, y, n), ctx=ctx, **view))

  state, got = protocol(params, data.x, data.y, data.n)
  ctx = ctx_with(state)
  np.testing.assert_allclose(float(state["penalty"]), float(want_value), rtol=1e-3)
  _assert_trees_close(got, want_grad, rtol=1e-4, atol=1e-7)
  # The featurizer receives a nonzero Fishr gradient (C_e depends on the features).
  feat_norm = sum(float(jnp.sum(a * a)) for a in jax.tree.leaves(got["featurizer"]))
  assert feat_norm > 1e-10
  # The server stage adds λ · mean VJP to the pseudo-gradient.
  pg = tmap(jnp.ones_like, params)
  out, _ = fedilc.fishr_component(2.5, "mean").call(
      "server_stage", pseudo_grad=pg, state=state, messages={"fishr": got}, ctx=ctx)
  _assert_trees_close(out, tmap(lambda g: 1.0 + 2.5 * g, got), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_fishr_lambda_zero_is_geometric_exactly():
  kw = dict(server_optimizer="adamw", server_lr=0.05, weight_decay=0.01, batch_size=8,
            zeros="both")
  geo, _, _ = run_engine("geometric", kw, "scan")
  fishr0, _, _ = run_engine("fishr_inter_geo", dict(kw, fishr_lambda=0.0), "scan")
  chex.assert_trees_all_equal(geo.params, fishr0.params)


# ---------------------------------------------------------------------------------------
# Intra-silo geometric mean: padding, chunking, per-example == groups of one
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_intra_geo_padding_and_chunk_invariance():
  """Junk in padded rows (and 13 more of them) and another chunk size change nothing."""
  kw = CASES["fishr_intra_geo"]["kw"]
  clean, _, _ = run_engine("fishr_intra_geo", kw, "scan")
  padded, _, _ = run_engine("fishr_intra_geo", dict(kw, intra_chunk=5), "scan",
                            "tiny_junk_padded")
  _assert_trees_close(padded.params, clean.params, rtol=1e-5, atol=1e-6)


def test_intra_geo_per_example_equals_groups_of_one():
  data, model = _DATA["tiny"]
  params = model.init(0)
  ctx, vg = _estimator_inputs(model, "binary", params)

  n = int(data.n[2])  # 20 real examples, padded to 50
  batch = Batch(x=data.x[2], y=data.y[2], w=jnp.asarray(data.mask()[2]))
  key = jax.random.key(0)

  @jax.jit
  def estimates(p, b):
    view = dict(objective=vg, params=p, batch=b, ctx=ctx, key=key)
    est = lambda groups, chunk=64: fedilc.intra_geo_component(groups, chunk).call(  # noqa: E731
        "grad_estimator", **view)
    negative = fedilc.intra_geo_component(None, 64, "negative").call("grad_estimator", **view)
    return est(None, 6), est(n, 6), est(n + 7), est(1), vg(p, b, key), negative

  per_ex, groups, more, one, plain, negative = estimates(params, batch)
  # The ReLU MLP's per-example gradients have exact zeros, so the conventions differ.
  assert max_abs_diff(per_ex[1], negative[1]) > 1e-6
  np.testing.assert_allclose(float(per_ex[0]), float(plain[0]), rtol=1e-5)
  np.testing.assert_allclose(float(groups[0]), float(per_ex[0]), rtol=1e-5)
  _assert_trees_close(groups[1], per_ex[1], rtol=1e-5, atol=1e-8)
  # More groups than examples: empty groups are not environments.
  _assert_trees_close(more[1], per_ex[1], rtol=1e-5, atol=1e-8)
  # One group = the plain mean gradient (a geometric mean of one value is that value).
  _assert_trees_close(one[1], plain[1], rtol=1e-5, atol=1e-8)


# ---------------------------------------------------------------------------------------
# Registry, hyperparameters, validation
# ---------------------------------------------------------------------------------------


def test_registered_with_hparams():
  reg = registry()
  for name in NAMES:
    assert name in reg and reg[name].paper
    alg = make_algorithm(name)
    hp = alg.hparams
    # FedILC's official server: torch.optim.Adam(lr, weight_decay) = coupled L2.
    assert hp["server_optimizer"] == "adam" and hp["server_lr"] == 3e-4
    assert hp["weight_decay"] == 0.01
  assert make_algorithm("fishr_inter_geo").hparams["fishr_lambda"] == 15.0
  assert make_algorithm("fishr_inter_geo").hparams["fishr_reduction"] == "sum"
  assert make_algorithm("fishr_intra_geo").hparams["intra_groups"] is None
  assert make_algorithm("fishr_intra_geo").hparams["intra_group_size"] == 32
  assert make_algorithm("fishr_intra_geo").hparams["zeros"] == "negative"
  assert make_algorithm("geometric").hparams["zeros"] == "negative"
  assert make_algorithm("fedcurv").components[0].name == "fishr"
  assert make_algorithm("geometric").local_steps == 1


def test_task_client_defaults_are_not_misrouted():
  """A task's client recipe (FedILC Color-MNIST: Adam 3e-4, wd 0.01) builds every method:
  FedSGD-type methods drop it (they fix the client), Shoham's FedCurv uses it for its
  clients and keeps ``weight_decay`` for the server."""
  from fedjax_inv.tasks import Task
  data, model = _DATA["tiny"]
  task = Task("t", "binary", data, {}, model, {},
              defaults=dict(rounds=3, local_steps=1, batch_size=None,
                            client_optimizer="adam", client_lr=3e-4, weight_decay=0.5))
  for name in NAMES:
    alg = make_algorithm(name, **task.algorithm_settings(name))
    assert alg.hparams["weight_decay"] == 0.01  # the server's default, not the task's
    want_client = "adam" if name == "fedcurv_shoham" else "sgd"
    assert alg.hparams["client_optimizer"] == want_client


@pytest.mark.parametrize("name,kw,match", [
    ("geometric", dict(server_lr=0.0), "server_lr"),
    ("geometric", dict(server_lr=float("nan")), "server_lr"),
    ("geometric", dict(weight_decay=-0.1), "weight_decay"),
    ("geometric", dict(server_optimizer="yogi"), "server_optimizer"),
    ("geometric", dict(zeros="positive"), "zeros"),
    ("geometric", dict(batch_size=0), "batch_size"),
    ("geometric", dict(batch_size=True), "batch_size"),
    ("geometric", dict(client_lr=0.1), "fixes"),
    ("fishr_inter_geo", dict(local_steps=3), "fixes"),
    ("fishr_inter_geo", dict(fishr_lambda=-1.0), "fishr_lambda"),
    ("fishr_inter_geo", dict(b2=1.0), "b2"),
    ("fishr_intra_geo", dict(intra_groups=0), "intra_groups"),
    ("fishr_intra_geo", dict(intra_groups=2.5), "intra_groups"),
    ("fishr_intra_geo", dict(intra_chunk=0), "intra_chunk"),
    ("fishr_intra_arith", dict(weighting="size"), "weighting"),
    ("fishr_intra_arith", dict(lambda_=1.0), "unknown"),
    ("fedcurv_shoham", dict(curv_lambda=-1.0), "curv_lambda"),
    ("fedcurv_shoham", dict(local_steps=0), "local_steps"),
    ("fedcurv_shoham", dict(client_lr=0.0), "client_lr"),
    ("fedcurv_shoham", dict(client_optimizer="rmsprop"), "client_optimizer"),
    ("fedcurv_shoham", dict(fisher_chunk=0), "fisher_chunk"),
    ("fedcurv", dict(curv_lambda=1.0), "unknown"),
    ("fedcurv", dict(local_steps=2), "fixes"),
    ("fedcurv", dict(fishr_reduction="avg"), "fishr_reduction"),
    ("fishr_intra_geo", dict(intra_group_size=0), "intra_group_size"),
    ("fishr_intra_geo", dict(intra_shuffle=1), "intra_shuffle"),
])
def test_bad_hyperparameters_raise(name, kw, match):
  with pytest.raises(ValueError, match=match):
    make_algorithm(name, **kw)


def test_server_optimizers_closed_form():
  """One server step on pseudo-gradient g at w: 'sgd' = −η(g + wd·w); 'adam' (coupled
  L2) and 'adamw' (decoupled) first steps from bias-corrected moments m̂ = g', v̂ = g'²."""
  w = {"a": jnp.asarray([0.5, -2.0, 1.0])}
  g = {"a": jnp.asarray([0.1, 0.3, -0.02])}
  lr, wd, eps = 0.1, 0.05, 1e-8
  gc = g["a"] + wd * w["a"]
  want = {
      "sgd": -lr * gc,
      "adam": -lr * gc / (jnp.abs(gc) + eps),
      "adamw": -lr * (g["a"] / (jnp.abs(g["a"]) + eps) + wd * w["a"]),
  }
  for name, expected in want.items():
    opt = fedsgd_type.server_optimizer(name, lr, wd, eps=eps)
    upd, _ = opt.update(g, opt.init(w), w)
    np.testing.assert_allclose(np.asarray(upd["a"]), np.asarray(expected), rtol=1e-5)


def test_fishr_rejects_regression_before_running():
  """Fishr's C_e needs class likelihoods; the error names the kind."""
  model = _DATA["tiny"][1]
  with pytest.raises(ValueError, match="regression"):
    fishr.client_grad_variance(model, "regression", model.init(0),
                               full_batch(jnp.zeros((3, 6)), jnp.zeros((3,)), jnp.int32(3)))


@pytest.mark.parametrize("kind,outputs", [("binary", 1), ("multiclass", 4)])
@pytest.mark.parametrize("zeros", ["both", "negative"])
@pytest.mark.slow
def test_intra_geo_dense_closed_form_equals_per_example_path(kind, outputs, zeros):
  """models.mlp has a DenseChain: with model/kind passed (task-only objective) the
  per-example weighted geometric mean comes from matmuls of layer inputs and
  pre-activation gradients; it must equal the vmapped per-example gradients, padded
  examples (weight 0, garbage inputs) excluded."""
  model = models.mlp(12, (6, 5), outputs)
  params = model.init(0)
  b = 20
  x = jax.random.normal(jax.random.key(1), (b, 12)).at[15:].set(99.0)
  hi = 2 if kind == "binary" else outputs
  y = jax.random.randint(jax.random.key(2), (b,), 0, hi)
  y = y.astype(jnp.float32) if kind == "binary" else y
  batch = Batch(x=x, y=y, w=(jnp.arange(b) < 15).astype(jnp.float32))
  ctx, vg = _estimator_inputs(model, kind, params)

  comp = fedilc.intra_geo_component(None, 8, zeros)
  key = jax.random.key(0)
  loss_ref, ref = jax.jit(lambda p: comp.call("grad_estimator", objective=vg, params=p,
                                               batch=batch, key=key))(params)
  loss, got = jax.jit(lambda p: comp.call("grad_estimator", objective=vg._replace(
      task_only=True), params=p, batch=batch, key=key))(params)
  np.testing.assert_allclose(float(loss), float(loss_ref), rtol=1e-6)
  _assert_trees_close(got, ref, rtol=2e-5, atol=1e-7)
  assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(got))


def test_outer_product_geo_stats_rejects_bad_shapes():
  with pytest.raises(ValueError, match="expected"):
    aggs.outer_product_geo_stats(jnp.ones((4, 3)), jnp.ones((5, 2)), jnp.ones(4))
  with pytest.raises(ValueError, match="zeros"):
    aggs.outer_product_geo_stats(jnp.ones((4, 3)), jnp.ones((4, 2)), jnp.ones(4), "x")
