"""Issue 25: client-level DP-FedAvg (fedjax_inv/privacy/client_dp.py) and Poisson client sampling.

Accounting is checked against dp-accounting called directly and against pfl-research's
accountants (values made by benchmarks/peers/pfl_accountant_values.py in pfl-research's
own environment); the round against an independent NumPy loop (clipping, the fixed
denominator, Poisson sampling) and, for the noise, by its empirical standard deviation.
"""
import dataclasses
import json
import math
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dp_accounting as dpa
from dp_accounting import pld, rdp

from fedjax_inv import Task, models
from fedjax_inv.privacy import client_dp as privacy
from fedjax_inv.runner import simulation
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core import strategy
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.core.engine import build_round, init_state

PFL = json.loads((pathlib.Path(__file__).parent / "data" / "pfl_accountant_values.json")
                 .read_text())
N, C = 40, 10


@pytest.fixture(scope="module")
def pool():
  rng = np.random.default_rng(0)
  xs, ys = [], []
  for _ in range(N):
    n = int(rng.integers(10, 30))
    x = rng.normal(size=(n, 6)).astype(np.float32)
    xs.append(x)
    ys.append((x[:, 0] + 0.3 * x[:, 1] > 0).astype(np.int32))
  data = from_client_arrays(xs, ys)
  return data, models.mlp(6, (8,), 1)


def _fedavg(**kw):
  return make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=8,
                        weighting="uniform", **kw)


def _dp(alg, clip, sigma, sampling="fixed", accountant="rdp"):
  s = privacy.DPSettings(clip=clip, noise_multiplier=sigma, sampling=sampling,
                         accountant=accountant).check()
  return privacy.apply(alg, s, N, C)


def _rounds(alg, data, model, rounds, execution="scan", key=0):
  rf = build_round(model, "binary", alg, N, C, execution=execution)
  server, cs = init_state(alg, model.init(0), N)
  out = []
  for _ in range(rounds):
    server, cs, m = rf(server, cs, data, jax.random.key(key))
    out.append(m)
  return server, cs, out


# --------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("q,sigma,rounds,delta", [
    (0.01, 1.0, 100, 1e-5), (0.05, 0.7, 300, 1e-5), (0.1, 2.0, 50, 1e-6),
    (0.002, 1.2, 2000, 1e-5)])
def test_epsilon_equals_dp_accounting_called_directly(q, sigma, rounds, delta):
  n = 10_000
  c = round(q * n)
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)),
                                  rounds)
  assert privacy.epsilon(sigma, delta, "rdp", "poisson", n, c, rounds) == pytest.approx(
      rdp.RdpAccountant().compose(event).get_epsilon(delta), rel=1e-12)
  assert privacy.epsilon(sigma, delta, "pld", "poisson", n, c, rounds) == pytest.approx(
      pld.PLDAccountant().compose(event).get_epsilon(delta), rel=1e-9)
  wor = dpa.SelfComposedDpEvent(
      dpa.SampledWithoutReplacementDpEvent(n, c, dpa.GaussianDpEvent(sigma)), rounds)
  acc = rdp.RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
  assert privacy.epsilon(sigma, delta, "rdp", "fixed", n, c, rounds) == pytest.approx(
      acc.compose(wor).get_epsilon(delta), rel=1e-12)


@pytest.mark.parametrize("row", PFL["epsilon"], ids=lambda r: f"q{r['q']}-T{r['rounds']}")
def test_epsilon_equals_pfl_research(row):
  n = 100_000
  for acc in ("rdp", "pld"):
    got = privacy.epsilon(row["sigma"], row["delta"], acc, "poisson", n,
                          round(row["q"] * n), row["rounds"])
    assert got == pytest.approx(row[acc], rel=1e-6), acc


@pytest.mark.parametrize("row", PFL["noise"], ids=lambda r: f"q{r['q']}-eps{r['target_epsilon']}")
def test_target_epsilon_noise_agrees_with_pfl_research_and_reaches_the_target(row):
  n = 100_000
  c = round(row["q"] * n)
  for acc in ("rdp", "pld"):
    sigma = privacy.solve_noise(row["target_epsilon"], row["delta"], acc, "poisson", n, c,
                                row["rounds"])
    # pfl's binary search stops at 10 % of delta; ours at 0.1 % of sigma
    assert sigma == pytest.approx(row[acc], rel=0.01), acc
    eps = privacy.epsilon(sigma, row["delta"], acc, "poisson", n, c, row["rounds"])
    assert eps <= row["target_epsilon"]
    assert privacy.epsilon(sigma * 0.99, row["delta"], acc, "poisson", n, c,
                           row["rounds"]) > row["target_epsilon"]


def test_epsilon_edge_cases():
  assert privacy.epsilon(0.0, 1e-5, "rdp", "fixed", N, C, 10) == math.inf
  assert privacy.epsilon(1.0, 1e-5, "rdp", "fixed", N, C, 0) == 0.0
  e = [privacy.epsilon(1.0, 1e-5, "rdp", "poisson", N, C, t) for t in (1, 10, 100)]
  assert e[0] < e[1] < e[2]  # spent budget grows with the rounds
  with pytest.raises(ValueError, match="not reachable"):
    privacy.solve_noise(1e-4, 1e-5, "rdp", "poisson", N, C, 10_000)


# --------------------------------------------------------------------------- the round


def test_clipping_bounds_every_norm_and_keeps_small_updates():
  rng = np.random.default_rng(1)
  agg = privacy.clipped_mean(0.5)
  for scale in (0.01, 1.0, 100.0):
    delta = {"a": jnp.asarray(rng.normal(size=(3, 4)) * scale, jnp.float32),
             "b": jnp.asarray(rng.normal(size=(5,)) * scale, jnp.float32)}
    clipped, present = agg.lift(delta, jnp.float32(1.0))
    norm = math.sqrt(sum(float(jnp.sum(v * v)) for v in jax.tree.leaves(clipped)))
    raw = math.sqrt(sum(float(jnp.sum(v * v)) for v in jax.tree.leaves(delta)))
    assert norm <= 0.5 * (1 + 1e-6)
    if raw <= 0.5:
      chex.assert_trees_all_equal(clipped, delta)
    else:
      assert norm == pytest.approx(0.5, rel=1e-6)
    assert float(present) == 1.0
  # an absent client (weight 0) adds nothing, even with inf/NaN in its update
  bad = {"a": jnp.full((3, 4), jnp.nan), "b": jnp.full((5,), jnp.inf)}
  clipped, present = agg.lift(bad, jnp.float32(0.0))
  assert float(present) == 0.0 and all(float(jnp.max(jnp.abs(v))) == 0.0
                                       for v in jax.tree.leaves(clipped))


def _reference_dp_round(data, model, params, key, rnd, clip, sampling, norms=None):
  """One DP-FedAvg round (sigma = 0) as a NumPy loop: the documented sampling, plain SGD
  local steps, flat clipping, sum over the sampled clients / E. ``norms``: a list that
  receives each sampled client's update norm."""
  from tests.reference import batch_indices, loss_fn, tmap
  k_sample, k_clients = jax.random.split(jax.random.fold_in(key, rnd))
  if sampling == "poisson":
    u = np.asarray(jax.random.uniform(k_sample, (N,)))
    idx = [int(i) for i in np.argsort(np.where(u < C / N, u, 2.0), kind="stable")
           if u[i] < C / N][:strategy.poisson_slots(N, C)]
  else:
    idx = [int(i) for i in np.asarray(jax.random.choice(k_sample, N, (C,), replace=False))]
  grad = jax.jit(jax.grad(lambda p, x, y, w: loss_fn(model, "binary", p, x, y, w)))
  total = tmap(jnp.zeros_like, params)
  for i in idx:
    ck = jax.random.fold_in(k_clients, i)
    p = params
    for b in batch_indices(ck, 2, int(data.n[i]), 8):
      x, y = np.asarray(data.x[i])[b], np.asarray(data.y[i])[b]
      p = tmap(lambda w, g: w - 0.1 * g, p, grad(p, x, y, np.ones(len(b), np.float32)))
    d = tmap(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), params, p)
    norm = math.sqrt(sum(float(np.sum(v * v)) for v in jax.tree.leaves(d)))
    if norms is not None:
      norms.append(norm)
    total = tmap(lambda t, v: t + v * min(1.0, clip / norm), total, d)
  return tmap(lambda w, t: np.asarray(w, np.float64) - t / C, params, total), len(idx)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_a_dp_round_equals_a_numpy_loop(pool, sampling):
  data, model = pool
  clip = 0.05  # below most clients' update norm: the clipping is active
  alg = _dp(_fedavg(), clip, 0.0, sampling)
  server, _, metrics = _rounds(alg, data, model, 1)
  want, ran = _reference_dp_round(data, model, model.init(0), jax.random.key(0), 0, clip,
                                  sampling)
  chex.assert_trees_all_close(server.params, want, rtol=2e-5, atol=1e-6)
  if sampling == "poisson":
    assert int(metrics[0]["cohort_size"]) == ran
    assert metrics[0]["clients"].shape == (strategy.poisson_slots(N, C),)


def test_sigma_zero_and_no_clip_is_bit_identical_to_fedavg(pool):
  data, model = pool
  for ex in ("scan", "vmap", "chunked"):
    a, _, _ = _rounds(_dp(_fedavg(), math.inf, 0.0), data, model, 3, ex)
    b, _, _ = _rounds(_fedavg(), data, model, 3, ex)
    chex.assert_trees_all_equal(a.params, b.params)


@pytest.mark.parametrize("sampling", ["fixed", "poisson"])
def test_strategies_agree_with_noise(pool, sampling):
  data, model = pool
  alg = _dp(_fedavg(), 0.5, 1.0, sampling)
  ref = _rounds(alg, data, model, 3, "scan")[0].params
  for ex in ("vmap", "chunked"):
    chex.assert_trees_all_close(_rounds(alg, data, model, 3, ex)[0].params, ref,
                                rtol=1e-5, atol=1e-6)


def test_noise_std_is_sigma_clip_over_the_expected_cohort(pool):
  """Clients whose optimizer moves nothing send zero updates: a round moves the model by
  the noise alone, N(0, (sigma C / E)^2) per coordinate; measured over many rounds."""
  import optax
  data, model = pool
  sigma, clip = 1.5, 0.8
  still = _fedavg().replace(client_optimizer=optax.set_to_zero())
  alg = _dp(still, clip, sigma)
  rf = build_round(model, "binary", alg, N, C, execution="vmap")
  server, cs = init_state(alg, model.init(0), N)
  steps = []
  for _ in range(40):
    before = jnp.concatenate([a.ravel() for a in jax.tree.leaves(server.params)])
    server, cs, _ = rf(server, cs, data, jax.random.key(3))
    after = jnp.concatenate([a.ravel() for a in jax.tree.leaves(server.params)])
    steps.append(np.asarray(after - before))
  steps = np.concatenate(steps)  # 40 rounds x 73 parameters
  assert abs(steps.mean()) < 4 * sigma * clip / C / math.sqrt(steps.size)
  assert steps.std() == pytest.approx(sigma * clip / C, rel=0.06)


def test_poisson_cohorts_vary_around_c_and_leave_the_absent_alone(pool):
  data, model = pool
  alg = make_algorithm("scaffold", client_lr=0.1, local_steps=2, batch_size=8).replace(
      client_sampling="poisson")
  rf = build_round(model, "binary", alg, N, C, execution="scan")
  server, cs = init_state(alg, model.init(0), N)
  sizes = []
  for _ in range(30):
    old = jax.tree.map(np.asarray, cs)  # the round donates (consumes) the pool state
    server, cs, m = rf(server, cs, data, jax.random.key(1))
    ran = np.asarray(m["clients"])
    ran = set(ran[ran < N].tolist())
    sizes.append(int(m["cohort_size"]))
    assert len(ran) == sizes[-1]
    for i in set(range(N)) - ran:  # an absent client's control variate is untouched
      chex.assert_trees_all_equal(jax.tree.map(lambda a: np.asarray(a)[i], cs["scaffold"]),
                                  jax.tree.map(lambda a: a[i], old["scaffold"]))
  assert len(set(sizes)) > 3 and abs(np.mean(sizes) - C) < 2.5


def test_dp_resume_is_bit_identical(pool, tmp_path):
  data, model = pool
  task = Task("pool", "binary", data, {"test": data.take(np.arange(4))}, model, {})
  alg = _dp(_fedavg(), 0.5, 1.0, "poisson")
  kw = dict(rounds=4, clients_per_round=C, seed=2, progress=False, reporting=None,
            eval_every=1, execution="scan")
  full = simulation.run(task, alg, **kw)
  ck = tmp_path / "ck"
  with pytest.raises(KeyboardInterrupt):
    def stop(e):
      if e["round"] == 2:
        raise KeyboardInterrupt
    simulation.run(task, alg, **kw, checkpoint_dir=ck, checkpoint_every=1, callback=stop)
  resumed = simulation.run(task, alg, **kw, checkpoint_dir=ck, checkpoint_every=1)
  chex.assert_trees_all_equal(resumed.params, full.params)
  assert [h["dp_epsilon"] for h in full.history] == sorted(h["dp_epsilon"]
                                                           for h in full.history)
  assert full.privacy["epsilon"] == full.history[-1]["dp_epsilon"]


# --------------------------------------------------------------- adaptive clipping


def _adaptive(alg, clip, sigma, quantile=0.5, **kw):
  s = privacy.DPSettings(clip=clip, noise_multiplier=sigma, adaptive_quantile=quantile,
                         **kw).check()
  return privacy.apply(alg, s, N, C)


def test_adaptive_clip_update_equals_its_formula_on_a_numpy_loop(pool):
  """Andrew et al. 2021, Alg. 1 with sigma = 0: the round clips at C_0, and the next clip
  is C_0 exp(-eta (b - gamma)), b the fraction of the round's clients with norm <= C_0."""
  data, model = pool
  norms = []
  _reference_dp_round(data, model, model.init(0), jax.random.key(0), 0, 1.0, "fixed", norms)
  c0, eta, gamma = float(np.median(norms)), 0.2, 0.3  # the start clips about half
  alg = _adaptive(_fedavg(), c0, 0.0, gamma)
  server, _, _ = _rounds(alg, data, model, 1)
  norms = []
  want, _ = _reference_dp_round(data, model, model.init(0), jax.random.key(0), 0, c0,
                                "fixed", norms)
  chex.assert_trees_all_close(server.params, want, rtol=2e-5, atol=1e-6)
  b = np.mean([n <= c0 for n in norms])
  assert 0 < b < 1  # the start clips some clients and not others
  assert float(server.extras["dp"]["clip"]) == pytest.approx(c0 * math.exp(-eta * (b - gamma)),
                                                              rel=1e-6)


@pytest.mark.parametrize("c0", [1e-3, 10.0])
def test_adaptive_clip_moves_to_the_target_quantile_from_either_side(pool, c0):
  data, model = pool
  alg = _adaptive(_fedavg(), c0, 0.0, 0.5)
  rf = build_round(model, "binary", alg, N, C, execution="scan")
  server, cs = init_state(alg, model.init(0), N)
  clips = []
  for _ in range(60):
    server, cs, _ = rf(server, cs, data, jax.random.key(4))
    clips.append(float(server.extras["dp"]["clip"]))
  # from far below it grows, from far above it shrinks, to the same neighbourhood
  assert (clips[-1] > 20 * c0) if c0 < 0.01 else (clips[-1] < c0 / 20)
  assert 0.01 < clips[-1] < 1.0


def test_adaptive_noise_split_and_its_checks():
  """sigma_update = (z^-2 - (2 sigma_b)^-2)^-1/2 (Andrew et al., Thm. 1); sigma_b must
  exceed z / 2; the accountant charges z."""
  alg = _adaptive(_fedavg(), 0.1, 1.0, 0.5, clip_count_stddev=2.0)
  hp = alg.hparams
  assert hp["dp_update_noise_multiplier"] == pytest.approx((1 - 1 / 16) ** -0.5)
  assert hp["dp_clip_count_stddev"] == 2.0 and hp["dp_noise_multiplier"] == 1.0
  assert _adaptive(_fedavg(), 0.1, 0.8, 0.5).hparams["dp_clip_count_stddev"] == C / 20
  with pytest.raises(ValueError, match="must exceed half the noise multiplier"):
    _adaptive(_fedavg(), 0.1, 3.0, 0.5, clip_count_stddev=1.0)
  with pytest.raises(ValueError, match="quantile"):
    privacy.DPSettings(clip=0.1, noise_multiplier=1.0, adaptive_quantile=1.0).check()
  rec = privacy.record(alg, N, C, 3)
  assert rec["adaptive_quantile"] == 0.5 and "count of unclipped" in rec["covered"]
  assert rec["epsilon"] == privacy.epsilon(1.0, 1e-5, "rdp", "fixed", N, C, 3)


def test_adaptive_with_noise_runs_under_every_strategy_alike(pool):
  data, model = pool
  alg = _adaptive(_fedavg(), 0.05, 1.0, 0.5, sampling="poisson", clip_count_stddev=2.0)
  ref = _rounds(alg, data, model, 3, "scan")[0]
  for ex in ("vmap", "chunked"):
    got = _rounds(alg, data, model, 3, ex)[0]
    chex.assert_trees_all_close(got.params, ref.params, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(got.extras["dp"], ref.extras["dp"], rtol=1e-5)


def test_adaptive_clipping_runs_through_run_with_the_automatic_strategy(pool):
  """run()'s default execution='auto' sizes a round from the aggregator's statistics; the
  adaptive clipped mean reads the client's context there too (it once failed on it), and
  the run equals the explicitly chosen strategy's."""
  data, model = pool
  task = Task("pool", "binary", data, {"test": data.take(np.arange(4))}, model, {})
  alg = _adaptive(_fedavg(), 0.05, 0.0, 0.5)
  auto = simulation.run(task, alg, rounds=2, clients_per_round=C, seed=0, progress=False)
  vmap = simulation.run(task, alg, rounds=2, clients_per_round=C, seed=0, progress=False,
                        execution="vmap")
  chex.assert_trees_all_close(auto.params, vmap.params, rtol=1e-5, atol=1e-6)
  assert auto.final["round"] == 2


# --------------------------------------------------------------------------- coverage


def test_what_dp_covers_is_recorded_and_non_mean_servers_are_refused():
  s = privacy.DPSettings(clip=1.0, noise_multiplier=1.0).check()
  alg = privacy.apply(make_algorithm("fishr_intra_arith"), s, N, C)
  rec = privacy.record(alg, N, C, 5)
  assert rec["not_covered"] == [privacy.MESSAGES["fishr"]]
  assert set(rec) >= {"epsilon", "delta", "accountant", "noise_multiplier", "clip",
                      "sampling", "rounds"}
  assert privacy.record(make_algorithm("fedavg"), N, C, 5) is None
  with pytest.raises(ValueError, match="fishr_inter_geo.*not a mean"):
    privacy.apply(make_algorithm("fishr_inter_geo"), s, N, C)
  with pytest.raises(ValueError, match="applied already"):
    privacy.apply(alg, s, N, C)


@pytest.mark.parametrize("flags,match", [
    (["--dp-clip", "1", "--dp-noise-multiplier", "-1"], "sigma must be"),
    (["--dp-clip", "0", "--dp-noise-multiplier", "1"], "must be > 0"),
    (["--dp-clip", "1", "--dp-noise-multiplier", "1", "--dp-delta", "1"], "delta must be"),
    (["--dp-clip", "1", "--dp-target-epsilon", "0.0001"], "not reachable"),
    (["--dp-clip", "1", "--dp-noise-multiplier", "1", "--algorithm", "fishr_inter_geo"],
     "cannot cover"),
    (["--dp-clip", "1", "--dp-noise-multiplier", "1", "--dp-accountant", "pld"],
     "needs --client-sampling poisson"),
    (["--dp-noise-multiplier", "1"], "without --dp-clip"),
    (["--client-sampling", "sometimes"], "choose one of"),
    (["--dp-clip", "1", "--dp-noise-multiplier", "1", "--dp-adaptive-quantile", "2"],
     "quantile"),
])
def test_bad_dp_flags_exit_2_with_one_line(tmp_path, capsys, flags, match):
  from fedjax_inv import cli
  out = tmp_path / "o"
  assert cli.main(["run", "--task", "colored_mnist", "--rounds", "3000", "--out", str(out),
                   "--no-progress"] + flags) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and match in err[0], err
  assert not out.exists()


@pytest.mark.slow
def test_cli_records_privacy_in_summary_and_epsilon_per_evaluated_round(tmp_path):
  from fedjax_inv import cli
  out = tmp_path / "dp"
  assert cli.main(["run", "--task", "synthetic_hospital", "--rounds", "4", "--eval-every",
                   "2", "--dp-clip", "0.5", "--dp-target-epsilon", "8",
                   "--client-sampling", "poisson", "--dp-accountant", "pld",
                   "--out", str(out), "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  p = s["privacy"]
  assert p["epsilon"] <= 8 and p["accountant"] == "pld" and p["sampling"] == "poisson"
  assert p["rounds"] == 4 and p["clip"] == 0.5 and p["noise_multiplier"] > 0
  rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  eps = [r["dp_epsilon"] for r in rows]
  assert [r["round"] for r in rows] == [2, 4] and eps[0] < eps[1] == p["epsilon"]
  assert s["hparams"]["weighting"] == "uniform"


# ------------------------------------------------- the pieces, one by one (mutation tests)


def _flat(tree):
  return np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(tree)])


def test_clipped_mean_finalize_and_the_adaptive_lift():
  """The fixed denominator: the present count (fixed sampling) or E (Poisson); an empty
  round is 0, not 0/0. The adaptive lift clips at ctx.extras['dp']['clip']."""
  from types import SimpleNamespace
  total = {"a": jnp.asarray([2.0, -4.0]), "b": jnp.asarray([6.0])}
  fixed, poisson = privacy.clipped_mean(0.5), privacy.clipped_mean(0.5, expected_cohort=4)
  assert fixed.name == "clipped_mean[C=0.5]" and fixed.lift.reads_context is False
  for count in (2.0, 1.0):
    np.testing.assert_array_equal(_flat(fixed.finalize((total, jnp.float32(count)))),
                                  np.array([2.0, -4.0, 6.0]) / count)
  np.testing.assert_array_equal(_flat(poisson.finalize((total, jnp.float32(3.0)))),
                                np.array([2.0, -4.0, 6.0]) / 4)
  zero = jax.tree.map(jnp.zeros_like, total)
  np.testing.assert_array_equal(_flat(fixed.finalize((zero, jnp.float32(0.0)))), np.zeros(3))
  adaptive = privacy.clipped_mean(0.5, adaptive=True)
  assert adaptive.lift.reads_context is True
  ctx = SimpleNamespace(extras={"dp": {"clip": jnp.float32(0.2)}})
  delta = {"a": jnp.asarray([3.0, 0.0]), "b": jnp.asarray([4.0])}  # norm 5
  clipped, present = adaptive.lift(delta, jnp.float32(0.5), ctx=ctx)  # weight 0.5: present
  np.testing.assert_allclose(_flat(clipped), np.array([3.0, 0.0, 4.0]) * 0.2 / 5, rtol=1e-6)
  assert float(present) == 1.0


def _pinned_noise(mean, key, std):
  """The documented draw: one normal per leaf (flatten order) from split(key, leaves)."""
  leaves, tree = jax.tree.flatten(mean)
  keys = jax.random.split(key, len(leaves))
  return jax.tree.unflatten(tree, [np.asarray(t, np.float64) + std * np.asarray(
      jax.random.normal(k, t.shape, t.dtype), np.float64) for t, k in zip(leaves, keys)])


def test_dp_noise_stage_adds_sigma_clip_over_e_from_the_round_key():
  from types import SimpleNamespace
  mean = {"a": jnp.full((3, 4), 0.5), "b": jnp.arange(5.0)}
  ctx = SimpleNamespace(key=jax.random.key(11))
  comp = privacy.dp_component(0.8, 1.0, 10)  # sigma exactly 1
  assert comp.name == "dp" and comp.message is None
  out, state = comp.call("server_stage", pseudo_grad=mean, state={"s": 1}, messages={},
                         ctx=ctx)
  assert state == {"s": 1}
  chex.assert_trees_all_close(out, _pinned_noise(mean, ctx.key, 1.0 * 0.8 / 10), rtol=1e-6)
  comp = privacy.dp_component(0.3, 2.5, 4)
  out, _ = comp.call("server_stage", pseudo_grad=mean, state=None, messages={}, ctx=ctx)
  chex.assert_trees_all_close(out, _pinned_noise(mean, ctx.key, 2.5 * 0.3 / 4), rtol=1e-6)
  # sigma = 0: the mean itself, even with an infinite clip and no key
  for key in (ctx.key, None):
    out, _ = privacy.dp_component(math.inf, 0.0, 10).call(
        "server_stage", pseudo_grad=mean, state=None, messages={}, ctx=SimpleNamespace(key=key))
    chex.assert_trees_all_equal(out, mean)
  with pytest.raises(ValueError, match="needs the round's key"):
    comp.call("server_stage", pseudo_grad=mean, state=None, messages={},
              ctx=SimpleNamespace(key=None))


def test_adaptive_dp_component_message_sum_and_clip_update():
  """Andrew et al. 2021, Alg. 1, piece by piece: b_k = 1[||delta_k|| <= C_t] (the bound
  included), the sum of the present b_k, C_{t+1} = C_t exp(-eta ((sum b + noise) / E -
  gamma)), and the noises drawn from the round's key."""
  from types import SimpleNamespace
  gamma, eta, E = 0.3, 0.2, 8.0

  def component(count_stddev, update_noise):
    return privacy.dp_component(0.5, None, E, {"quantile": gamma, "lr": eta,
                                              "count_stddev": count_stddev,
                                              "update_noise": update_noise})
  comp = component(0.0, 0.0)
  init = comp.call("init_server", params={"w": jnp.zeros(2)})
  assert list(init) == ["clip"] and float(init["clip"]) == pytest.approx(0.5)
  start = {"w": jnp.asarray([3.0, 4.0])}
  for clip, want in ((5.0, 1.0), (4.99, 0.0), (6.0, 1.0)):
    ctx = SimpleNamespace(params=start, extras={"dp": {"clip": jnp.float32(clip)}})
    b = comp.call("message", params={"w": jnp.zeros(2)}, ctx=ctx)
    assert float(b) == want, clip
  agg = comp.aggregator
  assert agg.name == "sum" and float(agg.finalize(jnp.float32(3.0))) == 3.0
  assert [float(agg.lift(jnp.float32(1.0), jnp.float32(w))) for w in (0.0, 0.5, 1.0)] == [
      0.0, 1.0, 1.0]
  mean = {"a": jnp.asarray([0.25, -1.0]), "b": jnp.ones((2, 2))}
  key = jax.random.key(5)
  ctx = SimpleNamespace(key=key)

  def clip_after(count):
    return 0.5 * math.exp(-eta * (count / E - gamma))
  # no noise at all (sigma = 0), even with a count noise set
  for comp in (component(0.0, 0.0), component(2.0, 0.0)):
    out, state = comp.call("server_stage", pseudo_grad=mean, state={"clip": jnp.float32(0.5)},
                           messages={"dp": jnp.float32(6.0)}, ctx=ctx)
    chex.assert_trees_all_equal(out, mean)
    assert list(state) == ["clip"] and state["clip"].dtype == jnp.float32
    assert float(state["clip"]) == pytest.approx(clip_after(6.0), rel=1e-6)
  # update noise only: drawn from the round's key itself
  out, state = component(0.0, 0.9).call("server_stage", pseudo_grad=mean,
                                        state={"clip": jnp.float32(0.5)},
                                        messages={"dp": jnp.float32(6.0)}, ctx=ctx)
  chex.assert_trees_all_close(out, _pinned_noise(mean, key, 0.9 * 0.5 / E), rtol=1e-6)
  assert float(state["clip"]) == pytest.approx(clip_after(6.0), rel=1e-6)
  # both: split(key) -> (update noise key, count noise key)
  k_update, k_count = jax.random.split(key)
  noisy_count = 6.0 + 0.75 * float(jax.random.normal(k_count, (), jnp.float32))
  out, state = component(0.75, 0.9).call("server_stage", pseudo_grad=mean,
                                         state={"clip": jnp.float32(0.5)},
                                         messages={"dp": jnp.float32(6.0)}, ctx=ctx)
  chex.assert_trees_all_close(out, _pinned_noise(mean, k_update, 0.9 * 0.5 / E), rtol=1e-6)
  assert float(state["clip"]) == pytest.approx(clip_after(noisy_count), rel=1e-5)


def test_apply_wires_the_aggregator_the_noise_and_the_hparams():
  base = make_algorithm("scaffold", client_lr=0.1, local_steps=2, batch_size=8,
                        weighting="num_examples")  # DP makes it uniform
  s = privacy.DPSettings(clip=0.5, noise_multiplier=1.0, delta=1e-6, accountant="pld",
                         sampling="poisson").check()
  alg = privacy.apply(base, s, N, C)
  assert {k: alg.hparams[k] for k in ("weighting", "aggregator", "dp_clip",
                                      "dp_noise_multiplier", "dp_delta", "dp_accountant",
                                      "client_sampling")} == dict(
      weighting="uniform", aggregator="clipped_mean", dp_clip=0.5, dp_noise_multiplier=1.0,
      dp_delta=1e-6, dp_accountant="pld", client_sampling="poisson")
  assert not any(k.startswith("dp_adaptive") for k in alg.hparams)
  assert alg.weighting == "uniform" and alg.client_sampling == "poisson"
  assert [c.name for c in alg.components] == ["dp", "scaffold"]
  assert alg.aggregator.name == "clipped_mean[C=0.5]"
  assert alg.aggregator.lift.reads_context is False
  total = {"w": jnp.asarray([8.0, -2.0])}
  np.testing.assert_allclose(_flat(alg.aggregator.finalize((total, jnp.float32(3.0)))),
                             np.array([8.0, -2.0]) / C)  # Poisson: divided by E = C
  fixed = privacy.apply(base, dataclasses.replace(s, accountant="rdp", sampling="fixed"), N, C)
  np.testing.assert_allclose(_flat(fixed.aggregator.finalize((total, jnp.float32(4.0)))),
                             np.array([8.0, -2.0]) / 4)  # fixed: the present count
  assert fixed.client_sampling == "fixed" and fixed.hparams["client_sampling"] == "fixed"
  ad = privacy.apply(base, privacy.DPSettings(clip=0.5, noise_multiplier=1.5,
                                              adaptive_quantile=0.4, clip_lr=0.3,
                                              clip_count_stddev=2.0).check(), N, C)
  assert ad.aggregator.lift.reads_context is True
  assert {k: ad.hparams[k] for k in ("dp_adaptive_quantile", "dp_clip_lr",
                                     "dp_clip_count_stddev")} == dict(
      dp_adaptive_quantile=0.4, dp_clip_lr=0.3, dp_clip_count_stddev=2.0)
  # Andrew et al. 2021, Thm. 1: 1/z^2 = 1/sigma_update^2 + 1/(2 sigma_b)^2
  assert ad.hparams["dp_update_noise_multiplier"] == pytest.approx(
      1.0 / math.sqrt(1.0 / 1.5 ** 2 - 1.0 / 4.0 ** 2), rel=1e-12)


@pytest.mark.parametrize("z,count_std", [(2.0, 1.0), (3.0, 1.5), (2.5, 1.0)])
def test_adaptive_count_noise_must_exceed_half_sigma(z, count_std):
  """2 sigma_b <= z has no update noise that keeps the total at z (the bound included)."""
  with pytest.raises(ValueError, match="must exceed half the noise multiplier"):
    privacy.apply(_fedavg(), privacy.DPSettings(clip=0.5, noise_multiplier=z,
                                                adaptive_quantile=0.5,
                                                clip_count_stddev=count_std).check(), N, C)


def test_adaptive_without_noise_adds_no_noise_anywhere():
  alg = privacy.apply(_fedavg(), privacy.DPSettings(clip=0.5, noise_multiplier=0.0,
                                                    adaptive_quantile=0.5).check(), N, C)
  assert alg.hparams["dp_update_noise_multiplier"] == 0.0
  assert alg.hparams["dp_clip_count_stddev"] == 0.0


def _direct_epsilon(sigma, delta, sampling, n, c, rounds):
  """dp-accounting called directly (RDP)."""
  g = dpa.GaussianDpEvent(sigma)
  if sampling == "poisson":
    one, rel = dpa.PoissonSampledDpEvent(c / n, g), dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
  else:
    one, rel = dpa.SampledWithoutReplacementDpEvent(n, c, g), dpa.NeighboringRelation.REPLACE_ONE
  acc = rdp.RdpAccountant(neighboring_relation=rel)
  return acc.compose(dpa.SelfComposedDpEvent(one, rounds)).get_epsilon(delta)


def test_epsilon_of_one_round_and_of_sigma_one():
  for sampling in ("poisson", "fixed"):
    assert privacy.epsilon(1.0, 1e-5, "rdp", sampling, N, C, 1) == pytest.approx(
        _direct_epsilon(1.0, 1e-5, sampling, N, C, 1), rel=1e-12)


def _bisection(target, delta, sampling, n, c, rounds, rtol):
  """The documented search, written out: double sigma from 1 until the target holds, then
  bisect [0, hi] until hi - lo <= rtol hi; return hi."""
  eps = lambda s: _direct_epsilon(s, delta, sampling, n, c, rounds)  # noqa: E731
  hi = 1.0
  while eps(hi) > target:
    hi = 2 * hi
  lo = 0.0
  while (hi - lo) > rtol * hi:
    mid = (lo + hi) / 2
    if eps(mid) <= target:
      hi = mid
    else:
      lo = mid
  return hi


@pytest.mark.timeout(120)  # a broken search loops forever
@pytest.mark.parametrize("sampling,target,rtol", [
    ("poisson", 30.0, 0.02), ("fixed", 2.0, 0.25), ("poisson", 3.0, 1e-3),
    ("fixed", 8.0, 0.5), ("poisson", 30.0, 1.0)])
def test_solve_noise_is_the_bisection(sampling, target, rtol):
  got = privacy.solve_noise(target, 1e-5, "rdp", sampling, N, C, 10, rtol=rtol)
  assert got == _bisection(target, 1e-5, sampling, N, C, 10, rtol)
  assert privacy.epsilon(got, 1e-5, "rdp", sampling, N, C, 10) <= target
  assert privacy.epsilon(got * (1 - rtol), 1e-5, "rdp", sampling, N, C, 10) > target


@pytest.mark.timeout(120)  # a broken search loops forever
@pytest.mark.parametrize("sigma", [0.5, 2.0, 512.0])
def test_solve_noise_of_a_reachable_target_on_the_grid_is_exact(sigma):
  """A target that is exactly epsilon(sigma) for sigma on the bisection grid: sigma itself
  (its epsilon is 'at most' the target), also at 512, the last doubling below SIGMA_MAX."""
  target = privacy.epsilon(sigma, 1e-5, "rdp", "poisson", N, C, 10)
  assert privacy.solve_noise(target, 1e-5, "rdp", "poisson", N, C, 10) == sigma
