"""Sample-level DP-SGD on the client (issue 25 item 5, ``fedjax_inv/privacy/dp_sgd.py``).

Clipping and noise against their formulas in numpy, the engine's DP-SGD steps against the
Python reference loop's per-example clipping (``tests/reference.py``), ε against
``dp-accounting`` called directly, and the refusals.
"""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.privacy import dp_sgd
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core.data import from_client_arrays
from tests.reference import reference_run
from tests.rounds import run_rounds
from tests.trees import max_abs_diff


def test_clip_and_noise_is_the_formula_and_every_clipped_norm_is_at_most_c():
  rng = np.random.default_rng(0)
  grads = {"a": rng.normal(size=(6, 3, 2)).astype(np.float32) * 3,
           "b": rng.normal(size=(6, 4)).astype(np.float32)}
  w = np.array([1, 1, 1, 1, 1, 0], np.float32)  # the last row is padding
  clip = 5.0
  got = dp_sgd.clip_and_noise(grads, jnp.asarray(w), clip, 0.0, jnp.float32(8.0),
                              jax.random.key(0))
  flat = np.concatenate([grads["a"].reshape(6, -1), grads["b"]], axis=1)
  norms = np.linalg.norm(flat, axis=1)
  clipped = flat * np.minimum(1.0, clip / norms)[:, None]
  assert np.all(np.linalg.norm(clipped, axis=1) <= clip * (1 + 1e-6))
  assert np.any(norms > clip) and np.any(norms < clip)  # both branches are exercised
  want = (clipped * w[:, None]).sum(0) / 8.0
  np.testing.assert_allclose(np.concatenate([np.asarray(got["a"]).ravel(),
                                             np.asarray(got["b"])]), want, rtol=1e-5)
  # C = inf: the plain weighted sum
  plain = dp_sgd.clip_and_noise(grads, jnp.asarray(w), math.inf, 0.0, jnp.float32(5.0),
                                jax.random.key(0))
  np.testing.assert_allclose(np.asarray(plain["b"]), (grads["b"] * w[:, None]).sum(0) / 5,
                             rtol=1e-5)


def test_noise_std_is_sigma_c_over_the_batch_size():
  grads = {"a": jnp.zeros((4, 200_000))}
  out = dp_sgd.clip_and_noise(grads, jnp.ones(4), 0.5, 2.0, jnp.float32(4.0),
                              jax.random.key(3))
  std = float(np.std(np.asarray(out["a"])))
  assert abs(std - 2.0 * 0.5 / 4.0) < 0.01 * 0.25  # within 1 % (200,000 draws)
  assert abs(float(np.mean(np.asarray(out["a"])))) < 0.01 * 0.25


def _pool():
  from fedjax_inv import models
  rng = np.random.default_rng(4)
  xs, ys = [], []
  for _i, n in enumerate((7, 12, 5, 9, 10, 6)):
    x = (rng.normal(size=(n, 5)) * 3).astype(np.float32)
    xs.append(x)
    ys.append(((x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5)).astype(np.int32))
  return from_client_arrays(xs, ys), models.mlp(5, (6,), 3)


def _engine(alg, data, model, strategy, rounds=2, cohort=4):
  return run_rounds(alg, data, model, strategy, rounds, cohort)[0]


@pytest.mark.parametrize("strategy", [
    "scan", *(pytest.param(s, marks=pytest.mark.slow) for s in ("vmap", "chunked"))])
def test_clipped_steps_equal_the_python_loop(strategy):
  """σ = 0 and a clip that binds: the engine's per-example clipping (vmapped) equals the
  reference loop's, example by example, over shuffled epoch batches."""
  data, model = _pool()
  kw = dict(client_lr=0.3, batch_size=4, local_epochs=1)
  alg = dp_sgd.apply(make_algorithm("fedavg", **kw), dp_sgd.DPSGDSettings(0.2, 0.0))
  got = _engine(alg, data, model, strategy)
  want = reference_run(model, "multiclass", data, model.init(0), rounds=2, cohort=4,
                       key=jax.random.key(0), client_lr=0.3, batch_size=4, local_steps=1,
                       local_epochs=1, per_example_clip=0.2)
  chex.assert_trees_all_close(got, want, rtol=2e-5, atol=2e-6)
  plain = _engine(make_algorithm("fedavg", **kw), data, model, strategy)
  assert max_abs_diff(got, plain) > 1e-3  # the clip binds: not plain FedAvg


def test_no_clip_and_no_noise_is_plain_fedavg_over_a_full_batch():
  data, model = _pool()
  kw = dict(client_lr=0.3, batch_size=None, local_steps=3)
  alg = dp_sgd.apply(make_algorithm("fedavg", **kw), dp_sgd.DPSGDSettings(math.inf, 0.0))
  chex.assert_trees_all_close(_engine(alg, data, model, "vmap"),
                              _engine(make_algorithm("fedavg", **kw), data, model, "vmap"),
                              rtol=1e-5, atol=1e-6)


def test_noise_reaches_the_update_and_is_reproducible():
  data, model = _pool()
  kw = dict(client_lr=0.3, batch_size=4, local_epochs=1)
  alg = dp_sgd.apply(make_algorithm("fedavg", **kw), dp_sgd.DPSGDSettings(1.0, 1.0))
  a, b = _engine(alg, data, model, "scan"), _engine(alg, data, model, "scan")
  chex.assert_trees_all_equal(a, b)
  quiet = dp_sgd.apply(make_algorithm("fedavg", **kw), dp_sgd.DPSGDSettings(1.0, 0.0))
  assert max_abs_diff(a, _engine(quiet, data, model, "scan")) > 1e-2


@pytest.mark.parametrize("q_n,sigma,steps", [(10, 1.1, 50), (4, 0.8, 7), (40, 2.0, 200)])
def test_epsilon_equals_dp_accounting_called_directly(q_n, sigma, steps):
  import dp_accounting
  from dp_accounting import rdp
  batch, n, rounds = 4, q_n * 4, 3
  acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation
                          .ADD_OR_REMOVE_ONE)
  acc.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      batch / n, dp_accounting.GaussianDpEvent(sigma)), steps * rounds))
  want = acc.get_epsilon(1e-5)
  assert dp_sgd.client_epsilon(sigma, 1e-5, n, batch, steps, rounds) == pytest.approx(want)
  # the whole client every step: no amplification, q = 1
  full = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation
                           .ADD_OR_REMOVE_ONE)
  full.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma),
                                                 steps * rounds))
  assert dp_sgd.client_epsilon(sigma, 1e-5, n, None, steps, rounds) == pytest.approx(
      full.get_epsilon(1e-5))
  assert dp_sgd.client_epsilon(0.0, 1e-5, n, batch, steps, rounds) == math.inf


def test_record_reports_the_worst_client():
  alg = dp_sgd.apply(make_algorithm("fedavg", batch_size=4, local_epochs=2),
                     dp_sgd.DPSGDSettings(1.0, 1.0))
  sizes = [8, 40, 9]
  rec = dp_sgd.record(alg, np.array(sizes), rounds=5)
  each = {n: dp_sgd.client_epsilon(1.0, 1e-5, n, 4, 2 * math.ceil(n / 4), 5) for n in sizes}
  assert rec["epsilon"] == pytest.approx(max(each.values()))
  assert rec["worst_client_size"] == max(each, key=each.get)
  assert dp_sgd.record(make_algorithm("fedavg"), np.array(sizes), 5) is None


@pytest.mark.parametrize("name,kw,match", [
    ("fedavg", dict(batch_size=4), "drawn with replacement"),
    ("inv_fedavg", dict(batch_size=None), "not a sum over examples"),
    ("fishr_intra_geo", {}, "replaces how a step's gradient is estimated"),
])
def test_algorithms_it_cannot_cover_are_refused(name, kw, match):
  with pytest.raises(ValueError, match=match):
    dp_sgd.apply(make_algorithm(name, **kw), dp_sgd.DPSGDSettings(1.0, 1.0))


@pytest.mark.parametrize("settings,match", [
    (dp_sgd.DPSGDSettings(0.0, 1.0), "--dp-sgd-clip 0.0"),
    (dp_sgd.DPSGDSettings(1.0, -1.0), "--dp-sgd-noise-multiplier -1.0"),
    (dp_sgd.DPSGDSettings(math.inf, 1.0), "would be infinite"),
    (dp_sgd.DPSGDSettings(1.0, 1.0, delta=1.5), "--dp-sgd-delta 1.5"),
])
def test_bad_settings_are_named(settings, match):
  with pytest.raises(ValueError, match=match):
    settings.check()


# ------------------------------------------------- the pieces, one by one (mutation tests)


def _flat(tree):
  return np.concatenate([np.asarray(v, np.float64).ravel() for v in jax.tree.leaves(tree)])


def test_clip_and_noise_draws_the_documented_noise():
  """sigma < 1 (any sigma > 0 adds noise): (sum of clipped + sigma C N(0, I)) / denominator,
  one normal per leaf (flatten order) from split(key, leaves)."""
  rng = np.random.default_rng(2)
  grads = {"a": rng.normal(size=(3, 2, 2)).astype(np.float32),
           "b": rng.normal(size=(3, 4)).astype(np.float32)}
  w = np.array([1, 1, 0], np.float32)
  clip, sigma, key = 0.7, 0.6, jax.random.key(9)
  got = dp_sgd.clip_and_noise(grads, jnp.asarray(w), clip, sigma, jnp.float32(4.0), key)
  flat = np.concatenate([grads["a"].reshape(3, -1), grads["b"]], axis=1).astype(np.float64)
  scale = np.minimum(1.0, clip / np.linalg.norm(flat, axis=1)) * w
  summed = (flat * scale[:, None]).sum(0)
  ka, kb = jax.random.split(key, 2)
  noise = np.concatenate([np.asarray(jax.random.normal(ka, (2, 2))).ravel(),
                          np.asarray(jax.random.normal(kb, (4,)))])
  np.testing.assert_allclose(_flat(got), (summed + sigma * clip * noise) / 4.0, rtol=1e-5,
                             atol=1e-7)


def _estimator_case(w, batch_size, clip=0.5):
  """A linear model p = {w [3], c []}, squared error; the estimator against per-example
  gradients written out (grad_w = 2 r x, grad_c = 2 r with r = x.w + c - y)."""
  from fedjax_inv.core.algorithm import Batch
  rng = np.random.default_rng(5)
  x = rng.normal(size=(4, 3)).astype(np.float32)
  y = rng.normal(size=(4,)).astype(np.float32)
  params = {"c": jnp.float32(0.3), "w": jnp.asarray([0.5, -1.0, 2.0], jnp.float32)}

  def loss_fn(p, batch):
    r = batch.x @ p["w"] + p["c"] - batch.y
    return jnp.sum(batch.w * r * r) / jnp.sum(batch.w)

  def objective(p, batch, key):  # what an estimator gets: the default (loss, grads)
    del key
    return jax.value_and_grad(loss_fn)(p, batch)
  comp = dp_sgd.dp_sgd_component(clip, 0.0, batch_size)
  assert comp.name == "dp_sgd"
  batch = Batch(x=jnp.asarray(x), y=jnp.asarray(y), w=jnp.asarray(w))
  loss, g = comp.call("grad_estimator", objective=objective, params=params, batch=batch,
                      key=jax.random.key(0))
  r = x.astype(np.float64) @ np.asarray(params["w"], np.float64) + 0.3 - y
  per = np.concatenate([2 * r[:, None], 2 * r[:, None] * x], axis=1)  # [c, w...] per row
  scale = np.minimum(1.0, clip / np.linalg.norm(per, axis=1)) * np.asarray(w)
  denom = batch_size if batch_size is not None else np.sum(w)
  np.testing.assert_allclose(_flat(g), (per * scale[:, None]).sum(0) / denom, rtol=1e-5)
  np.testing.assert_allclose(float(loss), np.sum(np.asarray(w) * r * r) / max(np.sum(w), 1.0),
                             rtol=1e-5)
  assert np.any(np.linalg.norm(per, axis=1) > clip)  # the clip binds


@pytest.mark.parametrize("w,batch_size", [
    ([1, 1, 1, 0], 4), ([1, 1, 1, 0], None), ([0, 1, 0, 0], 4), ([1, 0, 0, 0], None)])
def test_estimator_clips_each_example_of_the_step(w, batch_size):
  _estimator_case(np.asarray(w, np.float32), batch_size)


def test_apply_wires_the_component_and_names_what_it_refuses():
  base = make_algorithm("scaffold", batch_size=4, local_epochs=1)
  alg = dp_sgd.apply(base, dp_sgd.DPSGDSettings(0.5, 1.2, delta=1e-6))
  assert [c.name for c in alg.components] == ["dp_sgd", "scaffold"]
  assert {k: alg.hparams[k] for k in ("dp_sgd_clip", "dp_sgd_noise_multiplier",
                                      "dp_sgd_delta")} == dict(
      dp_sgd_clip=0.5, dp_sgd_noise_multiplier=1.2, dp_sgd_delta=1e-6)
  with pytest.raises(ValueError, match="scaffold: DP-SGD is applied already"):
    dp_sgd.apply(alg, dp_sgd.DPSGDSettings(0.5, 1.2))
  with pytest.raises(ValueError, match=r"'fedprox': its client objective adds \['prox'\]"):
    dp_sgd.apply(make_algorithm("fedprox", batch_size=None), dp_sgd.DPSGDSettings(1.0, 1.0))
  with pytest.raises(ValueError, match="with 'fedavg': its minibatches are drawn"):
    dp_sgd.apply(make_algorithm("fedavg", batch_size=4), dp_sgd.DPSGDSettings(1.0, 1.0))


def _direct(sigma, q, count, delta=1e-5):
  """dp-accounting called directly: RDP, add-or-remove-one; q None: no sampling."""
  import dp_accounting
  from dp_accounting import rdp
  g = dp_accounting.GaussianDpEvent(sigma)
  one = g if q is None else dp_accounting.PoissonSampledDpEvent(q, g)
  acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation
                          .ADD_OR_REMOVE_ONE)
  return acc.compose(dp_accounting.SelfComposedDpEvent(one, count)).get_epsilon(delta)


def test_client_epsilon_at_sigma_one_and_for_tiny_clients():
  assert dp_sgd.client_epsilon(1.0, 1e-5, 40, 4, 5, 3) == pytest.approx(
      _direct(1.0, 0.1, 15), rel=1e-12)
  # one example, batch 1: the whole client (q = 1); a batch as large as the client too
  assert dp_sgd.client_epsilon(1.3, 1e-5, 1, 1, 5, 3) == pytest.approx(
      _direct(1.3, None, 15), rel=1e-12)
  assert dp_sgd.client_epsilon(1.3, 1e-5, 6, 8, 5, 3) == pytest.approx(
      _direct(1.3, None, 15), rel=1e-12)


def test_record_is_the_documented_summary():
  alg = dp_sgd.apply(make_algorithm("fedavg", batch_size=4, local_epochs=2),
                     dp_sgd.DPSGDSettings(0.5, 1.1, delta=1e-6))
  rec = dp_sgd.record(alg, np.array([8, 40, 9, 8]), rounds=5)
  each = {n: _direct(1.1, 4 / n, 2 * -(-n // 4) * 5, 1e-6) for n in (8, 9, 40)}
  worst = max(each, key=each.get)
  assert rec == {
      "epsilon": pytest.approx(each[worst], rel=1e-12), "delta": 1e-6,
      "noise_multiplier": 1.1, "clip": 0.5, "batch_size": 4, "worst_client_size": worst,
      "rounds": 5, "accountant": "rdp",
      "covered": "each example of a client, against everything the client sends "
                 "(sample level, every round counted)",
      "sampling": "shuffled batches of 4 per local epoch, accounted as Poisson sampling at "
                  "q = B/n (an approximation; Chua et al. 2024)"}
  # the whole client every step: every size has the same epsilon; the smallest is named.
  # A large sigma: every epsilon is below 1.
  full = dp_sgd.apply(make_algorithm("fedavg", batch_size=None, local_steps=2),
                      dp_sgd.DPSGDSettings(0.5, 50.0))
  rec = dp_sgd.record(full, np.array([12, 7, 30]), rounds=3)
  assert rec["worst_client_size"] == 7 and rec["batch_size"] is None
  assert rec["epsilon"] == pytest.approx(_direct(50.0, None, 6), rel=1e-12) and rec["epsilon"] < 1
  assert rec["sampling"] == "the whole client every step (q = 1)"

