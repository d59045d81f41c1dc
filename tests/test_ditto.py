"""Ditto (Li et al. 2021): personal models per client (issue 26 item 4).

The global model must be FedAvg's, bit for bit; the personal models must equal a Python
loop of Ditto eq. 2's steps (``tests/reference.py``, no fedjax_inv math); evaluation must
score each client with its own model; checkpoints must carry the personal models.
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.runner import checkpoint, simulation
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.core.engine import build_round, init_state
from fedjax_inv.eval import build_evaluator
from fedjax_inv.tasks.base import Task
from tests.reference import reference_run
from tests.rounds import run_rounds
from tests.trees import max_abs_diff


def _pool():
  from fedjax_inv import models
  rng = np.random.default_rng(3)
  xs, ys = [], []
  for i, n in enumerate((14, 20, 9, 17, 25, 12, 18, 11)):
    x = rng.normal(size=(n, 5)).astype(np.float32) + 0.2 * i
    xs.append(x)
    # client-specific labels: personalization has something to learn
    ys.append(((x[:, (i % 2)] > 0.2 * i).astype(int) + (x[:, 2] > 0.5)).astype(np.int32))
  return from_client_arrays(xs, ys), models.mlp(5, (6,), 3)


def _engine(alg, data, model, strategy, rounds=3, cohort=5):
  return run_rounds(alg, data, model, strategy, rounds, cohort)


@pytest.mark.parametrize("strategy", ["scan", "vmap", "chunked"])
@pytest.mark.parametrize("batch_size", [4, pytest.param(None, marks=pytest.mark.slow)])
def test_personal_models_equal_the_python_loop(strategy, batch_size):
  data, model = _pool()
  kw = dict(client_lr=0.2, local_steps=3, batch_size=batch_size)
  alg = make_algorithm("ditto", ditto_lambda=0.5, personal_steps=4, personal_lr=0.3, **kw)
  params, cs = _engine(alg, data, model, strategy)
  ref = {"lam": 0.5, "steps": 4, "lr": 0.3}
  ref_params = reference_run(model, "multiclass", data, model.init(0), rounds=3, cohort=5,
                             key=jax.random.key(0), **kw, ditto=ref)
  chex.assert_trees_all_close(params, ref_params, rtol=2e-5, atol=2e-6)
  stacked = jax.tree.map(lambda *v: jnp.stack(v), *ref["v"])
  chex.assert_trees_all_close(cs["ditto"], stacked, rtol=2e-5, atol=2e-6)
  # the personal models of the sampled clients moved away from w_0
  assert max(max_abs_diff(v, model.init(0)) for v in ref["v"]) > 1e-3


@pytest.mark.parametrize("strategy", [
    "scan", *(pytest.param(s, marks=pytest.mark.slow) for s in ("vmap", "chunked"))])
def test_global_model_is_fedavgs_bit_for_bit(strategy):
  data, model = _pool()
  kw = dict(client_lr=0.2, local_steps=3, batch_size=4)
  ditto_params, _ = _engine(make_algorithm("ditto", ditto_lambda=0.3, **kw), data, model,
                            strategy)
  fedavg_params, _ = _engine(make_algorithm("fedavg", **kw), data, model, strategy)
  chex.assert_trees_all_equal(ditto_params, fedavg_params)


def test_lambda_pulls_the_personal_model_to_the_global_one():
  """λ·η = 1 with a zero-gradient step (all-padding is impossible; use η tiny vs λ):
  v ← v − η(∇F + λ(v − w_t)) with λη = 1 lands on w_t − η∇F(v), which is w_t up to η."""
  data, model = _pool()
  kw = dict(client_lr=0.2, local_steps=2, batch_size=4)
  alg = make_algorithm("ditto", ditto_lambda=1e4, personal_lr=1e-4, personal_steps=1, **kw)
  rf = build_round(model, "multiclass", alg, data.num_clients, 8, execution="vmap")
  server, cs = init_state(alg, model.init(0), data.num_clients)
  w0 = server.params
  server, cs, _ = rf(server, cs, data, jax.random.key(0))
  # every client (cohort = pool) has v = w_0 − 1e-4 ∇F(w_0): within 1e-3 of w_0 = w_t
  near = jax.tree.map(lambda v, w: v - w[None], cs["ditto"], w0)
  chex.assert_trees_all_close(near, jax.tree.map(jnp.zeros_like, near), atol=1e-3)
  # λ = 0: purely local models, far from the global one after the same step count
  loc = make_algorithm("ditto", ditto_lambda=0.0, personal_lr=0.5, personal_steps=5, **kw)
  rf = build_round(model, "multiclass", loc, data.num_clients, 8, execution="vmap")
  s0, c0 = init_state(loc, model.init(0), data.num_clients)
  _, c1, _ = rf(s0, c0, data, jax.random.key(0))
  far = jax.tree.map(lambda v, w: v - w[None], c1["ditto"], w0)
  assert max_abs_diff(far, jax.tree.map(jnp.zeros_like, far)) > 1e-2


def test_each_client_is_scored_with_its_own_model():
  data, model = _pool()
  evaluate = build_evaluator(model, "multiclass", eval_batch=8)
  params = [model.init(s) for s in range(data.num_clients)]
  stacked = jax.tree.map(lambda *v: jnp.stack(v), *params)
  got = evaluate.each(stacked, data)
  x, y, n = np.asarray(data.x), np.asarray(data.y), np.asarray(data.n)
  for i, p in enumerate(params):  # numpy: argmax of the client's own model's logits
    logits = np.asarray(model.apply(p, x[i, :n[i]]))
    assert got["correct"][i] == int(np.sum(np.argmax(logits, 1) == y[i, :n[i]]))
    z = logits - logits.max(1, keepdims=True)
    ce = np.log(np.exp(z).sum(1)) - z[np.arange(n[i]), y[i, :n[i]]]
    np.testing.assert_allclose(got["loss_sum"][i], ce.sum(), rtol=1e-5)
  with pytest.raises(ValueError, match="leading axis \\[3\\] for 8 clients"):
    evaluate.each(jax.tree.map(lambda a: a[:3], stacked), data)


def _task(data, model, val_rows=4):
  """The pool's last ``val_rows`` rows of every client as its 'val' client."""
  x, y, n = np.asarray(data.x), np.asarray(data.y), np.asarray(data.n)
  tx = [x[i, :n[i] - val_rows] for i in range(len(n))]
  ty = [y[i, :n[i] - val_rows] for i in range(len(n))]
  vx = [x[i, n[i] - val_rows:n[i]] for i in range(len(n))]
  vy = [y[i, n[i] - val_rows:n[i]] for i in range(len(n))]
  return Task(name="tiny", train=from_client_arrays(tx, ty),
              eval_sets={"val": from_client_arrays(vx, vy)}, model=model,
              kind="multiclass", info={})


def test_run_reports_personal_beside_global_accuracy_and_personalization_helps():
  data, model = _pool()
  task = _task(data, model)
  alg = make_algorithm("ditto", ditto_lambda=0.05, client_lr=0.2, local_steps=3,
                       batch_size=4, personal_steps=10, personal_lr=0.3)
  res = simulation.run(task, alg, rounds=12, seed=0, eval_every=6, progress=False)
  f = res.final
  for k in ("personal_val_mean_client_accuracy", "personal_train_accuracy",
            "val_mean_client_accuracy"):
    assert k in f
  # the labels depend on the client: each personal model fits its own client's rule
  assert f["personal_train_accuracy"] > f["train_accuracy"] + 0.05
  # a run with no personal component records no personal metric
  fedavg = simulation.run(task, make_algorithm("fedavg", client_lr=0.2, local_steps=3,
                                               batch_size=4),
                          rounds=2, seed=0, eval_every=2, progress=False)
  assert not any(k.startswith("personal_") for k in fedavg.final)


@pytest.mark.slow
def test_checkpoint_resume_carries_the_personal_models(tmp_path):
  data, model = _pool()
  task = _task(data, model)
  alg = make_algorithm("ditto", ditto_lambda=0.1, client_lr=0.2, local_steps=2,
                       batch_size=4, personal_steps=3)
  run = dict(rounds=4, seed=1, eval_every=1, progress=False, clients_per_round=5)
  ref = simulation.run(task, alg, **run)
  ckpt = tmp_path / "ckpt"

  def stop_after_2(entry):
    if entry["round"] == 2:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    simulation.run(task, alg, checkpoint_dir=ckpt, checkpoint_every=2,
                   callback=stop_after_2, **run)
  target = (*init_state(alg, model.init(1), task.train.num_clients), {})
  (_, cs, _), meta = checkpoint.load_checkpoint(ckpt, target)
  assert meta["round"] == 2
  res = simulation.run(task, alg, checkpoint_dir=ckpt, checkpoint_every=2, **run)
  assert res.history == ref.history  # personal metrics included, exact floats
  # resuming with the personal models reset to w_0 is another run: the check bites
  reset = tmp_path / "reset"
  server, cs, _ = checkpoint.load_checkpoint(ckpt, target)[0]
  cs = {**cs, "ditto": target[1]["ditto"]}
  checkpoint.save_checkpoint(reset, (server, cs, {}), meta)
  other = simulation.run(task, alg, checkpoint_dir=reset, checkpoint_every=2, **run)
  assert other.final["personal_val_accuracy"] != ref.final["personal_val_accuracy"] or \
      other.final["personal_train_loss"] != ref.final["personal_train_loss"]


@pytest.mark.parametrize("kw,match", [
    (dict(ditto_lambda=-1.0), "ditto_lambda=-1.0"),
    (dict(personal_steps=0), "personal_steps=0"),
    (dict(personal_lr=0.0), "personal_lr=0.0"),
    (dict(local_epochs=1), "local_epochs is not supported"),
])
def test_bad_settings_are_named(kw, match):
  with pytest.raises(ValueError, match=match):
    make_algorithm("ditto", **kw)
