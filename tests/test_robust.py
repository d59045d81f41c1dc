"""Issue 26: robust aggregators against independent references (numpy, scipy, Python
loops, a brute-force minimizer), attacks / dropout / stragglers / availability against the
slow per-client loop of tests/reference.py, FedNova, and bit-identity without them."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from fedjax_inv import robust
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core.adversary import Attack, Participation
from fedjax_inv.core.engine import build_round, init_state
from tests.reference import reference_run, round_keys
from tests.rounds import run_rounds

# ---------------------------------------------------------------------------------------
# The aggregators on a stack of updates (two leaves; absent clients have weight 0)
# ---------------------------------------------------------------------------------------


def _stack(c=9, seed=0, absent=(2, 6)):
  rng = np.random.default_rng(seed)
  msgs = {"a": rng.normal(size=(c, 3, 2)).astype(np.float32),
          "b": rng.normal(size=(c, 4)).astype(np.float32)}
  msgs["a"][1] += 25.0  # an outlier
  w = rng.uniform(1, 3, size=c).astype(np.float32)
  w[list(absent)] = 0.0
  x = np.concatenate([msgs["a"].reshape(c, -1), msgs["b"]], axis=1)
  return msgs, w, x[w > 0], w[w > 0]


def _run(agg, msgs, w, **kw):
  out = agg.finalize((jax.tree.map(jnp.asarray, msgs), jnp.asarray(w)), **kw)
  return np.concatenate([np.asarray(out["a"]).ravel(), np.asarray(out["b"])])


def test_median_is_numpy_median():
  msgs, w, xp, _ = _stack()
  np.testing.assert_allclose(_run(robust.median(), msgs, w), np.median(xp, axis=0),
                             rtol=1e-6, atol=1e-6)
  msgs, w, xp, _ = _stack(c=8, absent=(3,))  # an odd count of present clients
  np.testing.assert_allclose(_run(robust.median(), msgs, w), np.median(xp, axis=0),
                             rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.2, 0.34])
def test_trimmed_mean_is_scipy_trim_mean(beta):
  msgs, w, xp, _ = _stack()
  np.testing.assert_allclose(_run(robust.trimmed_mean(beta), msgs, w),
                             scipy.stats.trim_mean(xp, beta, axis=0), rtol=1e-5, atol=1e-5)


def _krum_loop(xp, f, m):
  n = len(xp)
  scores = []
  for i in range(n):
    d = sorted(float(np.sum((xp[i] - xp[j]) ** 2)) for j in range(n) if j != i)
    scores.append(sum(d[:max(n - f - 2, 1)]))
  best = sorted(range(n), key=lambda i: scores[i])[:m]
  return np.mean(xp[best], axis=0)


@pytest.mark.parametrize("f,m", [(1, 1), (2, 1), (1, 3), (2, 4)])
def test_krum_and_multi_krum_are_the_python_loop(f, m):
  msgs, w, xp, _ = _stack()
  np.testing.assert_allclose(_run(robust.krum(f, m), msgs, w), _krum_loop(xp, f, m),
                             rtol=1e-5, atol=1e-5)


def test_geometric_median_minimizes_the_summed_distances():
  msgs, w, xp, wp = _stack()
  got = _run(robust.geometric_median(iters=200, nu=1e-8), msgs, w)
  xp, wp = xp.astype(np.float64), wp.astype(np.float64)
  cost = lambda z: float(np.sum(wp * np.linalg.norm(xp - z, axis=1)))  # noqa: E731

  def grad(z):
    d = np.linalg.norm(xp - z, axis=1)
    return -np.sum((wp / d)[:, None] * (xp - z), axis=0)
  best = min((scipy.optimize.minimize(cost, z0, jac=grad, method="BFGS",
                                      options=dict(gtol=1e-10, maxiter=10000))
              for z0 in (np.median(xp, 0), xp.mean(0), xp[0] + 0.1)), key=lambda r: r.fun)
  assert cost(got) <= best.fun * (1 + 1e-6)
  np.testing.assert_allclose(got, best.x, atol=2e-3)
  assert np.linalg.norm(got - np.median(xp, 0)) < np.linalg.norm(xp.mean(0) - np.median(xp, 0))


@pytest.mark.parametrize("tau,iters", [(0.5, 1), (2.0, 3)])
def test_centered_clipping_is_its_formula(tau, iters):
  msgs, w, xp, _ = _stack()
  v = np.zeros(xp.shape[1])
  for _ in range(iters):
    diff = xp - v
    scale = np.minimum(1.0, tau / np.linalg.norm(diff, axis=1))
    v = v + np.mean(diff * scale[:, None], axis=0)
  np.testing.assert_allclose(_run(robust.centered_clip(tau, iters), msgs, w), v,
                             rtol=1e-5, atol=1e-5)


def test_bucketing_averages_shuffled_buckets_then_aggregates():
  msgs, w, _, _ = _stack()
  key = jax.random.key(7)
  got = _run(robust.bucketing(robust.median(), 2), msgs, w, key=key)
  # the documented shuffle: present clients first, in the order of a uniform draw
  c = len(w)
  u = np.asarray(jax.random.uniform(jax.random.fold_in(key, 0xB0C), (c,)))
  order = [i for i in sorted(range(c), key=lambda i: u[i]) if w[i] > 0]
  x = np.concatenate([msgs["a"].reshape(c, -1), msgs["b"]], axis=1)
  means = [x[order[j:j + 2]].mean(0) for j in range(0, len(order), 2)]
  np.testing.assert_allclose(got, np.median(np.stack(means), axis=0), rtol=1e-5, atol=1e-5)
  # s = 1 leaves the inner aggregator as it is
  np.testing.assert_allclose(_run(robust.bucketing(robust.median(), 1), msgs, w, key=key),
                             _run(robust.median(), msgs, w), rtol=1e-6)


# ---------------------------------------------------------------------------------------
# In the engine: every strategy, attacks and participation against the Python loop
# ---------------------------------------------------------------------------------------

def _multiclass_pool():
  from fedjax_inv import models
  from fedjax_inv.core.data import from_client_arrays
  rng = np.random.default_rng(1)
  xs, ys = [], []
  for i, n in enumerate((14, 20, 9, 17, 25, 12, 18, 11)):
    x = rng.normal(size=(n, 5)).astype(np.float32) + 0.2 * i
    xs.append(x)
    ys.append(((x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5)).astype(np.int32))
  return from_client_arrays(xs, ys), models.mlp(5, (6,), 3)


def _engine(alg, data, model, strategy="scan", rounds=2, cohort=6):
  return run_rounds(alg, data, model, strategy, rounds, cohort)[0]


BASE = dict(client_lr=0.2, local_steps=3, batch_size=4)
REF = dict(client_lr=0.2, local_steps=3, batch_size=4)


def _reference(data, model, rounds=2, cohort=6, **hooks):
  return reference_run(model, "multiclass", data, model.init(0), rounds=rounds,
                       cohort=cohort, key=jax.random.key(0), **REF, **hooks)


def _attackers(n, fraction):  # the documented draw from the run's key
  perm = np.asarray(jax.random.permutation(jax.random.fold_in(jax.random.key(0), 0xA77AC), n))
  return set(perm[:int(np.floor(fraction * n))].tolist())


def _server_key(rnd):
  k = jax.random.key(0)
  return jax.random.fold_in(jax.random.fold_in(k, rnd), 0x5E4FE4)


def _update_attack(name, bad, cohort):
  """The attacks' formulas, applied client by client (Python lists of pytrees)."""
  def hook(rnd, idx, deltas):
    flat = [np.concatenate([np.asarray(l).ravel() for l in jax.tree.leaves(d)]) for d in deltas]
    leaves0, tree = jax.tree.flatten(deltas[0])
    X = np.stack(flat)
    is_bad = np.array([int(i) in bad for i in idx])
    if name == "sign_flip":
      Y = np.where(is_bad[:, None], -X, X)
    elif name == "scale":
      Y = np.where(is_bad[:, None], cohort * X, X)
    elif name == "gaussian":
      noise = np.asarray(jax.random.normal(jax.random.fold_in(_server_key(rnd), 0x6A55),
                                           X.shape))
      Y = np.where(is_bad[:, None], noise, X)
    elif name == "alie":
      n, f = len(X), int(is_bad.sum())
      s = np.floor(n / 2 + 1) - f
      z = scipy.stats.norm.ppf((n - s) / n)
      Y = np.where(is_bad[:, None], X.mean(0) - z * X.std(0), X)
    else:  # ipm
      Y = np.where(is_bad[:, None], -0.1 * X[~is_bad].mean(0), X)
    out = []
    for row in Y:
      parts, off = [], 0
      for l in leaves0:
        parts.append(jnp.asarray(row[off:off + l.size].reshape(l.shape), jnp.float32))
        off += l.size
      out.append(jax.tree.unflatten(tree, parts))
    return out
  return hook


@pytest.mark.parametrize("name", [  # two in the fast tier, all in the slow one
    "sign_flip", "label_flip", *(pytest.param(n, marks=pytest.mark.slow)
                                 for n in ("scale", "gaussian", "alie", "ipm"))])
def test_attack_equals_the_python_loop(name):
  data, model = _multiclass_pool()
  alg = robust.configure(make_algorithm("fedavg", **BASE), attack=Attack(name, 0.25),
                         cohort=6, num_classes=3)
  got = _engine(alg, data, model)
  bad = _attackers(data.num_clients, 0.25)
  if name == "label_flip":
    want = _reference(data, model, labels=lambda i, y: np.where(i in bad, 2 - y, y))
  else:
    want = _reference(data, model, updates=_update_attack(name, bad, 6))
  chex.assert_trees_all_close(got, want, rtol=2e-4, atol=2e-5)


def _dropped(p):
  def keep(rnd, idx, ckeys):
    k_sample, _ = jax.random.split(jax.random.fold_in(jax.random.key(0), rnd))
    gone = np.asarray(jax.random.uniform(jax.random.fold_in(k_sample, 0xD209),
                                         (len(idx),)) < p)
    return [j for j in range(len(idx)) if not gone[j]]
  return keep


def _straggler(p, mode):
  def draw(ck):
    k1, k2 = jax.random.split(jax.random.fold_in(ck, 0x57A6))
    return bool(jax.random.uniform(k1) < p), k2
  if mode == "drop":
    def keep(rnd, idx, ckeys):
      return [j for j, ck in enumerate(ckeys) if not draw(ck)[0]]
    return dict(clients=keep)

  def steps(ck, k):
    slow, k2 = draw(ck)
    return int(jax.random.randint(k2, (), 1, max(k, 2))) if slow else k
  return dict(steps=steps)


@pytest.mark.parametrize("case", ["dropout", "stragglers_keep", "stragglers_drop"])
@pytest.mark.parametrize("strategy", ["scan", pytest.param("vmap", marks=pytest.mark.slow)])
def test_participation_equals_the_python_loop(case, strategy):
  data, model = _multiclass_pool()
  part, hooks = {
      "dropout": (Participation(dropout=0.4), dict(clients=_dropped(0.4))),
      "stragglers_keep": (Participation(stragglers=0.5), _straggler(0.5, "keep")),
      "stragglers_drop": (Participation(stragglers=0.5, straggler_mode="drop"),
                          _straggler(0.5, "drop")),
  }[case]
  alg = robust.configure(make_algorithm("fedavg", **BASE), participation=part, cohort=6)
  chex.assert_trees_all_close(_engine(alg, data, model, strategy), _reference(
      data, model, **hooks), rtol=2e-4, atol=2e-5)


def test_availability_draws_the_cohort_from_online_clients():
  data, model = _multiclass_pool()
  alg = robust.configure(make_algorithm("fedavg", **BASE),
                         participation=Participation(availability=0.5), cohort=6)
  rf = build_round(model, "multiclass", alg, data.num_clients, 6, execution="scan")
  server, cs = init_state(alg, model.init(0), data.num_clients)
  sizes = []
  for r in range(6):
    server, cs, m = rf(server, cs, data, jax.random.key(r))
    idx = np.asarray(m["clients"])
    real = idx[idx < data.num_clients]
    assert len(set(real.tolist())) == len(real) and int(m["cohort_size"]) == len(real)
    sizes.append(len(real))
  assert min(sizes) < 6  # with half the pool offline the cohort is sometimes short


@pytest.mark.parametrize("agg", ["median", *(pytest.param(a, marks=pytest.mark.slow) for a in (
    "trimmed_mean:beta=0.2", "krum:f=1", "geomed", "centered_clip:tau=0.5"))])
def test_robust_aggregator_in_the_engine_equals_the_loop(agg):
  data, model = _multiclass_pool()
  alg = make_algorithm("fedavg", aggregator=agg, **BASE)

  def aggregate(deltas, weights):
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *deltas)
    return alg.aggregator.finalize((stacked, jnp.asarray(weights, jnp.float32)))
  got = {s: _engine(alg, data, model, s) for s in ("scan", "vmap", "chunked")}
  # the engine's gather path against the loop + the (separately tested) finalize
  chex.assert_trees_all_close(got["scan"], _reference(data, model, aggregate=aggregate),
                              rtol=2e-4, atol=2e-5)
  chex.assert_trees_all_close(got["vmap"], got["scan"], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(got["chunked"], got["scan"], rtol=1e-5, atol=1e-6)


def test_nothing_set_is_bit_identical_and_a_zero_attack_is_the_mean():
  data, model = _multiclass_pool()
  plain = make_algorithm("fedavg", **BASE)
  same = robust.configure(plain, participation=Participation(), cohort=6)
  assert same.participation is None and same.attack is None
  chex.assert_trees_all_equal(_engine(same, data, model), _engine(plain, data, model))
  zero = robust.configure(plain, attack=Attack("sign_flip", 0.0), cohort=6)
  chex.assert_trees_all_close(_engine(zero, data, model), _engine(plain, data, model),
                              rtol=1e-5, atol=1e-6)


def test_fednova_equals_fedavg_with_equal_steps_and_normalizes_unequal_ones():
  data, model = _multiclass_pool()
  chex.assert_trees_all_close(_engine(make_algorithm("fednova", **BASE), data, model),
                              _engine(make_algorithm("fedavg", **BASE), data, model),
                              rtol=1e-5, atol=1e-6)
  # unequal steps (1 epoch of batch 4 over sizes 9..25): the reference formula
  kw = dict(client_lr=0.2, local_epochs=1, batch_size=4)
  got = _engine(make_algorithm("fednova", **kw), data, model, rounds=1)

  def aggregate(deltas, weights):
    idx, _ = round_keys(jax.random.key(0), 0, data.num_clients, 6)
    taus = [-(-int(data.n[i]) // 4) for i in idx]
    p = np.asarray(weights) / np.sum(weights)
    tau_eff = float(np.dot(p, taus))
    return jax.tree.map(lambda *ds: tau_eff * sum(pi * d / t for pi, d, t in zip(p, ds, taus)),
                        *deltas)
  want = reference_run(model, "multiclass", data, model.init(0), rounds=1, cohort=6,
                       key=jax.random.key(0), client_lr=0.2, local_steps=None,
                       local_epochs=1, batch_size=4, aggregate=aggregate)
  chex.assert_trees_all_close(got, want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("call,match", [
    (lambda: Attack("sign_flip", 1.0).check(), r"--attack-fraction 1.0"),
    (lambda: Attack("sign_flip", -0.1).check(), r"--attack-fraction -0.1"),
    (lambda: Attack("backdoor", 0.1).check(), r"unknown attack"),
    (lambda: Participation(dropout=1.0).check(), r"--dropout 1.0"),
    (lambda: Participation(availability=0.0).check(), r"--availability 0.0"),
    (lambda: Participation(straggler_mode="slow").check(), r"--straggler-mode 'slow'"),
    (lambda: robust.configure(make_algorithm("fedavg", aggregator="krum:f=2"), cohort=6),
     r"Krum tolerating f=2 needs more than 2f\+2 = 6 inputs, got 6"),
    (lambda: robust.configure(make_algorithm("fedavg"), bucket=2, cohort=6),
     r"bucketing wraps a robust"),
    (lambda: make_algorithm("fedavg", aggregator="median:beta=1"), r"median takes no"),
    (lambda: make_algorithm("fedavg", aggregator="trimmed_mean:beta=0.5"), r"beta=0.5"),
    (lambda: make_algorithm("fedavg", aggregator="medain"), r"aggregator='medain'"),
    (lambda: make_algorithm("fedavg", aggregator="krum:f=2.5"), r"f='2.5' must be an integer"),
    (lambda: make_algorithm("fedavg", aggregator="geomed:nu=x"), r"nu='x' is not a number"),
])
def test_bad_settings_are_named(call, match):
  with pytest.raises(ValueError, match=match):
    call()
