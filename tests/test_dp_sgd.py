"""Sample-level DP-SGD on the client (issue 25 item 5, ``fedjax_inv/dp_sgd.py``).

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

from fedjax_inv import dp_sgd
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
  for i, n in enumerate((7, 12, 5, 9, 10, 6)):
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
