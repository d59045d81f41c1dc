"""Issue 23 item 2 (and issue 13's 'probe'): `auto` chosen by measurement with a cache.
`execution='probe'` / a long `auto` run on a cache miss time the candidate strategies on
the run's own round (median of interleaved repeats), keep the fastest, record and cache
it; a later `auto` run with the same round takes it from the cache without measuring; a
short run on a cache miss, replicas and `execution='rule'` take the fixed rule, so they
never pay for a measurement."""
import json

import chex
import jax

import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv import Task
from fedjax_inv.runner import auto_strategy, simulation
from fedjax_inv.algorithms import make_algorithm


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("FEDJAX_INV_CACHE_DIR", str(tmp_path / "cache"))
  return tmp_path / "cache" / auto_strategy.CACHE_FILE


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0, 3]))}, model, {})


ALG = dict(client_lr=0.1, local_steps=2, batch_size=8)
KW = dict(eval_every=2, seed=1, progress=False, reporting=None)


def _no_measuring(*a, **k):
  raise AssertionError("measured, but it should not have")


@pytest.mark.slow
def test_probe_keeps_the_fastest_measured_strategy_and_records_it(tiny_binary, own_cache):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", **ALG)
  res = simulation.run(task, alg, execution="probe", rounds=4, **KW)
  times = res.probe["seconds_per_round"]
  assert set(times) == {"scan", "vmap"}  # 5 clients: no 'chunked' candidate
  assert all(t > 0 for t in times.values())
  assert res.probe["chosen"] == min(times, key=times.get) == res.strategy
  assert res.probe["by"] == "measured"
  assert res.report()["execution_probe"] == res.probe
  ref = simulation.run(task, alg, execution=res.strategy, rounds=4, **KW)
  assert res.history == ref.history  # the probe's rounds do not leak into the run
  assert ref.probe is None
  cache = json.loads(own_cache.read_text())
  (entry,) = cache.values()
  assert entry["chosen"] == res.strategy and entry["key"]["cohort"] == 5


@pytest.mark.slow
def test_auto_measures_a_long_run_once_then_reads_the_cache(tiny_binary, monkeypatch):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", **ALG)
  monkeypatch.setattr(auto_strategy, "MEASURE_MIN_ROUNDS", 4)  # 'long' = 4 rounds here
  first = simulation.run(task, alg, rounds=4, **KW)
  assert first.probe["by"] == "measured"
  monkeypatch.setattr(auto_strategy, "measure", _no_measuring)
  again = simulation.run(task, alg, rounds=4, **KW)
  assert again.probe["by"] == "cache" and again.strategy == first.strategy
  assert again.probe["seconds_per_round"] == first.probe["seconds_per_round"]
  assert again.history == first.history
  # Another round shape (cohort) is another key: not in the cache, and too short to
  # measure now -> the fixed rule.
  other = simulation.run(task, alg, rounds=3, clients_per_round=3, **KW)
  assert other.probe["by"] == "rule" and "too short" in other.probe["why"]


def test_a_short_run_on_a_cache_miss_takes_the_fixed_rule_and_measures_nothing(
    tiny_binary, monkeypatch, own_cache):
  """A 10-round run must not get slower because of the timing."""
  monkeypatch.setattr(auto_strategy, "measure", _no_measuring)
  res = simulation.run(_task(tiny_binary), make_algorithm("fedavg", **ALG), rounds=2, **KW)
  assert res.probe["by"] == "rule" and res.strategy == "scan"  # one CPU device
  assert not own_cache.exists()


def test_rule_never_reads_the_cache_and_a_broken_cache_is_ignored(tiny_binary, own_cache,
                                                                  monkeypatch):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", **ALG)
  with simulation.matmul_precision("highest"):  # a run's key holds its precision
    key = auto_strategy.round_key(task, task.model, alg, 5, 1)
  auto_strategy.store(key, "vmap", {"vmap": 0.001, "scan": 0.002})
  res = simulation.run(task, alg, rounds=2, execution="rule", **KW)
  assert res.probe["by"] == "rule" and res.strategy == "scan"
  res = simulation.run(task, alg, rounds=2, **KW)  # 'auto': the cached (fake) choice
  assert res.probe["by"] == "cache" and res.strategy == "vmap"
  # another precision is another key: a miss (a short run then takes the fixed rule)
  res = simulation.run(task, alg, rounds=2, precision="tf32", **KW)
  assert res.probe["by"] == "rule" and res.strategy == "scan"
  own_cache.write_text("{not json")
  monkeypatch.setattr(auto_strategy, "measure", _no_measuring)
  res = simulation.run(task, alg, rounds=2, **KW)
  assert res.probe["by"] == "rule"


def test_the_key_names_what_a_round_speed_depends_on(tiny_binary):
  task = _task(tiny_binary)
  a = make_algorithm("fedavg", **ALG)
  k = auto_strategy.round_key(task, task.model, a, 5, 1)
  assert k == auto_strategy.round_key(task, task.model, make_algorithm("fedavg", **ALG), 5, 1)
  for other in (auto_strategy.round_key(task, task.model, a, 4, 1),
                auto_strategy.round_key(task, task.model, a, 5, 2),
                auto_strategy.round_key(task, task.model,
                                        make_algorithm("fedavg", **dict(ALG, batch_size=4)),
                                        5, 1),
                auto_strategy.round_key(task, task.model, make_algorithm("fedprox", **ALG),
                                        5, 1)):
    assert other != k
  assert {"device_kind", "jax", "jaxlib", "feature_shape", "n_max"} <= set(k)


class _FakeClock:
  """``time.perf_counter`` that only advances when a fake round says so: the measured
  times are exact, whatever the machine's load."""
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


class _FakeRound:
  """A 'round function' whose wall time is scripted per call (seconds of ``clock``)."""
  def __init__(self, name, times, clock):
    self.strategy, self.times, self.clock = name, list(times), clock

  def __call__(self, server, cstates, data, key):
    self.clock.now += self.times.pop(0)
    return jnp.zeros(()), jnp.zeros(()), {}


def test_measure_takes_the_median_of_interleaved_repeats(monkeypatch):
  """One slow burst (load) on the otherwise faster candidate does not decide: medians."""
  clock = _FakeClock()
  monkeypatch.setattr(auto_strategy.time, "perf_counter", clock)
  # per candidate: 1 compiling call, then repeats x rounds timed calls
  scan = _FakeRound("scan", [0, 0.09, 0.01, 0.01], clock)  # one burst, else 10 ms
  vmap = _FakeRound("vmap", [0, 0.03, 0.03, 0.03], clock)
  built, times = auto_strategy.measure({"scan": scan, "vmap": vmap}.__getitem__,
                                       ["scan", "vmap"], jnp.zeros(()), jnp.zeros(()), None,
                                       rounds=1, repeats=3)
  assert min(times, key=times.get) == "scan"
  assert times["scan"] == pytest.approx(0.01, abs=1e-12)
  assert times["vmap"] == pytest.approx(0.03, abs=1e-12)


def test_replicas_take_the_fixed_rule(tiny_binary, monkeypatch):
  from fedjax_inv.runner.replicas import run_replicas
  monkeypatch.setattr(auto_strategy, "measure", _no_measuring)
  monkeypatch.setattr(auto_strategy, "MEASURE_MIN_ROUNDS", 1)
  res = run_replicas(_task(tiny_binary), make_algorithm("fedavg", **ALG), seeds=[0, 1],
                     rounds=2, progress=False, reporting=None)
  assert all(r.probe["by"] == "rule" for r in res)


def test_rule_and_probe_are_valid_cli_choices_and_land_in_summary(tmp_path):
  from fedjax_inv import cli
  for mode in ("probe", "rule"):
    out = tmp_path / mode
    assert cli.main(["run", "--task", "linear_regression", "--rounds", "3", "--execution",
                     mode, "--out", str(out), "--no-progress"]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["execution"] == s["execution_probe"]["chosen"]
    assert s["execution_probe"]["by"] == {"probe": "measured", "rule": "rule"}[mode]
  assert cli.main(["run", "--task", "linear_regression", "--execution", "fastest"]) == 2


def test_the_patches_form_is_a_candidate_for_convolutions_on_an_accelerator():
  from fedjax_inv import models
  cnn, mlp = models.cnn(1, channels=(4,), num_outputs=3), models.mlp(4, (8,), 3)
  assert auto_strategy.candidates(100, cnn, (8, 8, 1), backend="gpu") == [
      "scan", "vmap", "chunked", "vmap+patches", "chunked+patches"]
  assert auto_strategy.candidates(10, cnn, (8, 8, 1), backend="tpu") == [
      "scan", "vmap", "vmap+patches"]
  assert auto_strategy.candidates(100, cnn, (8, 8, 1), backend="cpu") == [
      "scan", "vmap", "chunked"]
  assert auto_strategy.candidates(100, mlp, (4,), backend="gpu") == [
      "scan", "vmap", "chunked"]


def _image_task(n_clients=4):
  from fedjax_inv import models
  from fedjax_inv.core.data import from_client_arrays
  rng = np.random.default_rng(0)
  xs = [rng.uniform(size=(12, 6, 6, 1)).astype(np.float32) for _ in range(n_clients)]
  ys = [rng.integers(0, 3, size=12).astype(np.int32) for _ in range(n_clients)]
  data = from_client_arrays(xs, ys)
  return Task("tiny_images", "multiclass", data, {"ood": data.take(np.array([0]))},
              models.cnn(1, channels=(3, 4), num_outputs=3), {})


@pytest.mark.slow
def test_a_measured_patches_choice_runs_records_and_pins(monkeypatch, own_cache):
  """When the measurement keeps 'vmap+patches' (here on the CPU, with the backend list
  widened and a measurement that prefers it), the run trains with the patches form, says
  so in its record and cache, and matches a run pinned to 'vmap' to float32 tolerance; a
  run pinned to 'vmap+patches' repeats it bit for bit."""
  task = _image_task()
  alg = make_algorithm("fedavg", **ALG)
  monkeypatch.setattr(auto_strategy, "PATCHES_BACKENDS", ("cpu",))
  seen = []

  def prefer_patches(build, candidates, *a, **k):
    seen.extend(candidates)
    built = {c: build(c) for c in candidates}
    return built, {c: 1.0 if c == "vmap+patches" else 2.0 for c in built}

  monkeypatch.setattr(auto_strategy, "measure", prefer_patches)
  kw = dict(KW, clients_per_round=4)
  res = simulation.run(task, alg, rounds=2, execution="probe", **kw)
  assert seen == ["scan", "vmap", "vmap+patches"]
  assert res.probe["chosen"] == res.strategy == "vmap+patches"
  assert json.loads(own_cache.read_text()).popitem()[1]["chosen"] == "vmap+patches"
  pinned = simulation.run(task, alg, rounds=2, execution="vmap+patches", **kw)
  plain = simulation.run(task, alg, rounds=2, execution="vmap", **kw)
  assert pinned.strategy == "vmap+patches" and plain.strategy == "vmap"
  for a, b in zip(jax.tree.leaves(pinned.params), jax.tree.leaves(res.params)):
    np.testing.assert_array_equal(a, b)
  chex.assert_trees_all_close(res.params, plain.params, rtol=1e-5, atol=1e-6)


def test_the_fixed_rule_takes_the_patches_form_for_a_convnet_on_a_gpu(monkeypatch,
                                                                      tiny_binary):
  """'auto' by the fixed rule (as a streamed pool or a short run takes it), where the
  client axis is vmapped (a GPU: here the rule's starting strategy and the patches
  backends are pointed at the CPU): a ConvNet runs 'vmap+patches', the same compiled
  round as a run pinned to it, bit for bit; a dense model keeps 'vmap'."""
  from fedjax_inv.core import memory, strategy
  monkeypatch.setattr(memory, "CONV_PATCHES_BACKENDS", ("cpu",))
  monkeypatch.setattr(strategy, "base_strategy", lambda *a, **k: "vmap")
  task, alg = _image_task(), make_algorithm("fedavg", **ALG)
  kw = dict(KW, clients_per_round=4)
  res = simulation.run(task, alg, rounds=2, execution="rule", **kw)
  assert res.strategy == "vmap+patches"
  assert res.probe["by"] == "rule" and res.probe["chosen"] == "vmap+patches"
  pinned = simulation.run(task, alg, rounds=2, execution="vmap+patches", **kw)
  for a, b in zip(jax.tree.leaves(pinned.params), jax.tree.leaves(res.params)):
    np.testing.assert_array_equal(a, b)
  dense = simulation.run(_task(tiny_binary), alg, rounds=1, execution="rule", **KW)
  assert dense.strategy == "vmap"


def test_batched_replicas_run_the_patches_form_like_sequential_runs():
  """Seeds batched as one program (what `--replicas auto` does on a GPU) over a round in
  the patches form (what `auto` picks for a ConvNet on a GPU) train each seed as its own
  run in that form does, and as the plain convolution does, to float32 rounding. One
  round: under the suite's XLA optimization level 0, a second round of this tiny ConvNet
  lets the batched and sequential programs drift apart by up to 6 % with either form (at
  XLA's default level they agree to 1e-5 over 5 rounds)."""
  from fedjax_inv.runner.replicas import run_replicas
  task, alg = _image_task(), make_algorithm("fedavg", **ALG)
  kw = dict(rounds=1, clients_per_round=4, eval_every=1, progress=False, reporting=None)
  batched = run_replicas(task, alg, seeds=[0, 5], execution="vmap+patches", **kw)
  for s, b in zip([0, 5], batched):
    ref = simulation.run(task, alg, seed=s, execution="vmap+patches", **kw)
    plain = simulation.run(task, alg, seed=s, execution="vmap", **kw)
    chex.assert_trees_all_close(b.params, ref.params, rtol=2e-5, atol=1e-6)
    chex.assert_trees_all_close(b.params, plain.params, rtol=2e-5, atol=1e-6)
  assert not np.array_equal(jax.tree.leaves(batched[0].params)[0],
                            jax.tree.leaves(batched[1].params)[0])


def test_a_patches_name_is_refused_for_scan_before_anything_compiles(tiny_binary):
  with pytest.raises(ValueError, match="scan\\+patches.*choose one of"):
    simulation.run(_task(tiny_binary), make_algorithm("fedavg", **ALG), rounds=1,
                   execution="scan+patches", **KW)
