"""FedGMA (Tenison et al. 2022, §4, Alg. 1) and the AND-mask on every base algorithm."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.aggregation.aggregators import (
    MaskedPseudoGradient, agreement_mask, masking_aggregator)
from fedjax_inv.core.engine import build_round, init_state
from tests.reference import batch_indices, loss_fn, round_keys
from tests.trees import max_abs_diff

COHORT = 4  # of the fixture's 5 clients


_RUNS = {}


def _run_named(data, model, name, rounds=1, strategy="scan", **kw):
  """``_run`` of ``make_algorithm(name, **kw)``, memoized: tests that need the same run
  share one compile."""
  key = (id(data), name, rounds, strategy, tuple(sorted(kw.items())))
  if key not in _RUNS:
    _RUNS[key] = _run(model, data, make_algorithm(name, **kw), rounds, strategy)
  return _RUNS[key]


def _run(model, data, alg, rounds, strategy="scan", seed=0):
  rf = build_round(model, "binary", alg, data.num_clients, COHORT, execution=strategy,
                   chunk_size=2)
  server, cs = init_state(alg, model.init(seed), data.num_clients)
  for _ in range(rounds):
    server, cs, _ = rf(server, cs, data, jax.random.key(seed))
  assert rf.jitted._cache_size() == 1  # the carried mask keeps the state's structure
  return server.params


def _client_deltas(model, data, params, key, local_steps, batch_size, lr):
  """Slow loop: every sampled client's pseudo-gradient Δ_k = w_t − w_k of round 0 (plain
  local SGD), and its weight n_k."""
  grad = jax.jit(jax.grad(lambda p, x, y, w: loss_fn(model, "binary", p, x, y, w)))
  x_all, y_all, n_all = np.asarray(data.x), np.asarray(data.y), np.asarray(data.n)
  idx, ckeys = round_keys(key, 0, data.num_clients, COHORT)
  deltas, weights = [], []
  for i, ck in zip(idx, ckeys):
    p = params
    for bidx in batch_indices(ck, local_steps, int(n_all[i]), batch_size):
      g = grad(p, x_all[i][bidx], y_all[i][bidx], np.ones(len(bidx), np.float32))
      p = jax.tree.map(lambda w, g: w - lr * g, p, g)
    deltas.append(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b),
                               params, p))
    weights.append(float(n_all[i]))
  return deltas, np.asarray(weights)


def _leaves(tree):
  return [np.asarray(a, np.float64) for a in jax.tree.leaves(tree)]


# --------------------------------------------------------------------------------------
# τ = 0 is exactly the base
# --------------------------------------------------------------------------------------

BASES = {
    "fedavg": dict(client_lr=0.1, local_steps=2, batch_size=8),
    "fedprox": dict(client_lr=0.1, local_steps=2, batch_size=8, mu=0.5),
    "scaffold": dict(client_lr=0.1, local_steps=2, batch_size=8),
    "fedadam": dict(client_lr=0.1, local_steps=2, batch_size=8, server_lr=0.05),
    "fedyogi": dict(client_lr=0.1, local_steps=2, batch_size=8, server_lr=0.05),
}


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.slow
def test_tau_zero_equals_base_bitwise(tiny_binary, base):
  data, model = tiny_binary
  want = _run(model, data, make_algorithm(base, **BASES[base]), rounds=2)
  got = _run(model, data, make_algorithm("fedgma", base=base, tau=0.0, **BASES[base]),
             rounds=2)
  chex.assert_trees_all_equal(got, want)
  # (τ > 0 does change a run: see the hand computations and the mask-position test.)


# --------------------------------------------------------------------------------------
# τ = 1: one round against a hand computation (FedGMA Alg. 1)
# --------------------------------------------------------------------------------------


HAND = dict(client_lr=0.2, local_steps=3, batch_size=8)


@pytest.mark.parametrize("base", ["fedavg", "fedadam"])
def test_one_round_matches_hand_computation(tiny_binary, base):
  data, model = tiny_binary
  lr, steps, bs = HAND["client_lr"], HAND["local_steps"], HAND["batch_size"]
  server_lr = 0.7 if base == "fedavg" else 0.05
  p0 = model.init(0)
  got = _run_named(data, model, "fedgma", base=base, tau=1.0, server_lr=server_lr, **HAND)

  deltas, n = _client_deltas(model, data, p0, jax.random.key(0), steps, bs, lr)
  chex.assert_trees_all_equal_shapes(got, p0, *deltas)  # the loop below pairs leaves by index
  agreements = []
  for j, leaf0 in enumerate(_leaves(p0)):
    d = np.stack([_leaves(dk)[j] for dk in deltas])           # [C, ...]
    a = np.abs(np.mean(np.sign(d), axis=0))                   # agreement A
    mask = np.where(a >= 1.0, 1.0, a)                         # 1 if A >= τ else A
    mean = np.tensordot(n / n.sum(), d, axes=1)               # Σ n_k Δ_k / Σ n_k
    if base == "fedavg":
      want = leaf0 - server_lr * mask * mean
    else:  # Reddi FedAdam from zero moments; the mask multiplies the final step.
      b1, b2, eps = 0.9, 0.99, 1e-3
      m = (1 - b1) * (-mean)
      v = b2 * eps ** 2 + (1 - b2) * mean ** 2
      want = leaf0 + server_lr * mask * m / (np.sqrt(v) + eps)
    np.testing.assert_allclose(_leaves(got)[j], want, rtol=2e-4, atol=2e-6)
    agreements.append(a.ravel())
  # The round exercises partial agreement as well as unanimous coordinates.
  a = np.concatenate(agreements)
  assert np.any((a > 0) & (a < 1)) and np.any(a == 1)


def test_and_mask_freezes_disagreeing_coordinates(tiny_binary):
  data, model = tiny_binary
  kw = dict(client_lr=0.2, local_steps=3, batch_size=8)
  p0 = model.init(0)
  got = _run(model, data, make_algorithm("and_mask", tau=1.0, **kw), rounds=1)
  deltas, n = _client_deltas(model, data, p0, jax.random.key(0), 3, 8, 0.2)
  chex.assert_trees_all_equal_shapes(got, p0, *deltas)
  frozen = moved = 0
  for j, (g, w0) in enumerate(zip(_leaves(got), _leaves(p0), strict=True)):
    d = np.stack([_leaves(dk)[j] for dk in deltas])
    agree = np.abs(np.mean(np.sign(d), axis=0)) >= 1.0
    np.testing.assert_array_equal(g[~agree], w0[~agree])     # exactly unchanged
    mean = np.tensordot(n / n.sum(), d, axes=1)
    np.testing.assert_allclose(g[agree], (w0 - mean)[agree], rtol=2e-4, atol=2e-6)
    frozen += int(np.sum(~agree))
    moved += int(np.sum(agree & (np.abs(mean) > 1e-6)))
  assert frozen > 0 and moved > 0


# --------------------------------------------------------------------------------------
# The mask rule, on the aggregator directly
# --------------------------------------------------------------------------------------

# 4 clients x 5 coordinates; agreement A per column = 1, .5, 0, .5, .75 (col 4: a zero).
SIGNED = np.array([[1.0, 2.0, 1.0, -1.0, 3.0],
                   [2.0, 1.0, -2.0, -2.0, 1.0],
                   [1.0, 3.0, 1.0, -1.0, 2.0],
                   [3.0, -1.0, -1.0, 1.0, 0.0]], np.float32)
A = np.array([1.0, 0.5, 0.0, 0.5, 0.75])
W = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def _aggregate(aggregator, rows=SIGNED, weights=W):
  stats = [aggregator.lift({"w": jnp.asarray(r)}, jnp.float32(w)) for r, w in
           zip(rows, weights)]
  total = jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *stats)
  return aggregator.finalize(total)


@pytest.mark.parametrize("tau", [0.0, 0.5, 0.6, 0.8, 1.0])
def test_gma_mask_is_one_if_agreement_at_least_tau_else_agreement(tau):
  base = aggs.weighted_mean()
  out = _aggregate(masking_aggregator(base, tau, "gma"))
  assert isinstance(out, MaskedPseudoGradient)
  want_mask = np.where(A >= tau, 1.0, A)                      # not mask * (1 + A)
  np.testing.assert_allclose(np.asarray(out.mask["w"]), want_mask, rtol=1e-6)
  assert np.all(np.asarray(out.mask["w"]) <= 1.0)
  mean = (W[:, None] * SIGNED).sum(0) / W.sum()
  np.testing.assert_allclose(np.asarray(out.pseudo_grad["w"]), mean, rtol=1e-6)
  # Masked-product form agrees with the shared building block aggregators.gma.
  prod = _aggregate(masking_aggregator(base, tau, "gma", carry_mask=False))
  ref = _aggregate(aggs.gma(base, tau))
  np.testing.assert_allclose(np.asarray(prod["w"]), np.asarray(ref["w"]), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(prod["w"]), want_mask * mean, rtol=1e-6)


def test_and_mask_zeroes_disagreeing_coordinates_and_rescale():
  base = aggs.weighted_mean()
  mean = (W[:, None] * SIGNED).sum(0) / W.sum()
  out = _aggregate(masking_aggregator(base, 0.7, "and_mask", carry_mask=False))
  np.testing.assert_allclose(np.asarray(out["w"]), np.where(A >= 0.7, mean, 0.0),
                             rtol=1e-6)
  assert np.asarray(out["w"])[[1, 2, 3]].tolist() == [0.0, 0.0, 0.0]
  resc = _aggregate(masking_aggregator(base, 0.7, "and_mask", rescale=True,
                                       carry_mask=False))
  density = np.mean(A >= 0.7)                                  # 2 of 5 coordinates
  np.testing.assert_allclose(np.asarray(resc["w"]),
                             np.where(A >= 0.7, mean, 0.0) / (1e-10 + density), rtol=1e-6)


def test_agreement_mask_closed_form():
  a = jnp.asarray(A, jnp.float32)
  np.testing.assert_allclose(np.asarray(agreement_mask(a, 0.6)), [1, .5, 0, .5, 1])
  np.testing.assert_allclose(np.asarray(agreement_mask(a, 0.6, "and_mask")), [1, 0, 0, 0, 1])


# --------------------------------------------------------------------------------------
# Where the mask goes
# --------------------------------------------------------------------------------------


def test_mask_position_matters_for_adaptive_servers(tiny_binary):
  data, model = tiny_binary
  diff = max_abs_diff

  kw = dict(server_lr=0.05, tau=1.0, **HAND)
  # mask_at='pseudo_gradient' == the base's aggregator='gma' option (mask, then Adam).
  pg = _run_named(data, model, "fedgma", base="fedadam", mask_at="pseudo_gradient", **kw)
  ref = _run_named(data, model, "fedadam", aggregator="gma", **kw)
  assert diff(pg, ref) < 1e-6
  # Alg. 1 masks the adaptive step instead (same run as the hand computation above):
  # a different algorithm for FedAdam. (For SGD servers the two coincide: the FedAvg
  # hand computation is both "mask ⊙ mean, then SGD" and "mask ⊙ SGD step".)
  up = _run_named(data, model, "fedgma", base="fedadam", **kw)
  assert diff(up, pg) > 1e-4


def test_execution_strategies_agree(tiny_binary):
  data, model = tiny_binary
  alg = make_algorithm("fedgma", base="scaffold", tau=0.7, client_lr=0.1, local_steps=2,
                       batch_size=8)
  # 'chunked' = vmap inside chunks of 2 clients, scan across chunks.
  runs = [_run(model, data, alg, rounds=2, strategy=s) for s in ("scan", "chunked")]
  for other in runs[1:]:
    chex.assert_trees_all_close(runs[0], other, rtol=1e-5, atol=1e-6)


def test_registry_names_and_hparams():
  alg = make_algorithm("fedgma", base="fedyogi", tau=0.3)
  assert alg.name == "fedgma"
  assert alg.hparams["base"] == "fedyogi" and alg.hparams["tau"] == 0.3
  assert alg.hparams["server_optimizer"] == "yogi"
  am = make_algorithm("and_mask", base="fedprox", mu=0.1)
  assert am.name == "and_mask" and am.hparams["mu"] == 0.1
  assert am.hparams["rescale"] is False


@pytest.mark.parametrize("name,kw,match", [
    ("fedgma", dict(base="fedfoo"), "unknown base"),
    ("fedgma", dict(base="fedgma"), "unknown base"),
    ("and_mask", dict(base="and_mask"), "unknown base"),
    ("fedgma", dict(base=3), "base=3 \\(fedgma\\): must be a string"),
    ("fedgma", dict(tau=1.5), "tau"),
    ("fedgma", dict(tau=-0.1), "tau"),
    ("fedgma", dict(tau=float("nan")), "tau"),
    ("fedgma", dict(tau="high"), "tau"),
    ("fedgma", dict(mask_at="server"), "mask_at"),
    ("fedgma", dict(aggregator="gma"), "already applies"),
    ("fedgma", dict(rescale=True), "unknown hyperparameters"),
    ("and_mask", dict(rescale="yes"), "rescale"),
    ("fedgma", dict(base="fedprox", mu=-1.0), "mu"),
])
def test_bad_arguments_raise_value_error(name, kw, match):
  with pytest.raises(ValueError, match=match):
    make_algorithm(name, **kw)
