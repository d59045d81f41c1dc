"""Persistent client optimizer state (``Algorithm.client_optimizer_state``): with
'persistent' every pool client keeps its client-chain state (e.g. SGD momentum) across the
rounds it takes part in, as FedSR's official code creates each client's optimizer once;
'restart' (FedAvg's ClientUpdate) re-initializes it every round. Checked against a plain
per-client Python loop, across every execution strategy, replicas, sweeps and a
checkpoint + resume."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import chex
import pytest

from tests.trees import max_abs_diff

from fedjax_inv.runner import checkpoint, simulation
from fedjax_inv.algorithms import make_algorithm, registry
from fedjax_inv.benchmarks.loop_round import LoopRound
from fedjax_inv.core.algorithm import CLIENT_OPT_STATE, Component
from fedjax_inv.core.engine import build_round, init_state
from fedjax_inv.tasks import Task

K, B, LR, MOM = 3, 8, 0.1, 0.9
ROUNDS = 4


def _alg(state, **kw):
  return make_algorithm("fedavg", client_lr=LR, client_optimizer="momentum", local_steps=K,
                        batch_size=B, client_optimizer_state=state, **kw)


# --------------------------------------------------------------------------------------
# An independent reference: a Python loop over clients, plain jax + optax
# --------------------------------------------------------------------------------------


def _reference(model, data, params, *, rounds, cohort, key, persistent):
  """FedAvg (McMahan et al. 2017, Alg. 1) with heavy-ball SGD clients. Each client's
  optax state is created once (``persistent``) or at the start of every round; the
  client parameters always restart from the global model. Server: size-weighted mean of
  the client updates, SGD with lr 1. Shares with the engine only its documented draws
  (sampled clients, minibatch indices). Returns (params, per-client optax states,
  per-round sampled client lists)."""
  N = data.num_clients
  x_all, y_all, n_all = np.asarray(data.x), np.asarray(data.y), np.asarray(data.n)
  opt = optax.sgd(LR, momentum=MOM)
  states = [opt.init(params) for _ in range(N)]  # each client's optimizer, created once

  def loss(p, x, y):
    logits = model.apply(p, x).reshape(y.shape)
    return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, y.astype(jnp.float32)))
  grad = jax.jit(jax.grad(loss))
  sampled = []
  for rnd in range(rounds):
    # documented randomness: per-round key, clients without replacement, client key by
    # pool index, then (train, message) -> (batch, loss) -> randint [K, B] over [0, n)
    k_sample, k_clients = jax.random.split(jax.random.fold_in(key, rnd))
    idx = [int(i) for i in np.asarray(
        jax.random.choice(k_sample, N, (cohort,), replace=False))]
    sampled.append(idx)
    deltas, weights = [], []
    for i in idx:
      k_train, _ = jax.random.split(jax.random.fold_in(k_clients, i))
      k_batch, _ = jax.random.split(k_train)
      n = int(n_all[i])
      batches = np.asarray(jax.random.randint(k_batch, (K, B), 0, n))
      state = states[i] if persistent else opt.init(params)
      p = params  # the client's parameters restart from the global model
      for b in batches:
        upd, state = opt.update(grad(p, x_all[i][b], y_all[i][b]), state, p)
        p = optax.apply_updates(p, upd)
      states[i] = state
      deltas.append(jax.tree.map(jnp.subtract, params, p))
      weights.append(float(n))
    wsum = sum(weights)
    mean = jax.tree.map(lambda *ds: sum(w * d for w, d in zip(weights, ds)) / wsum, *deltas)
    params = jax.tree.map(lambda w, g: w - 1.0 * g, params, mean)
  return params, states, sampled


def _engine(model, data, alg, cohort, execution="scan", rounds=ROUNDS, seed=0):
  if execution == "loop":  # the benchmark baseline: built directly, not an engine strategy
    rf = LoopRound(model, "binary", alg, data.num_clients, cohort)
  else:
    rf = build_round(model, "binary", alg, data.num_clients, cohort, execution=execution,
                     chunk_size=2)
  server, cs = init_state(alg, model.init(seed), data.num_clients)
  for _ in range(rounds):
    server, cs, _ = rf(server, cs, data, jax.random.key(seed))
  return server, cs


_maxdiff = max_abs_diff  # structure and shapes are checked first (tests/trees.py)


TOL = dict(rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("cohort", [5, 2], ids=["full", "partial"])
@pytest.mark.slow
def test_persistent_equals_a_loop_that_keeps_momentum(tiny_binary, cohort):
  data, model = tiny_binary
  p0 = model.init(0)
  server, cs = _engine(model, data, _alg("persistent"), cohort)
  want, want_states, sampled = _reference(model, data, p0, rounds=ROUNDS, cohort=cohort,
                                          key=jax.random.key(0), persistent=True)
  chex.assert_trees_all_close(server.params, want, **TOL)
  # every pool client's momentum buffer is the one it left its last round with (zeros
  # for a client never sampled), and the chain's structure is optax's own
  got_states = cs[CLIENT_OPT_STATE]["client_optimizer"]
  for i in range(data.num_clients):
    chex.assert_trees_all_close(jax.tree.map(lambda a: a[i], got_states), want_states[i],
                                **TOL)
  if cohort < data.num_clients:
    # the draw exercises a client that skips a round and comes back (its momentum must
    # be the one it left with, not the one of the round it skipped)
    assert any(i in sampled[r] and i not in sampled[r + 1] and
               any(i in sampled[s] for s in range(r + 2, ROUNDS))
               for i in range(data.num_clients) for r in range(ROUNDS - 2)), sampled
  # restart: the same engine run equals a loop that re-initializes every round ...
  server_r, cs_r = _engine(model, data, _alg("restart"), cohort)
  want_r, _, _ = _reference(model, data, p0, rounds=ROUNDS, cohort=cohort,
                            key=jax.random.key(0), persistent=False)
  chex.assert_trees_all_close(server_r.params, want_r, **TOL)
  assert CLIENT_OPT_STATE not in cs_r and cs_r == {}
  # ... and the two modes differ by far more than the tolerance (the test can fail)
  assert _maxdiff(server.params, server_r.params) > 100 * TOL["atol"]
  assert _maxdiff(want, want_r) > 100 * TOL["atol"]


@pytest.mark.slow
def test_persistent_and_restart_agree_in_round_one(tiny_binary):
  """Before any client has a history the two modes are the same computation."""
  data, model = tiny_binary
  a, _ = _engine(model, data, _alg("persistent"), 5, rounds=1)
  b, _ = _engine(model, data, _alg("restart"), 5, rounds=1)
  chex.assert_trees_all_close(a.params, b.params, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------------------
# Every execution strategy carries the state
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_strategy_gives_the_same_persistent_run(tiny_binary):
  data, model = tiny_binary
  alg = _alg("persistent")
  runs = {s: _engine(model, data, alg, 3, execution=s)
          for s in ("vmap", "scan", "chunked", "loop")}
  ref_server, ref_cs = runs["scan"]
  for _s, (server, cs) in runs.items():
    chex.assert_trees_all_close(server.params, ref_server.params, rtol=1e-5, atol=1e-6)
    chex.assert_trees_all_close(cs, ref_cs, rtol=1e-5, atol=1e-6)
  # the state did move (a no-op would also agree)
  assert float(jnp.max(jnp.abs(jax.tree.leaves(ref_cs[CLIENT_OPT_STATE])[0]))) > 1e-3


@pytest.mark.slow
def test_persistent_scaffold_keeps_both_states(tiny_binary):
  """The reserved key sits next to a component's pool state (SCAFFOLD's c_i): both are
  gathered and scattered, and scan equals vmap."""
  data, model = tiny_binary
  alg = make_algorithm("scaffold", client_lr=LR, local_steps=K, batch_size=B,
                       client_optimizer_state="persistent")
  a_server, a_cs = _engine(model, data, alg, 3, execution="scan", rounds=2)
  b_server, b_cs = _engine(model, data, alg, 3, execution="vmap", rounds=2)
  assert set(a_cs) == {"scaffold", CLIENT_OPT_STATE}
  chex.assert_trees_all_close(a_server.params, b_server.params, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(a_cs, b_cs, rtol=1e-5, atol=1e-6)
  # plain SGD keeps no state: persistent SCAFFOLD is the restart numbers, bit for bit
  r_server, _ = _engine(model, data, make_algorithm(
      "scaffold", client_lr=LR, local_steps=K, batch_size=B), 3, execution="scan", rounds=2)
  chex.assert_trees_all_equal(a_server.params, r_server.params)


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0, 3]))}, model, {})


RUN = dict(rounds=ROUNDS, clients_per_round=3, eval_every=1, progress=False,
           reporting=None)


@pytest.mark.slow
def test_fused_rounds_replicas_and_sweeps_carry_the_state(tiny_binary):
  from fedjax_inv.runner import sweep
  from fedjax_inv.runner.replicas import run_replicas
  task = _task(tiny_binary)
  alg = _alg("persistent")
  seq = {s: simulation.run(task, alg, seed=s, **RUN) for s in (0, 1)}
  fused = simulation.run(task, alg, seed=0, rounds_per_call=2, **RUN)
  chex.assert_trees_all_close(fused.params, seq[0].params, rtol=1e-6, atol=1e-7)
  for s, res in zip((0, 1), run_replicas(task, alg, seeds=[0, 1], **RUN)):
    chex.assert_trees_all_close(res.params, seq[s].params, rtol=2e-6, atol=1e-7)
  # a batched sweep over the traced client_lr: momentum buffers do not depend on lr
  out = sweep.run_sweep(task, "fedavg", {"client_lr": [LR, 0.05]}, seeds=[0],
                        overrides=dict(client_optimizer="momentum", local_steps=K,
                                       batch_size=B, client_optimizer_state="persistent"),
                        replicas="batched", **RUN)
  assert [o["batched"] for o in out] == [True, True]
  chex.assert_trees_all_close(out[0]["result"].params, seq[0].params, rtol=2e-6, atol=1e-7)
  assert out[1]["hparams"]["client_optimizer_state"] == "persistent"
  # not traceable: client_optimizer_state itself runs one point after another
  pl = sweep.plan("fedavg", lambda p: make_algorithm("fedavg", **p),
                  sweep.points({"client_optimizer_state": ["restart", "persistent"]}))
  assert not pl.batched and "client_optimizer_state" in pl.reason


# --------------------------------------------------------------------------------------
# Checkpoints carry it
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_resume_is_bit_identical_with_persistent_state(tiny_binary, tmp_path):
  task = _task(tiny_binary)
  alg = _alg("persistent")
  ref = simulation.run(task, alg, seed=3, **RUN)
  ckpt = tmp_path / "ckpt"

  def stop_after_2(entry):
    if entry["round"] == 2:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):  # 2 rounds, checkpoint at round 2, killed
    simulation.run(task, alg, seed=3, checkpoint_dir=ckpt, checkpoint_every=2,
                   callback=stop_after_2, **RUN)
  # the checkpoint holds the momentum buffers, not zeros
  model = alg.model_for(task.model)
  target = (*init_state(alg, model.init(3), task.train.num_clients), {})  # no selection
  (_, cs, _), meta = checkpoint.load_checkpoint(ckpt, target)
  assert meta["round"] == 2
  assert float(jnp.max(jnp.abs(jax.tree.leaves(cs[CLIENT_OPT_STATE])[0]))) > 1e-3
  res = simulation.run(task, alg, seed=3, checkpoint_dir=ckpt, checkpoint_every=2, **RUN)
  assert res.history == ref.history  # exact floats, every round
  chex.assert_trees_all_equal(res.params, ref.params)
  # resuming with the buffers zeroed would not be the same run (so the check above bites)
  zeroed = tmp_path / "zeroed"
  server, cs, _ = checkpoint.load_checkpoint(ckpt, target)[0]
  cs = {**cs, CLIENT_OPT_STATE: jax.tree.map(jnp.zeros_like, cs[CLIENT_OPT_STATE])}
  checkpoint.save_checkpoint(zeroed, (server, cs, {}), meta)
  other = simulation.run(task, alg, seed=3, checkpoint_dir=zeroed, checkpoint_every=2,
                         **RUN)
  assert _maxdiff(other.params, ref.params) > 1e-4
  # a restart-mode run refuses the persistent checkpoint (another state structure)
  with pytest.raises(ValueError, match="does not match this run"):
    simulation.run(task, _alg("restart"), seed=3, checkpoint_dir=ckpt, checkpoint_every=2,
                   **RUN)


# --------------------------------------------------------------------------------------
# Defaults, hparams, errors
# --------------------------------------------------------------------------------------


def test_defaults_fedsr_family_persistent_others_restart():
  for name in ("fedsr", "fedl2r", "fedcmi"):
    alg = make_algorithm(name)
    assert alg.client_optimizer_state == "persistent"
    assert alg.hparams["client_optimizer_state"] == "persistent"
    assert make_algorithm(name, client_optimizer_state="restart").client_optimizer_state \
        == "restart"
  for name in registry():
    alg = make_algorithm(name)
    if name not in ("fedsr", "fedl2r", "fedcmi"):
      assert alg.client_optimizer_state == "restart", name
    assert alg.hparams["client_optimizer_state"] == alg.client_optimizer_state, name
    other = {"restart": "persistent", "persistent": "restart"}[alg.client_optimizer_state]
    flipped = make_algorithm(name, client_optimizer_state=other)  # every algorithm takes it
    assert flipped.client_optimizer_state == other == \
        flipped.hparams["client_optimizer_state"], name
  # a masked base keeps the base's default
  assert make_algorithm("fedgma", base="fedsr").client_optimizer_state == "persistent"


@pytest.mark.parametrize("name", ["fedavg", "fedsr", "geometric", "fedcurv_shoham"])
def test_bad_value_raises_naming_it(name):
  with pytest.raises(ValueError, match=r"client_optimizer_state='sticky' \(" + name
                     + r"\): must be one of restart, persistent"):
    make_algorithm(name, client_optimizer_state="sticky")


def test_algorithm_guards(tiny_binary):
  alg = make_algorithm("fedavg")
  with pytest.raises(ValueError, match="hparams record client_optimizer_state='restart'"):
    alg.replace(client_optimizer_state="persistent")
  with pytest.raises(ValueError, match=CLIENT_OPT_STATE):
    alg.with_component(Component(CLIENT_OPT_STATE))
  # states built for the other mode are refused when the round is traced
  data, model = tiny_binary
  restart_states = init_state(alg, model.init(0), data.num_clients)
  rf = build_round(model, "binary", _alg("persistent"), data.num_clients, 2,
                   execution="scan")
  with pytest.raises(ValueError, match="has no '__client_optimizer__' entry"):
    rf(*restart_states, data, jax.random.key(0))


def test_cli_hp_flag_and_summary(tmp_path):
  import json
  from fedjax_inv.cli import main
  out = tmp_path / "run"
  assert main(["run", "--task", "linear_regression", "--algorithm", "fedavg", "--rounds",
               "1", "--hp", "client_optimizer_state=persistent", "--out", str(out),
               "--no-progress"]) == 0
  run = json.loads((out / "fedavg" / "seed0" / "summary.json").read_text())
  assert run["hparams"]["client_optimizer_state"] == "persistent"
  for bad in ("7", "sticky"):  # bad input: exit 2, nothing written
    assert main(["run", "--task", "linear_regression", "--algorithm", "fedavg", "--rounds",
                 "1", "--hp", f"client_optimizer_state={bad}", "--out",
                 str(tmp_path / "bad"), "--no-progress"]) == 2
    assert not (tmp_path / "bad").exists()
