"""Issue 26: robust aggregators against independent references (numpy, scipy, Python
loops, a brute-force minimizer), attacks / dropout / stragglers / availability against the
slow per-client loop of tests/reference.py, FedNova, and bit-identity without them."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
import scipy.stats

from fedjax_inv.aggregation import robust
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core import adversary
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


# ---------------------------------------------------------------------------------------
# The pieces, one by one (mutation tests): edge counts of present clients, unit weights,
# the defaults, the checks at their bounds, FedNova's formula, the attacks' formulas
# ---------------------------------------------------------------------------------------


def _unit_stack(present, seed=3, scale=1.0):
  """A stack of 6 clients (two leaves) with weights 1.0 / 0.5 for the present ones and 0
  for the others, whose updates hold NaN (an absent client adds nothing)."""
  rng = np.random.default_rng(seed)
  c = 6
  msgs = {"a": (rng.normal(size=(c, 2, 2)) * scale).astype(np.float32),
          "b": (rng.normal(size=(c, 3)) * scale).astype(np.float32)}
  w = np.zeros(c, np.float32)
  w[list(present)] = [1.0 if i % 2 == 0 else 0.5 for i in range(len(present))]
  x = np.concatenate([msgs["a"].reshape(c, -1), msgs["b"]], axis=1)
  xp = x[list(present)]
  for leaf in msgs.values():
    leaf[w == 0] = np.nan
  return msgs, w, xp


def test_robust_aggregators_are_named_and_gathered():
  aggs = {"median": robust.median(), "trimmed_mean(0.1)": robust.trimmed_mean(),
          "krum(f=1)": robust.krum(), "multi_krum(f=2,m=3)": robust.krum(2, 3),
          "geomed": robust.geometric_median(), "centered_clip(1)": robust.centered_clip(),
          "bucketing(3)+median": robust.bucketing(robust.median(), 3)}
  for name, agg in aggs.items():
    assert agg.name == name and agg.gather is True, name
  assert aggs["krum(f=1)"].finalize.krum_f == 1 and aggs["multi_krum(f=2,m=3)"].finalize.krum_f == 2
  b = aggs["bucketing(3)+median"].finalize
  assert b.needs_key is True and b.bucket == 3 and b.inner.name == "median"


def _few_present_want(name, xp, wp):
  """The reference of each aggregator over the present rows ``xp`` (weights ``wp``)."""
  if name == "median":
    return np.median(xp, axis=0)
  if name == "trimmed":
    return scipy.stats.trim_mean(xp, 0.34, axis=0)
  if name == "cclip":  # tau large: one step is the mean
    return xp.mean(0)
  if name == "geomed":
    return _weiszfeld(xp, wp, 100, 1e-9)
  m = 1 if name == "krum" else 2
  return xp[0] if len(xp) == 1 else _krum_loop(xp, 1, m)  # a client alone is its own


@pytest.mark.parametrize("name", ["median", "trimmed", "krum", "multi_krum", "geomed",
                                  "cclip"])
def test_few_present_clients_with_unit_weights(name):
  """One to four present clients (weights 1 and 0.5, NaN in the absent ones) and none."""
  agg = {"median": robust.median, "trimmed": lambda: robust.trimmed_mean(0.34),
         "krum": lambda: robust.krum(1, 1), "multi_krum": lambda: robust.krum(1, 2),
         "geomed": lambda: robust.geometric_median(iters=100, nu=1e-9),
         "cclip": lambda: robust.centered_clip(100.0, 1)}[name]()
  for present in [(), (4,), (1, 4), (0, 2, 5), (0, 1, 2, 4)]:
    msgs, w, xp = _unit_stack(present)
    got = _run(agg, msgs, w)
    if not present:
      np.testing.assert_array_equal(got, np.zeros(7))
    else:
      tol = dict(geomed=dict(rtol=1e-4, atol=1e-5), median=dict(rtol=1e-6, atol=1e-6)).get(
          name, dict(rtol=1e-5, atol=1e-6))
      np.testing.assert_allclose(got, _few_present_want(name, xp, w[w > 0]),
                                 err_msg=str(present), **tol)


@pytest.mark.parametrize("present", [(0, 1, 3, 4, 5), (1, 4), (2,)])
def test_krum_scores_on_close_points_are_the_python_loop(present):
  """Squared distances below 1 (a floor at 1 would show), k - f - 2 <= 1, two clients (one
  neighbour each) and a client alone (no neighbour: score 0)."""
  msgs, w, xp = _unit_stack(present, seed=4, scale=0.05)
  x = np.concatenate([np.nan_to_num(msgs["a"]).reshape(6, -1), np.nan_to_num(msgs["b"])], 1)
  for f in (0, 1, 2):
    got = np.asarray(robust.krum_scores(jnp.asarray(x), jnp.asarray(w > 0), f))
    n = len(xp)
    for row, i in enumerate(present):
      d = sorted(float(np.sum((xp[row] - xp[j]) ** 2)) for j in range(n) if j != row)
      assert got[i] == pytest.approx(sum(d[:max(n - f - 2, 1)]), rel=1e-4), (f, i)
    assert np.all(np.isinf(got[w == 0]))
    if n == 1:
      continue
    for m in (1, 2):
      np.testing.assert_allclose(_run(robust.krum(f, m), msgs, w), _krum_loop(xp, f, m),
                                 rtol=1e-5, atol=1e-7)


def _weiszfeld(xp, a, iters, nu):
  """RFA's smoothed Weiszfeld (Pillutla et al. 2022, Alg. 3) in float64, from the
  weighted mean."""
  xp, a = xp.astype(np.float64), a.astype(np.float64)
  z = a @ xp / a.sum()
  for _ in range(iters):
    beta = a / np.maximum(np.linalg.norm(xp - z, axis=1), nu)
    z = beta @ xp / beta.sum()
  return z


def test_geometric_median_defaults_and_few_steps_are_weiszfeld():
  msgs, w, xp, wp = _stack()
  np.testing.assert_allclose(_run(robust.geometric_median(), msgs, w),
                             _weiszfeld(xp, wp, 8, 1e-6), rtol=1e-4, atol=1e-5)
  for iters in (1, 2):
    np.testing.assert_allclose(_run(robust.geometric_median(iters=iters), msgs, w),
                               _weiszfeld(xp, wp, iters, 1e-6), rtol=1e-4, atol=1e-5)
  # the smoothing nu decides where z stops next to ten clients at 0 (one more at e_1)
  pts = np.zeros((11, 7), np.float32)
  pts[10, 0] = 1.0
  stack = {"a": pts[:, :4].reshape(11, 2, 2), "b": pts[:, 4:]}
  ones = np.ones(11, np.float32)
  want = _weiszfeld(pts, ones, 8, 1e-6)
  assert 5e-8 < want[0] < 5e-7
  np.testing.assert_allclose(_run(robust.geometric_median(), stack, ones), want, rtol=1e-3,
                             atol=1e-12)


def test_centered_clip_and_trimmed_mean_defaults():
  msgs, w, xp, _ = _stack()
  diff = xp.astype(np.float64)
  v = np.mean(diff * np.minimum(1.0, 1.0 / np.linalg.norm(diff, axis=1))[:, None], axis=0)
  np.testing.assert_allclose(_run(robust.centered_clip(), msgs, w), v, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(_run(robust.trimmed_mean(), msgs, w),
                             scipy.stats.trim_mean(xp, 0.1, axis=0), rtol=1e-5, atol=1e-6)


def test_constructor_checks_at_their_bounds():
  from types import SimpleNamespace
  for ok in (lambda: robust.trimmed_mean(0.0), lambda: robust.krum(0, 1),
             lambda: robust.geometric_median(iters=1, nu=1e-12),
             lambda: robust.centered_clip(1e-6, 1), lambda: robust.bucketing(robust.median(), 1),
             lambda: robust.bucketing(robust.bucketing(robust.median(), 2), 2)):
    ok()
  for bad, match in [
      (lambda: robust.trimmed_mean(False), "beta=False"),
      (lambda: robust.krum(f=True), "krum f=True"), (lambda: robust.krum(m=True), "krum m=True"),
      (lambda: robust.krum(m=0), "krum m=0"), (lambda: robust.krum(f=-1), "krum f=-1"),
      (lambda: robust.geometric_median(iters=True), "iters=True"),
      (lambda: robust.geometric_median(iters=0), "iters=0"),
      (lambda: robust.geometric_median(nu=0.0), "nu=0.0"),
      (lambda: robust.centered_clip(0.0), "tau=0.0"),
      (lambda: robust.centered_clip(math.inf), "tau=inf"),
      (lambda: robust.centered_clip(iters=True), "iters=True"),
      (lambda: robust.bucketing(robust.median(), True), "s=True"),
      (lambda: robust.bucketing(robust.median(), 0), "s=0"),
      (lambda: robust.bucketing(SimpleNamespace(lift=None, finalize=None, name="dup"), 2),
       "'dup' is not one")]:
    with pytest.raises(ValueError, match=match):
      bad()


def _bucket_means(key, s, rows, weights):
  """The documented shuffle (present clients first, in the order of a uniform draw), then
  the means of consecutive groups of s."""
  u = np.asarray(jax.random.uniform(jax.random.fold_in(key, 0xB0C), (len(weights),)))
  order = [i for i in sorted(range(len(weights)), key=lambda i: u[i]) if weights[i] > 0]
  return np.stack([rows[order[j:j + s]].mean(0) for j in range(0, len(order), s)])


def _bucket_stack():
  msgs, w, _ = _unit_stack((0, 1, 3, 4, 5))
  x = np.concatenate([msgs["a"].reshape(len(w), -1), msgs["b"]], axis=1)
  return msgs, w, x


def test_bucketing_with_unit_weights_and_the_default_key():
  msgs, w, x = _bucket_stack()
  got = _run(robust.bucketing(robust.median(), 2), msgs, w)  # no key: key(0)
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, np.median(_bucket_means(jax.random.key(0), 2, x, w), axis=0),
                             rtol=1e-5, atol=1e-6)


def test_bucketing_nested_and_around_any_gathered_aggregator():
  msgs, w, x = _bucket_stack()
  # nested: the inner bucketing gets the same key (key(0) would give another answer here)
  key = jax.random.key(1)
  got = _run(robust.bucketing(robust.bucketing(robust.median(), 2), 2), msgs, w, key=key)
  inner = _bucket_means(key, 2, x, w)
  want = np.median(_bucket_means(key, 2, inner, np.ones(len(inner))), axis=0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  other = np.median(_bucket_means(jax.random.key(0), 2, inner, np.ones(len(inner))), axis=0)
  assert np.max(np.abs(other - want)) > 1e-2
  # any gathered aggregator, also one whose finalize takes no key
  from fedjax_inv.core.aggregator import Aggregator

  def present_mean(stacked):
    messages, weights = stacked
    keep = (weights > 0).astype(jnp.float32)
    return jax.tree.map(lambda v: jnp.tensordot(keep, v, axes=1) / jnp.sum(keep), messages)
  plain = Aggregator(lambda m, wt: (m, wt), present_mean, "present_mean", gather=True)
  got = _run(robust.bucketing(plain, 2), msgs, w, key=key)
  np.testing.assert_allclose(got, _bucket_means(key, 2, x, w).mean(0), rtol=1e-5, atol=1e-6)


def test_check_cohort_is_strict_and_counts_buckets():
  robust.check_cohort(robust.krum(1), 5)  # 5 > 2f + 2 = 4
  robust.check_cohort(robust.krum(2), 7)
  robust.check_cohort(robust.median(), 1)
  robust.check_cohort(robust.bucketing(robust.median(), 2), 1)
  robust.check_cohort(robust.bucketing(robust.krum(1), 2), 9)  # 5 buckets
  with pytest.raises(ValueError,
                     match=r"needs more than 2f\+2 = 4 inputs, got 4 clients per round"):
    robust.check_cohort(robust.krum(1), 4)
  with pytest.raises(ValueError, match=r"got 4 buckets \(of 2 clients\)"):
    robust.check_cohort(robust.bucketing(robust.krum(1), 2), 7)


def test_fednova_lift_and_finalize_are_the_formula():
  from types import SimpleNamespace
  agg = robust.fednova(4)
  assert agg.name == "fednova" and agg.lift.reads_context is True and not agg.gather
  m = {"a": jnp.asarray([2.0, -6.0]), "b": jnp.asarray(8.0)}
  for ctx, tau in ((None, 4.0), (SimpleNamespace(local_steps=None), 4.0),
                   (SimpleNamespace(local_steps=jnp.int32(2)), 2.0)):
    for weight in (1.0, 0.5):
      scaled, wt, wtau = agg.lift(m, jnp.float32(weight), ctx=ctx)
      np.testing.assert_allclose(_flat_tree(scaled), weight * np.array([2.0, -6.0, 8.0]) / tau)
      assert float(wt) == weight and float(wtau) == weight * tau
  nan = jax.tree.map(lambda v: jnp.full_like(v, jnp.nan), m)
  scaled, wt, wtau = agg.lift(nan, jnp.float32(0.0))
  assert np.all(_flat_tree(scaled) == 0) and float(wt) == 0 and float(wtau) == 0

  def run(deltas, weights, taus):
    stats = [agg.lift(d, jnp.float32(wi), ctx=SimpleNamespace(local_steps=jnp.int32(t)))
             for d, wi, t in zip(deltas, weights, taus)]
    total = jax.tree.map(lambda *s: sum(s), *stats)
    return _flat_tree(agg.finalize(total))
  d1, d2 = {"a": jnp.asarray([1.0, 2.0]), "b": jnp.asarray(3.0)}, \
      {"a": jnp.asarray([-4.0, 0.5]), "b": jnp.asarray(1.0)}
  weights, taus = (0.25, 0.5), (2, 4)  # the weights sum below 1
  p = np.array(weights) / sum(weights)
  want = float(np.dot(p, taus)) * sum(pi * _flat_tree(d) / t for pi, d, t in zip(p, (d1, d2), taus))
  np.testing.assert_allclose(run((d1, d2), weights, taus), want, rtol=1e-6)
  np.testing.assert_allclose(run((d1,), (1.0,), (3,)), _flat_tree(d1), rtol=1e-6)  # alone
  np.testing.assert_array_equal(run((d1, d2), (0.0, 0.0), (2, 4)), np.zeros(3))  # nobody


def _flat_tree(t):
  return np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(t)])


# ------------------------------------------------------------------ core/adversary.py


def test_masks_slots_says_whether_a_slot_can_be_empty():
  P = Participation
  assert [P(**kw).masks_slots for kw in (
      {}, dict(straggler_mode="drop"), dict(stragglers=0.5), dict(availability=0.5),
      dict(dropout=0.1), dict(stragglers=0.5, straggler_mode="drop"),
      dict(availability=1.0, dropout=0.0, stragglers=0.0, straggler_mode="drop"))] == [
      False, False, False, True, True, True, False]


def test_attackers_are_the_first_of_the_documented_permutation():
  key = jax.random.key(4)
  for n, fraction in ((10, 0.35), (7, 0.5), (5, 0.0)):
    got = np.asarray(adversary.attackers(key, n, fraction))
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 0xA77AC), n))
    want = np.zeros(n, bool)
    want[perm[:int(np.floor(fraction * n))]] = True
    np.testing.assert_array_equal(got, want)


def test_available_sample_draws_the_cohort_from_the_online_clients():
  key = jax.random.key(6)
  n, cohort = 9, 4
  k_on, k_pick = jax.random.split(jax.random.fold_in(key, 0xA7A1))
  u_on = np.asarray(jax.random.uniform(k_on, (n,)))
  u_pick = np.asarray(jax.random.uniform(k_pick, (n,)))
  # an availability equal to a client's draw leaves that client offline (u < P)
  for p in (0.3, 0.8, 1.0, float(u_on[3])):
    online = [i for i in range(n) if u_on[i] < p]
    chosen = sorted(online, key=lambda i: u_pick[i])[:cohort]
    want = chosen + [n] * (cohort - len(chosen))
    got = np.asarray(adversary.available_sample(key, n, cohort, p))
    assert got.dtype == np.int32 and got.tolist() == want, p
  assert len([i for i in range(n) if u_on[i] < 0.3]) < cohort  # some slots are empty


def test_straggler_steps_is_the_documented_draw():
  for s in range(12):
    key = jax.random.key(s)
    k1, k2 = jax.random.split(jax.random.fold_in(key, 0x57A6))
    u = float(jax.random.uniform(k1))
    for steps in (1, 2, 5):
      for fraction in (0.5, u):  # a fraction equal to the draw: not a straggler (u < F)
        slow, got = adversary.straggler_steps(key, jnp.int32(steps), fraction)
        want_slow = u < fraction
        want = int(jax.random.randint(k2, (), 1, max(steps, 2))) if want_slow else steps
        assert bool(slow) == want_slow and int(got) == want, (s, steps, fraction)
        assert 1 <= int(got) <= steps


def test_flip_labels_maps_y_to_k_minus_1_minus_y():
  y = jnp.asarray([0, 1, 2, 1], jnp.int32)
  assert adversary.flip_labels(y, 3).tolist() == [2, 1, 0, 1]
  assert adversary.flip_labels(jnp.asarray([0, 1]), 1).tolist() == [1, 0]  # binary
  assert adversary.flip_labels(jnp.asarray([0.0, 1.0]), 2).dtype == jnp.float32


@pytest.mark.parametrize("n,f", [(10, 2), (7, 1), (9, 0), (1, 0), (1, 1), (0, 0), (4, 3)])
def test_alie_z_is_baruch_et_al(n, f):
  s = np.floor(max(n, 1) / 2 + 1) - f
  want = scipy.stats.norm.ppf(np.clip((max(n, 1) - s) / max(n, 1), 1e-6, 1 - 1e-6))
  got = float(adversary.alie_z(jnp.int32(n), jnp.int32(f)))
  assert got == pytest.approx(want, rel=1e-3)  # float32: 1 - 1e-6 is 0.99999899


_MANY = ([1, 1, 0, 1, 1, 1], [0, 1, 1, 0, 1, 0])  # client 2 is malicious but absent
_FEW = ([0, 1, 0, 1, 0, 0], [0, 0, 1, 1, 0, 0])  # one present attacker, one honest client


@pytest.mark.parametrize("name,kw,who", [
    ("sign_flip", {}, _MANY), ("scale", {}, _MANY), ("scale", dict(scale=-2.5), _MANY),
    ("gaussian", dict(sigma=0.7), _MANY), ("alie", {}, _MANY), ("alie", {}, _FEW),
    ("alie", {}, ([0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0])), ("ipm", dict(eps=0.3), _MANY),
    ("ipm", dict(eps=0.3), _FEW), ("label_flip", {}, _MANY)])
def test_apply_attack_is_each_formula_on_the_stack(name, kw, who):
  rng = np.random.default_rng(8)
  c = 6
  msgs = {"a": rng.normal(size=(c, 2, 2)).astype(np.float32),
          "b": rng.normal(size=(c, 3)).astype(np.float32)}
  present, bad = (np.array(v, bool) for v in who)
  key = jax.random.key(2)
  attack = Attack(name, 0.3, **kw)
  got = adversary.apply_attack(attack, jax.tree.map(jnp.asarray, msgs), jnp.asarray(present),
                               jnp.asarray(bad), key, cohort=5)
  x = np.concatenate([msgs["a"].reshape(c, -1), msgs["b"]], axis=1).astype(np.float64)
  hit = bad & present
  y = x.copy()
  if name == "sign_flip":
    y[hit] = -x[hit]
  elif name == "scale":
    y[hit] = kw.get("scale", 5.0) * x[hit]
  elif name == "gaussian":
    y[hit] = 0.7 * np.asarray(jax.random.normal(jax.random.fold_in(key, 0x6A55), x.shape))[hit]
  elif name == "alie":
    mu, sd = x[present].mean(0), x[present].std(0)
    k, nb = present.sum(), hit.sum()
    z = scipy.stats.norm.ppf(np.clip((k - (np.floor(k / 2 + 1) - nb)) / k, 1e-6, 1 - 1e-6))
    y[hit] = mu - z * sd
  elif name == "ipm":
    y[hit] = -0.3 * x[present & ~bad].mean(0)
  out = np.concatenate([np.asarray(got["a"]).reshape(c, -1), np.asarray(got["b"])], axis=1)
  np.testing.assert_allclose(out, y, rtol=1e-5, atol=1e-6)
