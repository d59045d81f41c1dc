"""Every FedAvg-family algorithm, under every execution strategy, equals a slow Python loop."""
import chex
import jax
import numpy as np
import pytest

from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core import strategy
from fedjax_inv.core.engine import build_round, init_state
from tests.reference import reference_run
from tests.trees import max_abs_diff

STRATEGIES = ["vmap", "scan", "chunked"]  # "auto" resolves to one of these (tested below)

# name -> (make_algorithm kwargs, reference kwargs)
CASES = {
    "fedavg": (dict(client_lr=0.1, local_steps=3, batch_size=8),
               dict(client_lr=0.1, local_steps=3, batch_size=8)),
    "fedavg_uniform_fullbatch": (
        dict(client_lr=0.1, local_steps=2, batch_size=None, weighting="uniform"),
        dict(client_lr=0.1, local_steps=2, batch_size=None, weighting="uniform")),
    "fedsgd": (dict(server_lr=0.5), dict(client_lr=1.0, local_steps=1, batch_size=None,
                                        server_lr=0.5)),
    "fedprox": (dict(client_lr=0.1, local_steps=3, batch_size=8, mu=0.5),
                dict(client_lr=0.1, local_steps=3, batch_size=8, mu=0.5)),
    "scaffold": (dict(client_lr=0.1, local_steps=3, batch_size=8),
                 dict(client_lr=0.1, local_steps=3, batch_size=8, scaffold=True,
                      weighting="uniform")),
    "fedavgm": (dict(client_lr=0.1, local_steps=2, batch_size=8, server_lr=0.7,
                     client_optimizer="momentum"),
                dict(client_lr=0.1, local_steps=2, batch_size=8, server="momentum",
                     server_lr=0.7, client_momentum=0.9)),
    "fedadagrad": (dict(client_lr=0.1, local_steps=2, batch_size=8, server_lr=0.05),
                   dict(client_lr=0.1, local_steps=2, batch_size=8, server="adagrad",
                        server_lr=0.05)),
    "fedadam": (dict(client_lr=0.1, local_steps=2, batch_size=8, server_lr=0.05),
                dict(client_lr=0.1, local_steps=2, batch_size=8, server="adam",
                     server_lr=0.05)),
    "fedyogi": (dict(client_lr=0.1, local_steps=2, batch_size=8, server_lr=0.05),
                dict(client_lr=0.1, local_steps=2, batch_size=8, server="yogi",
                     server_lr=0.05)),
    # Algorithm.local_epochs: client i runs E*ceil(n_i/B) steps (sizes 20..50 here, so
    # 3..7 steps per epoch at B=8), each epoch a permutation; SCAFFOLD's K is the client's.
    "fedavg_epochs": (dict(client_lr=0.1, local_epochs=2, batch_size=8),
                      dict(client_lr=0.1, local_steps=None, local_epochs=2, batch_size=8)),
    "scaffold_epochs": (dict(client_lr=0.1, local_epochs=1, batch_size=8),
                        dict(client_lr=0.1, local_steps=None, local_epochs=1, batch_size=8,
                             scaffold=True, weighting="uniform")),
    "fedadam_epochs": (dict(client_lr=0.1, local_epochs=1, batch_size=16, server_lr=0.05),
                       dict(client_lr=0.1, local_steps=None, local_epochs=1, batch_size=16,
                            server="adam", server_lr=0.05)),
}


def _engine_run(model, data, alg, strategy, rounds, cohort, seed=0):
  rf = build_round(model, "binary", alg, data.num_clients, cohort, execution=strategy,
                   chunk_size=2)
  server, cs = init_state(alg, model.init(seed), data.num_clients)
  for _ in range(rounds):
    server, cs, _ = rf(server, cs, data, jax.random.key(seed))
  return server.params


@pytest.mark.parametrize("case", sorted(CASES))
# scan (what 'auto' is on CPU) in the fast tier; vmap and chunked in the slow one.
@pytest.mark.parametrize("strategy", [
    s if s == "scan" else pytest.param(s, marks=pytest.mark.slow) for s in STRATEGIES])
def test_engine_equals_python_loop(tiny_binary, case, strategy):
  data, model = tiny_binary
  alg_kw, ref_kw = CASES[case]
  name = case.split("_")[0]
  alg = make_algorithm(name, **alg_kw)
  cohort = 4  # of 5: sampling matters, and SCAFFOLD's |S|/N factor is exercised
  got = _engine_run(model, data, alg, strategy, rounds=3, cohort=cohort)
  want = reference_run(model, "binary", data, model.init(0), rounds=3, cohort=cohort,
                       key=jax.random.key(0), **ref_kw)
  chex.assert_trees_all_close(got, want, rtol=2e-4, atol=2e-5)


def test_training_changes_params_and_scaffold_state(tiny_binary):
  """Guards the comparison above against a trivially-equal no-op engine."""
  data, model = tiny_binary
  alg = make_algorithm("scaffold", client_lr=0.1, local_steps=3, batch_size=8)
  rf = build_round(model, "binary", alg, 5, 4, execution="scan")
  p0 = model.init(0)
  server, cs = init_state(alg, p0, 5)
  server, cs, m = rf(server, cs, data, jax.random.key(0))
  assert max_abs_diff(server.params, p0) > 1e-3
  sampled = set(np.asarray(m["clients"]).tolist())
  norms = [float(sum(np.sum(np.asarray(l[i]) ** 2) for l in jax.tree.leaves(cs["scaffold"])))
           for i in range(5)]
  for i in range(5):
    assert (norms[i] > 0) == (i in sampled), (i, sampled, norms)


def test_auto_resolves_by_backend():
  from fedjax_inv.core.engine import resolve_strategy
  assert resolve_strategy("auto", 10, num_devices=1, backend="cpu") == "scan"
  assert resolve_strategy("auto", 10, num_devices=1, backend="gpu") == "vmap"
  assert resolve_strategy("auto", 10, num_devices=8, backend="cpu") == "vmap"
  assert resolve_strategy("chunked", 10) == "chunked"


@pytest.mark.parametrize("unroll", [1, 3])
@pytest.mark.slow
def test_scan_unroll_and_pregather_paths_agree(tiny_binary, unroll, monkeypatch):
  """Loop unrolling and the gather-per-step fallback change nothing numerically."""
  data, model = tiny_binary
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=3, batch_size=8)
  def go():
    rf = build_round(model, "binary", alg, 5, 4, execution="scan", unroll=unroll)
    server, cs = init_state(alg, model.init(0), 5)
    server, cs, _ = rf(server, cs, data, jax.random.key(0))
    return server.params
  a = go()
  monkeypatch.setattr(strategy, "PREGATHER_BYTES", 0)  # force the per-step gather path
  b = go()
  chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-7)
