"""The packed host pool: storage (CSR, 8-bit kept, cached on disk), cohorts streamed to the
device with the same numbers as the resident pool, per-client state only for clients seen,
streamed evaluation, and where 'auto' puts a pool."""
import json
import os

import chex
import jax
import numpy as np
import pytest

from fedjax_inv import cli, models
from fedjax_inv.runner import simulation
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core import packed
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.core.engine import build_round, init_state
from fedjax_inv.core.stream import ClientStateStore
from fedjax_inv.eval import build_evaluator
from fedjax_inv.tasks import Task, make_task

SIZES = (3, 41, 12, 7, 30, 22, 5, 18, 9)


def _arrays(seed=0, sizes=SIZES, features=6):
  rng = np.random.default_rng(seed)
  xs = [rng.integers(0, 256, (n, features)).astype(np.uint8) for n in sizes]
  ys = [(x[:, 0] > 120).astype(np.int32) for x in xs]
  return xs, ys


def _pool(seed=0):
  xs, ys = _arrays(seed)
  return packed.pack_client_arrays(xs, ys, divisor=255.0)


def _task(pool, **kw):
  return Task("packed", "binary", pool, {"ood": pool.subset([1, 4, 7])},
              models.mlp(6, (8,), 1), {}, **kw)


# ------------------------------------------------------------------------------ storage


def test_pool_stores_each_example_once_in_its_dtype_and_pads_like_from_client_arrays():
  xs, ys = _arrays()
  pool = packed.pack_client_arrays(xs, ys, divisor=255.0)
  assert pool.x.dtype == np.uint8 and pool.x.shape == (sum(SIZES), 6)
  np.testing.assert_array_equal(pool.offsets, np.concatenate([[0], np.cumsum(SIZES)]))
  assert pool.num_clients == 9 and pool.n_max == 41 and pool.feature_shape == (6,)
  assert pool.stored_bytes() < pool.padded_bytes() / 4
  want = from_client_arrays([x.astype(np.float32) / np.float32(255) for x in xs], ys)
  chex.assert_trees_all_equal(pool.padded(), want)  # bit for bit
  x, y, n = pool.gather([8, 1, 9], 48)  # 9 = N: an empty slot reads client N - 1
  assert x.shape == (3, 48, 6) and x.dtype == np.uint8
  np.testing.assert_array_equal(n, [SIZES[8], SIZES[1], SIZES[8]])
  np.testing.assert_array_equal(x[1, :41], xs[1])
  assert not x[1, 41:].any() and not y[0, SIZES[8]:].any()
  with pytest.raises(ValueError, match="width=10 < the cohort's largest client"):
    pool.gather([1], 10)


def test_pool_rejects_bad_layouts_and_lossy_8_bit_values():
  with pytest.raises(ValueError, match="client 1 has 0 examples"):
    packed.PackedPool(np.zeros((3, 2)), np.zeros(3), np.array([0, 2, 2, 3]))
  with pytest.raises(ValueError, match="offsets must run from 0 to the 3 rows"):
    packed.PackedPool(np.zeros((3, 2)), np.zeros(3), np.array([0, 2]))
  with pytest.raises(ValueError, match="not multiples of 1/255"):
    packed.pack_client_arrays([np.full((2, 2), 0.3, np.float32)], [np.zeros(2, np.int32)],
                              x_dtype=np.uint8, divisor=255.0)
  with pytest.raises(ValueError, match="client 0 has 0 examples"):
    packed.pack_client_arrays([np.zeros((0, 2))], [np.zeros(0)])
  w = packed.PoolWriter([2, 3], (2,))
  w[0] = (np.ones((2, 2)), np.zeros(2))
  with pytest.raises(ValueError, match="client 1 was never written"):
    w.pool()


def test_pool_saves_atomically_and_loads_as_a_memory_map(tmp_path):
  pool = packed.pack_client_arrays(*_arrays(), ids=tuple(f"c{i}" for i in range(9)),
                                   divisor=255.0)
  pool.save(tmp_path / "p")
  assert sorted(os.listdir(tmp_path)) == ["p"]  # no temporary folder left
  back = packed.PackedPool.load(tmp_path / "p")
  assert isinstance(back.x, np.memmap) and back.ids == pool.ids and back.divisor == 255.0
  chex.assert_trees_all_equal(back.padded(), pool.padded())
  with pytest.raises(FileExistsError, match="written once"):
    pool.save(tmp_path / "p")
  with pytest.raises(FileNotFoundError, match="no packed pool here"):
    packed.PackedPool.load(tmp_path)


def test_bucket_widths_halve_from_n_max_and_fit_the_cohort():
  for n_max in (1, 7, 475, 2000):
    widths = {packed.bucket_width(k, n_max) for k in range(1, n_max + 1)}
    assert len(widths) <= int(np.ceil(np.log2(n_max))) + 1 and max(widths) == n_max
    for k in range(1, n_max + 1):
      w = packed.bucket_width(k, n_max)
      assert k <= w and (w == 1 or -(-w // 2) < k)  # the smallest width that fits
  assert packed.bucket_width(239, 475) == 475 and packed.bucket_width(238, 475) == 238


def test_state_store_holds_only_clients_seen_and_spills_past_its_budget():
  init = {"c": np.zeros((2, 3), np.float32), "k": np.ones((), np.int32)}
  store = ClientStateStore(init, 100, budget_bytes=20 * 28)  # 28 bytes a client
  got = store.gather([5, 7])
  np.testing.assert_array_equal(got["c"], np.zeros((2, 2, 3)))
  np.testing.assert_array_equal(got["k"], [1, 1])
  new = {"c": np.arange(18, dtype=np.float32).reshape(3, 2, 3),
         "k": np.array([2, 3, 4], np.int32)}
  store.scatter([5, 100, 9], new)  # 100 = N: an empty slot, not written
  assert store.count == 2 and not store.spilled
  got = store.gather([9, 5, 6])
  np.testing.assert_array_equal(got["c"][0], new["c"][2])
  np.testing.assert_array_equal(got["c"][1], new["c"][0])
  np.testing.assert_array_equal(got["k"], [4, 2, 1])
  more = np.arange(10, 30)
  store.scatter(more, {"c": np.ones((20, 2, 3), np.float32), "k": np.full(20, 7, np.int32)})
  assert store.count == 22 and store.spilled  # room for 32 x 28 bytes > the budget
  spill = store._spill
  assert spill.is_dir() and isinstance(store.tables[0], np.memmap)
  np.testing.assert_array_equal(store.gather([9, 29])["k"], [4, 7])
  np.testing.assert_array_equal(store.dense()["k"][4:12], [1, 2, 1, 1, 1, 4, 7, 7])
  store.close()
  assert not spill.exists()


# -------------------------------------------------------------------- host == device


ALGOS = {
    "fedavg_steps": dict(name="fedavg", client_lr=0.3, local_steps=3, batch_size=4),
    "fedavg_epochs": dict(name="fedavg", client_lr=0.3, local_epochs=1, batch_size=4),
    "scaffold": dict(name="scaffold", client_lr=0.3, local_steps=3, batch_size=4),
    "fedprox_full_batch": dict(name="fedprox", client_lr=0.3, local_steps=2,
                               batch_size=None, mu=0.1),
}


def _same_runs(a, b):
  assert [h["round"] for h in a.history] == [h["round"] for h in b.history]
  for ha, hb in zip(a.history, b.history):
    assert set(ha) == set(hb)
    for k in ha:
      np.testing.assert_allclose(hb[k], ha[k], rtol=2e-5, atol=1e-6, err_msg=k)
  chex.assert_trees_all_close(a.params, b.params, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["scan", "vmap", "chunked"])
@pytest.mark.parametrize("which", sorted(ALGOS))
def test_host_pool_trains_like_the_device_pool(strategy, which):
  """Same cohorts, keys and numbers (float32 summation order aside) from the packed host
  pool streamed a cohort at a time as from the resident padded pool."""
  kw = dict(ALGOS[which])
  alg = make_algorithm(kw.pop("name"), **kw)
  task = _task(_pool())
  run = dict(rounds=4, clients_per_round=4, eval_every=2, progress=False,
             execution=strategy, chunk_size=2, seed=3)
  a = simulation.run(task, alg, pool="device", **run)
  b = simulation.run(task, alg, pool="host", **run)
  assert (a.pool["residency"], b.pool["residency"]) == ("device", "host")
  assert b.pool["compiled_round_programs"] == len(b.pool["cohort_widths"]) >= 1
  assert max(b.pool["cohort_widths"]) <= task.train.n_max
  stateful = which == "scaffold"
  assert (b.pool["clients_with_state"] > 0) == stateful
  assert b.pool["programs_at_once"] == 1  # two only when asked for (host_split)
  _same_runs(a, b)


@pytest.mark.parametrize("make", [
    lambda: make_algorithm("fediir", client_lr=0.3, local_steps=2, batch_size=4),
    lambda: make_algorithm("fedavg", client_lr=0.3, local_steps=2, batch_size=4,
                           aggregator="median")], ids=["pre_stage", "gathered"])
def test_whole_cohort_algorithms_stay_one_program_on_the_host(make):
  """A pre-stage (FedIIR's gradient mean) or a robust aggregator needs the whole cohort
  in one program: no split, same numbers as the device pool."""
  task = _task(_pool())
  run = dict(rounds=2, clients_per_round=4, eval_every=1, progress=False, seed=2,
             execution="scan")
  a = simulation.run(task, make(), pool="device", **run)
  b = simulation.run(task, make(), pool="host", **run)
  assert b.pool["programs_at_once"] == 1
  _same_runs(a, b)


def test_split_host_round_equals_one_program():
  """host_split=True (two programs at once, one per host thread) gives the one-program
  round's numbers up to float32 summation order; the default, one program, repeats
  itself bit for bit."""
  alg = make_algorithm("scaffold", client_lr=0.3, local_epochs=1, batch_size=4)
  task = _task(_pool(2))
  run = dict(rounds=3, clients_per_round=5, eval_every=1, progress=False, seed=1,
             execution="scan", pool="host")
  a = simulation.run(task, alg, host_split=True, **run)
  b = simulation.run(task, alg, **run)
  again = simulation.run(task, alg, **run)
  assert (a.pool["programs_at_once"], b.pool["programs_at_once"]) == (2, 1)
  _same_runs(a, b)
  for u, v in zip(jax.tree.leaves(b.params), jax.tree.leaves(again.params)):
    np.testing.assert_array_equal(u, v)
  assert [h["train_loss"] for h in b.history] == [h["train_loss"] for h in again.history]


def test_host_split_is_a_run_option(tmp_path, monkeypatch):
  """`--host-split` reaches the run (summary.json's pool record says two programs); the
  default is one program."""
  monkeypatch.setenv("FEDJAX_INV_CACHE_DIR", str(tmp_path / "cache"))
  for extra, want in (([], 1), (["--host-split"], 2)):
    out = tmp_path / f"run{want}"
    assert cli.main(["run", "--task", "femnist", "--source", "synthetic", "--task-arg",
                     "num_clients=12", "--algorithm", "fedavg", "--rounds", "1",
                     "--clients-per-round", "4", "--pool", "host", "--execution", "scan",
                     "--seeds", "1", "--out", str(out), "--no-progress", *extra]) == 0
    s = json.loads((out / "summary.json").read_text())
    run = s["runs"][0] if "runs" in s else s
    assert f'"programs_at_once": {want}' in json.dumps(s), run.keys()


def test_host_pool_with_poisson_sampling_and_dropout_matches():
  """Empty slots (index N) read client N - 1 and weigh 0 on both layouts."""
  from fedjax_inv.core.adversary import Participation
  base = make_algorithm("scaffold", client_lr=0.3, local_steps=2, batch_size=4)
  task = _task(_pool(1))
  run = dict(rounds=3, clients_per_round=3, eval_every=1, progress=False, seed=0,
             execution="scan")
  for alg in (base.replace(client_sampling="poisson"),
              base.replace(participation=Participation(dropout=0.4))):
    _same_runs(simulation.run(task, alg, pool="device", **run),
               simulation.run(task, alg, pool="host", **run))


def test_streamed_round_samples_the_resident_rounds_cohorts():
  pool = _pool()
  data = pool.padded()
  model = models.mlp(6, (8,), 1)
  alg = make_algorithm("fedavg", client_lr=0.3, local_steps=2, batch_size=4)
  rf = build_round(model, "binary", alg, pool.num_clients, 4, execution="scan")
  server, cs = init_state(alg, model.init(0), pool.num_clients)
  key = jax.random.key(5)
  for r in range(3):
    want = np.asarray(rf.sample(np.int32(r), key))
    server, cs, m = rf(server, cs, data, key)
    np.testing.assert_array_equal(np.asarray(m["clients"]), want)
  assert len(set(want.tolist())) == 4


def test_ditto_personal_models_on_a_host_pool():
  alg = make_algorithm("ditto", client_lr=0.3, local_steps=2, batch_size=4)
  pool = _pool()
  val = pool.subset(range(pool.num_clients))
  task = Task("p", "binary", pool, {"val": val}, models.mlp(6, (8,), 1), {})
  run = dict(rounds=2, clients_per_round=3, eval_every=1, progress=False, seed=1,
             execution="scan")
  a = simulation.run(task, alg, pool="device", **run)
  b = simulation.run(task, alg, pool="host", **run)
  assert "personal_val_mean_client_accuracy" in b.final
  _same_runs(a, b)


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("chunk_rows", [1 << 16, 16])
def test_packed_evaluation_equals_the_resident_evaluation(monkeypatch, chunk_rows):
  from fedjax_inv import eval as eval_lib
  monkeypatch.setattr(eval_lib, "CHUNK_ROWS", chunk_rows)
  pool = _pool()
  model = models.mlp(6, (8,), 1)
  params = model.init(2)
  ev = build_evaluator(model, "binary", eval_batch=8)
  want, got = ev(params, pool.padded()), ev(params, pool)
  np.testing.assert_array_equal(got["n"], want["n"])
  np.testing.assert_array_equal(got["correct"], want["correct"])
  np.testing.assert_allclose(got["loss_sum"], want["loss_sum"], rtol=1e-5)
  # a stochastic prediction (FedSR's Monte-Carlo eval) takes whole clients in chunks
  fedsr = make_algorithm("fedsr")
  m2 = fedsr.model_for(models.mlp(6, (8,), 1))
  p2 = m2.init(0)
  ev2 = build_evaluator(m2, "binary", fedsr, eval_batch=8)
  chex.assert_trees_all_close(ev2(p2, pool), ev2(p2, pool.padded()), rtol=1e-5)


# --------------------------------------------------------------------------- residency


def test_auto_keeps_small_pools_on_the_device_and_streams_large_ones(monkeypatch):
  task = _task(_pool())
  t, rec = simulation.resolve_pool(task, "auto")
  assert rec["residency"] == "device" and "fits under" in rec["reason"]
  assert not isinstance(t.train, packed.PackedPool)
  monkeypatch.setattr(simulation, "RESIDENT_MAX_BYTES", 100)
  t, rec = simulation.resolve_pool(task, "auto")
  assert rec["residency"] == "host" and "streamed" in rec["reason"]
  assert rec == simulation.pool_plan(task, "auto")  # the decision alone, nothing moved
  assert t.train is task.train
  resident = Task("r", "binary", task.train.padded(), {}, task.model, {})
  t, rec = simulation.resolve_pool(resident, "auto")
  assert t is resident and rec["residency"] == "device"
  t, rec = simulation.resolve_pool(resident, "host")
  assert isinstance(t.train, packed.PackedPool) and t.train.total == sum(SIZES)
  with pytest.raises(ValueError, match="--pool hots: unknown pool residency; did you "
                                       "mean host"):
    simulation.resolve_pool(task, "hots")


def test_host_pool_refuses_checkpoints_of_client_state(tmp_path):
  alg = make_algorithm("scaffold", client_lr=0.3, local_steps=2, batch_size=4)
  with pytest.raises(ValueError, match="does not checkpoint yet; use --pool device"):
    simulation.run(_task(_pool()), alg, rounds=2, clients_per_round=2, pool="host",
                   progress=False, checkpoint_dir=tmp_path, checkpoint_every=1)


def test_cli_pool_flag_records_where_the_pool_lived(tmp_path):
  out = tmp_path / "run"
  assert cli.main(["run", "--task", "femnist", "--source", "synthetic", "--task-arg",
                   "num_clients=6", "--task-arg", "train_eval_clients=2", "--rounds", "2",
                   "--clients-per-round", "2", "--pool", "host", "--hp", "batch_size=64",
                   "--out", str(out), "--no-progress"]) == 0
  s = json.loads((out / "summary.json").read_text())
  run = s["runs"][0] if "runs" in s else s
  pool = json.dumps(s)
  assert '"residency": "host"' in pool and "cohort_widths" in pool, run.keys()
  assert cli.main(["run", "--task", "femnist", "--pool", "gpu", "--out",
                   str(tmp_path / "x")]) == 2
  assert not (tmp_path / "x").exists()


def test_dry_run_prints_both_layouts_and_writes_nothing(tmp_path, capsys):
  out = tmp_path / "never"
  assert cli.main(["run", "--task", "femnist", "--source", "synthetic", "--task-arg",
                   "num_clients=6", "--pool", "host", "--dry-run", "--out", str(out)]) == 0
  text = capsys.readouterr().out
  assert "pool on the host (packed " in text and "padded " in text
  assert "nothing run (--dry-run)" in text and not out.exists()


def test_synthetic_femnist_is_packed_8_bit_and_cached(tmp_path, monkeypatch):
  monkeypatch.setenv("FEDJAX_INV_CACHE_DIR", str(tmp_path))
  a = make_task("femnist", source="synthetic", num_clients=5, train_eval_clients=None)
  assert isinstance(a.train, packed.PackedPool) and a.train.x.dtype == np.uint8
  folder = a.info["pool_cache"]
  assert folder and os.path.isdir(folder) and "femnist-synthetic-v2-seed0-n5" in folder
  b = make_task("femnist", source="synthetic", num_clients=5, train_eval_clients=None)
  assert isinstance(b.train.x, np.memmap)
  chex.assert_trees_all_equal(a.train.padded(), b.train.padded())
  monkeypatch.setenv("FEDJAX_INV_POOL_CACHE", "off")
  c = make_task("femnist", source="synthetic", num_clients=5, train_eval_clients=None)
  assert c.info["pool_cache"] is None
  chex.assert_trees_all_equal(a.eval_sets["test"].padded(), c.eval_sets["test"].padded())


def test_cli_refuses_checkpoints_of_client_state_on_a_host_pool_before_writing(tmp_path):
  out = tmp_path / "never"
  assert cli.main(["run", "--task", "femnist", "--source", "synthetic", "--task-arg",
                   "num_clients=6", "--pool", "host", "--algorithm", "scaffold",
                   "--checkpoint-every", "1", "--out", str(out)]) == 2
  assert not out.exists()


def test_validation_split_of_a_packed_task_equals_the_resident_one():
  from fedjax_inv.tasks import with_validation
  pool = _pool()
  a = with_validation(_task(pool), 0.2, seed=4)
  b = with_validation(Task("packed", "binary", pool.padded(), {}, _task(pool).model, {}),
                      0.2, seed=4)
  chex.assert_trees_all_equal(a.train, b.train)
  chex.assert_trees_all_equal(a.eval_sets["val"], b.eval_sets["val"])
