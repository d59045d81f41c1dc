"""Issue 13: S seeds batched as one program (`replicas.run_replicas`, vmap over a
replica axis) give the same histories, final models and selected rounds as S sequential
`simulation.run` calls; a diverging replica is reported without stopping the others."""
import chex
import jax
import numpy as np
import pytest

from fedjax_inv import Task
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import simulation
from fedjax_inv.runner.replicas import run_replicas


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0, 3]))}, model, {})


def _close_history(a, b):
  assert [e["round"] for e in a] == [e["round"] for e in b]
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_allclose(x[k], y[k], rtol=2e-6, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("name,hp,rpc", [
    ("fedavg", {}, 1),
    ("scaffold", {}, 1),            # per-client states carry a replica axis
    ("fedgma", {"tau": 0.4}, 4),     # server-side mask, fused rounds
])
@pytest.mark.slow
def test_batched_replicas_equal_sequential_runs(tiny_binary, name, hp, rpc):
  task = _task(tiny_binary)
  alg = make_algorithm(name, client_lr=0.1, local_steps=2, batch_size=8, **hp)
  kw = dict(rounds=9, clients_per_round=3, eval_every=3, progress=False,
            reporting={"select": ["min:ood_loss"], "last_k": 2})
  seeds = [4, 0, 7]
  seen = []
  batched = run_replicas(task, alg, seeds=seeds, rounds_per_call=rpc,
                         callback=lambda s, e: seen.append((s, e["round"])), **kw)
  assert sorted(seen) == sorted((s, r) for s in seeds for r in (3, 6, 8, 9))
  for s, b in zip(seeds, batched):
    ref = simulation.run(task, alg, seed=s, **kw)
    _close_history(b.history, ref.history)
    chex.assert_trees_all_close(b.params, ref.params, rtol=2e-6, atol=1e-7)
    assert b.selected["min:ood_loss"]["round"] == ref.selected["min:ood_loss"]["round"]
  # distinct seeds really are distinct runs
  assert batched[0].final["ood_loss"] != batched[1].final["ood_loss"]


@pytest.mark.slow
def test_a_diverging_replica_is_reported_and_the_others_finish(tiny_binary, monkeypatch):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=1, batch_size=8)
  real_init = task.model.init
  # seed 1's model starts at NaN: that replica diverges in round 1, seed 0 trains on
  monkeypatch.setattr(type(task.model), "init", lambda self, seed: jax.tree.map(
      lambda a: a * np.float32("nan") if seed == 1 else a, real_init(seed)))
  out = run_replicas(task, alg, seeds=[0, 1], rounds=6, eval_every=2, progress=False,
                     reporting=None)
  assert isinstance(out[1], simulation.DivergedError) and out[1].round == 1
  assert isinstance(out[0], simulation.RunResult) and np.isfinite(out[0].final["ood_loss"])


@pytest.mark.parametrize("seeds", [[], [1, 1]])
def test_bad_seed_lists_are_refused(tiny_binary, seeds):
  with pytest.raises(ValueError, match="seeds"):
    run_replicas(_task(tiny_binary), make_algorithm("fedavg"), seeds=seeds, rounds=2,
                 progress=False)


@pytest.mark.slow
def test_cli_replicas_batched_matches_sequential_and_says_so(tmp_path):
  import json
  from fedjax_inv import cli
  args = ["run", "--task", "linear_regression", "--algorithm", "fedavg,fedprox",
          "--seeds", "2", "--rounds", "6", "--eval-every", "3", "--no-progress"]
  assert cli.main(args + ["--replicas", "batched", "--out", str(tmp_path / "b")]) == 0
  assert cli.main(args + ["--replicas", "sequential", "--out", str(tmp_path / "s")]) == 0
  b = json.loads((tmp_path / "b" / "summary.json").read_text())
  s = json.loads((tmp_path / "s" / "summary.json").read_text())
  assert b["replicas"].startswith("batched") and s["replicas"] == "sequential"
  assert len(b["runs"]) == len(s["runs"]) == 2 * 2  # 2 algorithms x 2 seeds
  for rb, rs in zip(b["runs"], s["runs"], strict=True):
    assert (rb["algorithm"], rb["seed"]) == (rs["algorithm"], rs["seed"])
    assert rb["final"].keys() == rs["final"].keys()
    for k, v in rs["final"].items():
      np.testing.assert_allclose(rb["final"][k], v, rtol=2e-6, err_msg=k)
  rows = [json.loads(l) for l in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
  assert sorted((r["algorithm"], r["seed"], r["round"]) for r in rows) == sorted(
      (a, sd, r) for a in ("fedavg", "fedprox") for sd in (0, 1) for r in (3, 6))


@pytest.mark.parametrize("name,rpc", [("fedavg", 1), ("scaffold", 2)])
@pytest.mark.slow
def test_batched_checkpoint_resume_is_bit_identical(tiny_binary, tmp_path, name, rpc):
  """Issue 22: one training loop, so batched replicas checkpoint and resume like a single
  run: interrupted after round 5 (checkpoint at round 4), resumed, the histories, final
  models and selected models equal an uninterrupted batched run exactly, and the
  restored rounds are replayed to the callback."""
  task = _task(tiny_binary)
  alg = make_algorithm(name, client_lr=0.1, local_steps=2, batch_size=8)
  kw = dict(seeds=[4, 0], rounds=7, clients_per_round=3, eval_every=1, progress=False,
            rounds_per_call=rpc, reporting={"select": ["min:ood_loss"]})
  ref = run_replicas(task, alg, **kw)
  ckpt = tmp_path / "ckpt"

  def stop_at_5(s, entry):
    if entry["round"] == 5:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    run_replicas(task, alg, checkpoint_dir=ckpt, checkpoint_every=2, callback=stop_at_5,
                 **kw)
  from fedjax_inv.runner import checkpoint
  assert checkpoint.latest_checkpoint(ckpt) == 4
  seen = []
  out = run_replicas(task, alg, checkpoint_dir=ckpt, checkpoint_every=2,
                     callback=lambda s, e: seen.append((s, e["round"])), **kw)
  assert sorted(seen) == sorted((s, r) for s in (4, 0) for r in range(1, 8))
  for a, b in zip(out, ref):
    assert a.history == b.history  # exact floats, every round
    chex.assert_trees_all_equal(a.params, b.params)
    chex.assert_trees_all_equal(a.server_state, b.server_state)
    assert a.selected == b.selected
    chex.assert_trees_all_equal(a.selected_params, b.selected_params)


@pytest.mark.slow
def test_a_diverged_replica_stays_diverged_across_a_resume(tiny_binary, tmp_path,
                                                           monkeypatch):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=1, batch_size=8)
  real_init = task.model.init
  monkeypatch.setattr(type(task.model), "init", lambda self, seed: jax.tree.map(
      lambda a: a * np.float32("nan") if seed == 1 else a, real_init(seed)))
  kw = dict(seeds=[0, 1], rounds=6, eval_every=2, progress=False, reporting=None,
            checkpoint_dir=tmp_path / "ckpt", checkpoint_every=2)

  def stop_at_4(s, entry):
    if entry["round"] == 4:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    run_replicas(task, alg, callback=stop_at_4, **kw)
  out = run_replicas(task, alg, **kw)
  assert isinstance(out[1], simulation.DivergedError) and out[1].round == 1
  assert isinstance(out[0], simulation.RunResult) and out[0].final["round"] == 6
  ref = run_replicas(task, alg, **{**kw, "checkpoint_dir": None})
  assert out[0].history == ref[0].history
