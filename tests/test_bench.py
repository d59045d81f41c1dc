"""The benchmark harness (fedjax_inv.benchmarks): its baseline loop (loop_round.LoopRound,
not an engine strategy) equals the engine, its FLOP counter (flops) is exact on closed
forms, and `fedjax-inv bench` writes a ratio_vs_loop per row."""
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv import models
from fedjax_inv.benchmarks import flops, harness as bench, peers, plots, summary, timing
from fedjax_inv.benchmarks import workloads
from fedjax_inv.benchmarks.loop_round import LoopRound
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.cli import main
from fedjax_inv.core import engine
from tests.trees import max_abs_diff


@pytest.mark.parametrize("name, kw", [
    ("fedavg", dict(client_lr=0.1, local_steps=3, batch_size=8)),
    ("scaffold", dict(client_lr=0.1, local_steps=2, batch_size=8)),  # per-client state
    ("fediir", dict(client_lr=0.1, local_steps=2, batch_size=8)),    # pre-stage
])
@pytest.mark.slow
def test_loop_baseline_equals_engine(tiny_binary, name, kw):
  """The Python loop over a jitted client update is the same algorithm as the engine:
  same sampled clients, minibatches, messages, state and server step."""
  data, model = tiny_binary
  alg = make_algorithm(name, **kw)
  key = jax.random.key(3)
  rf = engine.build_round(model, "binary", alg, 5, 4, execution="scan")
  loop = LoopRound(model, "binary", alg, 5, 4)
  s1, c1 = engine.init_state(alg, model.init(0), 5)
  s2, c2 = engine.init_state(alg, model.init(0), 5)
  assert loop.compile(s2, c2, data, key) > 0
  p0 = jax.tree.map(np.array, s1.params)  # a host copy (the round may donate buffers)
  for _ in range(2):
    s1, c1, m1 = rf(s1, c1, data, key)
    s2, c2, m2 = loop(s2, c2, data, key)
  np.testing.assert_array_equal(np.asarray(m1["clients"]), np.asarray(m2["clients"]))
  chex.assert_trees_all_close((s1.params, s1.extras, c1), (s2.params, s2.extras, c2),
                              rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(m1["train_loss"]), float(m2["train_loss"]), rtol=1e-5)
  assert max_abs_diff(s1.params, p0) > 1e-3


def test_loop_rejects_bad_cohort(tiny_binary):
  data, model = tiny_binary
  with pytest.raises(ValueError, match="clients_per_round=6"):
    LoopRound(model, "binary", make_algorithm("fedavg"), 5, 6)


def test_engine_has_no_loop_strategy_and_names_the_baseline(tiny_binary):
  """'loop' lives in the benchmarks, not in core: build_round refuses it with the fix."""
  data, model = tiny_binary
  with pytest.raises(ValueError, match=r"execution='loop'.*"
                     r"fedjax_inv\.benchmarks\.loop_round\.LoopRound"):
    engine.build_round(model, "binary", make_algorithm("fedavg"), 5, 4, execution="loop")
  assert "loop" not in engine.STRATEGIES


def test_harness_reexports_its_pieces():
  """harness.py is the CLI; callers (notebooks, scripts) keep using its names."""
  assert bench.run_config is timing.run_config
  assert bench.synthetic_pool is workloads.synthetic_pool
  assert bench.workloads is workloads.workloads
  assert bench.LoopRound is LoopRound and bench.count_flops is flops.count_flops
  assert bench.format_table is plots.format_table and callable(bench.machine_info)


def test_count_flops_closed_forms():
  m, k, n = 8, 16, 4
  a, b = jnp.ones((m, k)), jnp.ones((k, n))
  assert flops.count_flops(jnp.dot, a, b) == 2 * m * k * n
  xla = jax.jit(jnp.dot).lower(a, b).compile().cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert xla["flops"] == 2 * m * k * n

  def looped(a, w):  # 7 x ([m,k] @ [k,k] then tanh) under scan
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), a, None, length=7)[0]
  w = jnp.ones((k, k))
  want = 7 * (2 * m * k * k + m * k)
  assert flops.count_flops(looped, a, w) == want
  # XLA's cost analysis counts the loop body once: the harness must not rely on it.
  ca = jax.jit(looped).lower(a, w).compile().cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else ca
  assert ca["flops"] < want

  # convolution: 2 * |out| * C_in * kh * kw
  x = jnp.ones((2, 8, 8, 3))
  w = jnp.ones((3, 3, 3, 5))
  conv = lambda x, w: jax.lax.conv_general_dilated(  # noqa: E731
      x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  assert flops.count_flops(conv, x, w) == 2 * (2 * 8 * 8 * 5) * 3 * 3 * 3
  # vmap folds into the batch dimension of dot_general
  assert flops.count_flops(jax.vmap(jnp.dot), jnp.ones((5, m, k)),
                           jnp.ones((5, k, n))) == 5 * 2 * m * k * n


def test_engine_and_loop_count_the_same_work(tiny_binary):
  data, model = tiny_binary
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=3, batch_size=8)
  key = jax.random.key(0)
  s, c = engine.init_state(alg, model.init(0), 5)
  per_strategy = [flops.count_flops(engine.build_round(model, "binary", alg, 5, 4,
                                                       execution=st, jit=False),
                                    s, c, data, key)
                  for st in ("vmap", "scan", "chunked")]
  # the same model work; only the summation of client statistics differs slightly
  assert max(per_strategy) == pytest.approx(min(per_strategy), rel=0.02)
  loop = LoopRound(model, "binary", alg, 5, 4)
  loop.compile(s, c, data, key)
  # (the masked aggregation's selects are counted per call in the loop: ~1.2% here)
  assert flops.loop_flops(loop, s, c, data, key) == pytest.approx(per_strategy[0], rel=0.02)
  # 4 clients x 3 steps x (forward + backward >= 2 forward matmuls of a 6-8-1 MLP on 8
  # examples) is the bulk of the work
  forward = 2 * 8 * (6 * 8 + 8 * 1)
  assert 4 * 3 * 2 * forward < per_strategy[0] < 4 * 3 * 6 * forward


def _rrow(impl, C, t, workload="mlp_fedavg", source="fedjax_inv"):
  return dict(workload=workload, impl=impl, clients=C, round_s=t, source=source,
              ratio_vs_loop=None)


def test_ratio_vs_loop_direction_and_grouping():
  """ratio_vs_loop is loop time / row time: > 1 for a row faster than the loop, < 1 for
  a slower one, exactly 1 for the loop itself; only against the loop of the same
  workload and C, and rows without a timing or without a loop keep None."""
  rows = [_rrow("loop", 8, 3.0), _rrow("auto", 8, 1.0), _rrow("scan", 8, 6.0),
          _rrow("vmap", 8, None), _rrow("loop", 4, 1.0), _rrow("auto", 4, 4.0),
          _rrow("auto", 8, 0.5, "mlp_fedsgd")]
  assert summary.add_ratios_vs_loop(rows) is rows
  r = {(x["workload"], x["impl"], x["clients"]): x["ratio_vs_loop"] for x in rows}
  assert r["mlp_fedavg", "loop", 8] == 1.0 and r["mlp_fedavg", "loop", 4] == 1.0
  assert r["mlp_fedavg", "auto", 8] == pytest.approx(3.0)   # 3x faster than the loop
  assert r["mlp_fedavg", "scan", 8] == pytest.approx(0.5)   # 2x slower
  assert r["mlp_fedavg", "auto", 4] == pytest.approx(0.25)  # against C=4's loop, not C=8's
  assert r["mlp_fedavg", "vmap", 8] is None                 # not timed
  assert r["mlp_fedsgd", "auto", 8] is None                 # no loop row of its workload


def test_summary_and_peer_merge_compute_ratios():
  row = _rrow
  rows = summary.add_ratios_vs_loop(
      [row("loop", 1000, 2.0), row("auto", 1000, 1.0), row("loop", 10, 0.1),
       row("auto", 10, 0.2), row("auto", 1000, 1.2, "mlp_fishr_inter_geo")])
  merged = peers.merge_peers(rows, [dict(row("torch 2.13.0 loop", 1000, 6.0,
                                             source="peer"))])
  peer = merged[-1]
  assert peer["ratio_vs_loop"] == pytest.approx(2.0 / 6.0)
  s = summary.summarize(merged)
  assert s["auto_vs_loop_at_1000"] == pytest.approx(2.0)
  assert s["auto_vs_loop_min"] == pytest.approx(0.5)
  assert s["auto_vs_torch_loop"][1000] == pytest.approx(6.0)
  assert s["fishr_inter_geo_vs_fedavg"][1000] == pytest.approx(1.2)


def test_summary_auto_vs_pfl_uses_pfls_fastest_layout_per_workload():
  row = _rrow
  rows = [row("auto", 100, 0.5), row("auto", 100, 2.0, "cnn_fedavg"),
          row("pfl 0.6.0 (torch 2.13, 1x1)", 100, 3.0, source="peer"),
          row("pfl 0.6.0 (torch 2.13, 2x1)", 100, 1.5, source="peer"),
          row("pfl 0.6.0 (torch 2.13, 2x1)", 100, 3.0, "cnn_fedavg", source="peer"),
          row("torch 2.13.0 loop", 100, 0.1, source="peer")]  # not pfl: ignored
  s = summary.summarize(rows)
  assert s["auto_vs_pfl"] == {"mlp_fedavg": {100: pytest.approx(3.0)},
                              "cnn_fedavg": {100: pytest.approx(1.5)}}


def test_run_peers_reports_a_missing_environment(tmp_path):
  rows, notes = peers.run_peers(str(tmp_path / "no-python"), [10], 1, 2, timeout_s=5)
  assert rows == [] and "setup.sh" in notes[0]
  rows, notes = peers.run_peers(str(tmp_path / "no-python"), [10], 1, 2, timeout_s=5,
                                script="bench_pfl.py", setup="setup_pfl.sh")
  assert rows == [] and notes[0].startswith("bench_pfl:") and "setup_pfl.sh" in notes[0]


@pytest.mark.slow
def test_cli_bench_writes_rows_with_ratio_vs_loop(tmp_path, capsys):
  out = tmp_path / "bench.json"
  png = tmp_path / "t.png"
  rc = main(["bench", "--workloads", "mlp", "--clients", "4,8", "--impls", "loop,auto",
             "--rounds", "2", "--warmup", "1", "--no-matmul-peak", "--json", str(out),
             "--plot", str(png)])
  assert rc == 0
  payload = json.loads(out.read_text())
  rows = payload["rows"]
  assert {(r["impl"], r["clients"]) for r in rows} == {
      (i, c) for i in ("loop", "auto") for c in (4, 8)}
  for r in rows:
    assert r["round_s"] > 0 and r["rounds_timed"] == 2
    assert r["round_s_min"] <= r["round_s"] <= r["round_s_max"]
    assert r["client_updates_per_s"] == pytest.approx(r["clients"] / r["round_s"])
    assert r["gflop_per_round"] > 0
  for C in (4, 8):
    loop = next(r for r in rows if r["impl"] == "loop" and r["clients"] == C)
    auto = next(r for r in rows if r["impl"] == "auto" and r["clients"] == C)
    assert loop["ratio_vs_loop"] == 1.0
    # The written ratio is the loop's time over the row's: the faster row has ratio > 1.
    assert auto["ratio_vs_loop"] == pytest.approx(loop["round_s"] / auto["round_s"])
    assert auto["strategy"] == engine.build_round(
        models.mlp(784, (128,), 10), "multiclass", make_algorithm("fedavg"), C, C,
        execution="auto", feature_shape=(28, 28, 1)).strategy
  # FLOPs per round scale with the cohort, and the loop counts the engine's work
  f4, f8 = (next(r for r in rows if r["impl"] == "auto" and r["clients"] == C)
            ["gflop_per_round"] for C in (4, 8))
  assert f8 == pytest.approx(2 * f4, rel=0.05)
  loop8 = next(r for r in rows if r["impl"] == "loop" and r["clients"] == 8)
  assert loop8["gflop_per_round"] == pytest.approx(f8, rel=0.02)
  assert payload["meta"]["jax"] == jax.__version__
  assert png.stat().st_size > 1000
  text = capsys.readouterr().out
  assert "ratio" in text and "mlp_fedavg" in text


@pytest.mark.parametrize("argv, match", [
    (["--impls", "loop,gpu"], "--impls 'gpu'"),
    (["--clients", "0"], "--clients 0"),
    (["--workloads", "resnet"], "--workloads 'resnet'"),
    (["--rounds", "0"], "--rounds 0"),
])
def test_cli_bench_rejects_bad_flags(argv, match, capsys):
  assert main(["bench", "--no-matmul-peak"] + argv) == 2
  assert match in capsys.readouterr().err


def test_mlp_step_shapes_and_shape_peak():
  # 784-128-10 at batch 32: fwd + weight grad per layer, input grad above the first.
  assert flops.mlp_step_shapes(32, (784, 128, 10)) == [
      (32, 784, 128), (784, 32, 128), (32, 128, 10), (128, 32, 10), (32, 10, 128)]
  assert flops.measure_shape_peak([(4, 5, 6)], iters=3, reps=1) > 0
  with pytest.raises(ValueError, match="shapes"):
    flops.measure_shape_peak([(4, 0, 6)])


def _torch_workload():
  """benchmarks/peers/torch_workload.py (the pfl side's models; imports torch lazily)."""
  import importlib.util
  import pathlib
  path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "peers" / \
      "torch_workload.py"
  spec = importlib.util.spec_from_file_location("_bench_torch_workload", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_cifar10_workload_is_pfls_setting_with_the_same_parameter_count():
  """`--workloads cifar10` is pfl-research's CIFAR10 setting: its simple CNN with the
  same parameter count as the torch model bench_pfl.py trains (1,626,442, by hand from the
  layer shapes when torch is absent), 50 images [32, 32, 3] a client, 1 epoch of batch 10
  (5 steps) at lr 0.1."""
  from fedjax_inv.benchmarks import cifar10_cnn
  from fedjax_inv.core.client import max_client_steps
  (w,) = workloads.workloads(["cifar10"])
  assert workloads.workloads(["cnn_cifar10_fedavg"]) == [w]
  assert (w.name, w.feature_shape, w.n_per_client) == ("cifar10_fedavg", (32, 32, 3), 50)
  model = w.make_model()
  params = model.init(0)
  shapes = sorted(tuple(a.shape) for a in jax.tree.leaves(params))
  assert shapes == sorted([(3, 3, 3, 32), (32,), (3, 3, 32, 64), (64,), (12544, 128),
                           (128,), (128, 10), (10,)])
  by_hand = (3 * 3 * 3 * 32 + 32) + (3 * 3 * 32 * 64 + 64) + (12544 * 128 + 128) + (
      128 * 10 + 10)
  n = sum(a.size for a in jax.tree.leaves(params))
  tw = _torch_workload()
  assert n == by_hand == cifar10_cnn.PARAMS == tw.EXPECTED_PARAMS["cifar10"] == 1_626_442
  try:
    import torch  # noqa: F401
  except ImportError:
    pass
  else:
    assert tw.param_count(tw.torch_body("cifar10")) == n
  alg, note = w.make_algorithm()
  assert note == "" and alg.batch_size == tw.CIFAR10_BATCH == 10
  assert alg.hparams["client_lr"] == tw.CIFAR10_LR and alg.local_epochs == tw.CIFAR10_EPOCHS
  assert max_client_steps(alg, w.n_per_client) == 5
  x = jnp.zeros((2, 32, 32, 3))
  assert model.apply(params, x).shape == (2, 10)
  assert getattr(model, "stochastic", False)  # dropout in local training, as in pfl


def test_count_flops_counts_while_bodies_by_trip_count():
  def f(x):
    return jax.lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] @ c[1]),
                              (0, x))[1]
  x = jnp.ones((4, 4))
  once = flops.count_flops(f, x)
  assert flops.count_flops(f, x, while_trips=5) == pytest.approx(5 * once)
  assert once >= 2 * 4 * 4 * 4


def test_gpu_side_by_side_table_names_pfls_fastest_layout(tmp_path):
  from fedjax_inv.benchmarks import side_by_side_table as sbs
  ours = [dict(workload="cnn_fedavg", clients=1000, impl="auto", strategy="chunked",
               client_updates_per_s=2000.0, device_peak_mb=900.0, device_peak_exact=True),
          dict(workload="cnn_fedavg", clients=1000, impl="chunked", strategy="chunked",
               client_updates_per_s=2000.0, device_peak_mb=900.0, device_peak_exact=True),
          dict(workload="cnn_fedavg", clients=1000, impl="vmap", strategy="vmap",
               client_updates_per_s=400.0, device_peak_mb=5000.0, device_peak_exact=False)]
  pfl = [dict(workload="cnn_fedavg", clients=1000, processes=p, threads=16 // p,
              dist_backend="gloo" if p > 1 else "pfl", client_updates_per_s=u,
              device_mem_peak_mb=100.0 * p) for p, u in ((1, 200.0), (4, 500.0), (8, 400.0))]
  for name, rows in (("a", ours[:1]), ("b", ours[1:]), ("p", pfl)):
    (tmp_path / f"{name}.json").write_text(json.dumps(dict(meta={}, rows=rows, notes=[])))
  merged = sbs.merge(str(tmp_path / "ours.json"), [str(tmp_path / "a.json"),
                                                   str(tmp_path / "b.json"),
                                                   str(tmp_path / "missing.json")])
  assert len(merged["rows"]) == 3 and "missing.json" in merged["notes"][0]
  (tmp_path / "pfl.json").write_text((tmp_path / "p.json").read_text())
  line = sbs._gpu_main([str(tmp_path)]).splitlines()[2]
  assert "2,000.0 (chunked)" in line and "500.0 (4 procs x 4 thr, gloo)" in line
  assert "| 4.00× | 4.00× | 900 / 400 |" in line
