"""FedILC methods get each task's settings (issue 9 items 1, 2, 5, 6).

* every task × FedILC method builds with the task's server lr / weight decay / λ /
  Intra-Geo batch and full-client gradients, and the server optimizer it builds is the
  official ``torch.optim.Adam(lr, weight_decay)`` (coupled L2), checked numerically;
* the Fishr λ scale (``'sum'`` = official code) in closed form;
* Intra-Geo's default (mini-batch groups, zeros negative) gives nonzero hidden-layer
  gradients on a ReLU net where the literal per-example/'both' setting gives exact zeros.
"""
import functools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.aggregation import aggregators as aggs
from fedjax_inv import models
from fedjax_inv.algorithms import penalties
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.algorithms import fedilc
from fedjax_inv.core import losses
from fedjax_inv.core.algorithm import Batch, Context, Objective
from fedjax_inv.data import sources
from fedjax_inv.tasks import make_task
from fedjax_inv.tasks.fedilc_settings import FEDILC_METHODS, fedilc_task_settings
from tests.trees import max_abs_diff

METHODS = FEDILC_METHODS
# FedILC §5.1.1-5.1.3 and the official main.py commands: lr, wd, λ, Intra-Geo batch.
PAPER = {
    "colored_mnist_fedilc": dict(server_lr=3e-4, weight_decay=0.01, fishr_lambda=15.0,
                                 group=32),
    "rotated_cifar10": dict(server_lr=1e-4, weight_decay=1e-3, fishr_lambda=1.0, group=64),
    "eicu": dict(server_lr=2e-4, weight_decay=1e-3, fishr_lambda=0.1, group=64),
}


@pytest.fixture(scope="module")
def fedilc_tasks(tmp_path_factory):
  """The three FedILC tasks on fixture data (bundled MNIST sample, fake CIFAR batches,
  a generated eICU CSV)."""
  from tests.test_eicu import _write_csv, size_of
  from tests.test_tasks_images import write_fake_cifar
  root = tmp_path_factory.mktemp("fedilc_data")
  write_fake_cifar(root)
  (root / "eicu").mkdir()
  _write_csv(root / "eicu" / "eicu_drugs.csv", 6, size_of)
  mp = pytest.MonkeyPatch()
  mp.setattr(sources, "load_dataset", functools.partial(sources.load_dataset, verify=False))
  try:
    out = {
        "colored_mnist_fedilc": make_task("colored_mnist_fedilc", source="bundled"),
        "rotated_cifar10": make_task("rotated_cifar10", data_dir=root, n_per_env=20,
                                     n_ood=30, channels=(4, 4, 4)),
        "eicu": make_task("eicu", data_dir=root, expected_features=None,
                          hidden=(8, 8, 4)),
    }
  finally:
    mp.undo()
  return out, root


def _coupled_adam_first_step(w, g, lr, wd, eps=1e-8):
  """torch.optim.Adam(lr, weight_decay=wd), first step: g' = g + wd·w, m̂ = g', v̂ = g'²,
  update = −lr·g'/(|g'| + eps)."""
  gc = g + wd * w
  return -lr * gc / (np.abs(gc) + eps)


@pytest.mark.parametrize("task_name", sorted(PAPER))
@pytest.mark.parametrize("method", METHODS)
def test_task_settings_reach_every_fedilc_method(fedilc_tasks, task_name, method):
  task = fedilc_tasks[0][task_name]
  want = PAPER[task_name]
  alg = make_algorithm(method, **task.algorithm_settings(method))
  hp = alg.hparams
  assert hp["server_optimizer"] == "adam"
  assert hp["server_lr"] == want["server_lr"]
  assert hp["weight_decay"] == want["weight_decay"]
  # Clients send full-data gradients (the task's minibatch size must not leak in).
  assert alg.batch_size is None and hp["batch_size"] is None
  assert alg.local_steps == 1 and hp["client_optimizer"] == "sgd"
  if method != "geometric":
    assert hp["fishr_lambda"] == want["fishr_lambda"]
    assert hp["fishr_reduction"] == "sum"
  if method == "fishr_intra_geo":
    assert hp["intra_group_size"] == want["group"] and hp["zeros"] == "negative"
  # The optimizer object the run uses is coupled-L2 Adam with these numbers.
  w = {"a": jnp.asarray([0.5, -2.0, 1.0])}
  g = {"a": jnp.asarray([1e-3, 3e-3, -2e-5])}
  upd, _ = alg.server_optimizer.update(g, alg.server_optimizer.init(w), w)
  np.testing.assert_allclose(
      np.asarray(upd["a"]),
      _coupled_adam_first_step(np.asarray(w["a"]), np.asarray(g["a"]), want["server_lr"],
                               want["weight_decay"]), rtol=1e-5)


def test_inter_geo_run_on_cifar_uses_full_client_gradients(fedilc_tasks):
  """The run itself (run_experiment, 1 round) records the settings it used: on
  Rotated-CIFAR10 Inter-Geo gets lr 1e-4, wd 1e-3, λ = 1 and no minibatch (the task's
  batch_size 64 is for other algorithms)."""
  from fedjax_inv.runner.experiment import run_experiment
  _, root = fedilc_tasks
  mp = pytest.MonkeyPatch()
  mp.setattr(sources, "load_dataset", functools.partial(sources.load_dataset, verify=False))
  try:
    import io
    from fedjax_inv import tasks as tasks_mod
    orig = tasks_mod._TASKS["rotated_cifar10"].builder
    mp.setitem(tasks_mod._TASKS, "rotated_cifar10", tasks_mod.TaskEntry(
        "rotated_cifar10", functools.partial(orig, n_per_env=20, n_ood=30,
                                             channels=(4, 4, 4)), "", ""))
    out = root / "run_inter_geo"
    run_experiment(dict(task="rotated_cifar10", algorithm="fishr_inter_geo", rounds=1,
                        data_dir=str(root), out=str(out)), progress=False,
                   stream=io.StringIO())
  finally:
    mp.undo()
  hp = json.loads((out / "summary.json").read_text())["hparams"]
  assert (hp["server_optimizer"], hp["server_lr"], hp["weight_decay"]) == ("adam", 1e-4,
                                                                           1e-3)
  assert hp["fishr_lambda"] == 1.0 and hp["batch_size"] is None


def test_fedilc_task_settings_rejects_bad_values():
  with pytest.raises(ValueError, match="server_lr"):
    fedilc_task_settings(server_lr=0.0, weight_decay=0.0, fishr_lambda=1.0,
                         group_size=8)
  with pytest.raises(ValueError, match="fishr_lambda"):
    fedilc_task_settings(server_lr=1e-3, weight_decay=0.0, fishr_lambda=-1.0,
                         group_size=8)
  with pytest.raises(ValueError, match="group_size"):
    fedilc_task_settings(server_lr=1e-3, weight_decay=0.0, fishr_lambda=1.0,
                         group_size=0)


# ---------------------------------------------------------------------------------------
# Fishr λ scale (item 6)
# ---------------------------------------------------------------------------------------


def _ctx(params, state, e):
  return Context(params=params, round=jnp.int32(0), extras={"fishr": state}, client={},
                 num_clients=jnp.float32(e), cohort=jnp.float32(e))


def test_fishr_sum_scale_closed_form():
  """'sum' (default, official code): stored penalty = Σ_e ‖v_e − v̄‖² and the server adds
  λ·E·(mean VJP) = λ ∇Σ_e‖v_e − v̄‖²; 'mean' (Alg. 1 literally) is E times smaller."""
  rng = np.random.default_rng(0)
  e, d = 4, 3
  model = models.mlp(5, (d,), 1)
  params = model.init(0)
  vs = [{"kernel": jnp.asarray(rng.random((d, 1)), jnp.float32),
         "bias": jnp.asarray(rng.random((1,)), jnp.float32)} for _ in range(e)]
  mean = {"v": jax.tree.map(lambda *a: sum(a) / e, *vs),
          "sq": sum(sum(float(jnp.sum(a * a)) for a in jax.tree.leaves(v)) for v in vs) / e}
  # jax.tree.map pairs v_e and v̄ leaf by leaf (and raises if their structures differ).
  direct = sum(sum(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.sum((a - b) ** 2)),
                                                v, mean["v"]))) for v in vs)
  vjp = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  pg = jax.tree.map(jnp.ones_like, params)
  for reduction, factor in (("sum", 1.0), ("mean", 1.0 / e)):
    comp = fedilc.fishr_component(2.0, reduction)
    state = comp.call("pre_update", state=comp.init_server(params), aggregate=mean,
                      ctx=_ctx(params, None, e))
    np.testing.assert_allclose(float(state["penalty"]), direct * factor, rtol=1e-5)
    out, _ = comp.call("server_stage", pseudo_grad=pg, state=state, messages={"fishr": vjp},
                       ctx=_ctx(params, state, e))
    scale = 2.0 * (e if reduction == "sum" else 1.0)
    chex.assert_trees_all_close(
        out, jax.tree.map(lambda p: jnp.full_like(p, 1.0 + scale * 0.5), params), rtol=1e-6)


def test_fishr_sum_with_lambda_equals_mean_with_e_lambda(tiny_binary):
  """Engine level: λ on the official 'sum' scale = E·λ on Alg. 1's 'mean' scale."""
  from fedjax_inv.core.engine import build_round, init_state
  data, model = tiny_binary
  e = data.num_clients

  def train(**kw):
    alg = make_algorithm("fishr_intra_arith", server_optimizer="sgd", server_lr=0.1,
                         weight_decay=0.0, **kw)
    rf = build_round(model, "binary", alg, e, e, execution="vmap")
    server, cs = init_state(alg, model.init(0), e)
    for _ in range(2):
      server, cs, _ = rf(server, cs, data, jax.random.key(0))
    return server

  a = train(fishr_lambda=3.0, fishr_reduction="sum")
  b = train(fishr_lambda=3.0 * e, fishr_reduction="mean")
  c = train(fishr_lambda=3.0, fishr_reduction="mean")
  chex.assert_trees_all_close(a.params, b.params, rtol=1e-5, atol=1e-7)
  # Same parameters (a == b), so the stored penalties differ by the factor E exactly.
  np.testing.assert_allclose(float(a.extras["fishr"]["penalty"]),
                             e * float(b.extras["fishr"]["penalty"]), rtol=1e-4)
  assert max_abs_diff(a.params, c.params) > 1e-6


# ---------------------------------------------------------------------------------------
# Intra-Geo defaults (item 2)
# ---------------------------------------------------------------------------------------


def _vg(model):
  def vg(p, batch, key):
    return jax.value_and_grad(
        lambda q: losses.mean_loss("binary", model.apply(q, batch.x), batch.y, batch.w))(p)
  return Objective(vg, model, "binary", task_only=False)


def _relu_batch(b=64, d=8, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(b, d)).astype(np.float32)
  x[:, : d // 2] *= rng.random((b, 1)) < 0.5  # half the inputs zero in half the examples
  y = (rng.random(b) < 0.5).astype(np.float32)
  return Batch(x=jnp.asarray(x), y=jnp.asarray(y), w=jnp.ones(b))


@pytest.mark.slow
def test_intra_geo_default_trains_where_per_example_both_is_zero():
  """Per-example groups with zeros in both sign sets: every first-layer coordinate has an
  example with an exact-zero gradient (inactive ReLU or zero input), so its weighted
  geometric mean is exactly 0 — the model cannot train. The default (mini-batches of 32,
  zeros negative) gives nonzero first-layer gradients."""
  model = models.mlp(8, (16,), 1)
  params = model.init(0)
  batch = _relu_batch()
  ctx = _ctx(params, None, 1)
  key = jax.random.key(0)
  literal = fedilc.intra_geo_component(None, 64, "both")
  _, g_lit = literal.call("grad_estimator", objective=_vg(model), params=params, batch=batch,
                          ctx=ctx, key=key)
  alg = make_algorithm("fishr_intra_geo")
  est = next(c for c in alg.components if c.grad_estimator is not None)
  _, g_def = est.call("grad_estimator", objective=_vg(model), params=params, batch=batch, ctx=ctx,
                      key=key)
  first = lambda g: jax.tree.leaves(g["featurizer"])  # noqa: E731
  chex.assert_trees_all_equal_shapes(g_lit, g_def, params)
  assert first(g_lit)  # a non-empty featurizer: the all() checks below are not vacuous
  assert all(float(jnp.max(jnp.abs(a))) == 0.0 for a in first(g_lit))
  assert all(float(jnp.max(jnp.abs(a))) > 1e-6 for a in first(g_def))


@pytest.mark.slow
def test_intra_group_size_equals_python_loop_over_minibatches():
  """group_size=s: weightedgeo over the ⌈n/s⌉ mini-batches of s real examples (the last
  smaller) in stored order (shuffle=False), padded rows excluded; with shuffle=True, the
  same over a permutation (so the result is the loop's on some ordering: checked by its
  invariance to the permutation for s = n)."""
  model = models.mlp(8, (6,), 1)
  params = model.init(1)
  b, n, s = 20, 14, 4
  full = _relu_batch(b, seed=3)
  w = (jnp.arange(b) < n).astype(jnp.float32)
  x = jnp.where(w[:, None] > 0, full.x, 77.0)  # junk in padded rows
  batch = Batch(x=x, y=full.y, w=w)
  ctx, key = _ctx(params, None, 1), jax.random.key(2)
  g_mean = jax.grad(lambda p, xx, yy: losses.mean_loss("binary", model.apply(p, xx), yy))
  for zeros in ("negative", "both"):
    comp = fedilc.intra_geo_component(None, 64, zeros, group_size=s, shuffle=False)
    loss, got = comp.call("grad_estimator", objective=_vg(model), params=params, batch=batch,
                          ctx=ctx, key=key)
    gs = [g_mean(params, full.x[i:min(i + s, n)], full.y[i:min(i + s, n)])
          for i in range(0, n, s)]
    want = aggs.weighted_geometric_mean(jax.tree.map(lambda *a: jnp.stack(a), *gs),
                                        zeros=zeros)
    chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(float(loss), float(losses.mean_loss(
        "binary", model.apply(params, full.x[:n]), full.y[:n])), rtol=1e-5)
  # One group holding all n examples: the plain mean gradient, whatever the shuffle.
  comp = fedilc.intra_geo_component(None, 64, "negative", group_size=n, shuffle=True)
  _, got = comp.call("grad_estimator", objective=_vg(model), params=params, batch=batch, ctx=ctx,
                     key=key)
  want = g_mean(params, full.x[:n], full.y[:n])
  chex.assert_trees_all_close(got, want, rtol=1e-5, atol=1e-8)
  # Shuffling changes the groups (so the estimate) between keys.
  comp = fedilc.intra_geo_component(None, 64, "negative", group_size=s, shuffle=True)
  _, g1 = comp.call("grad_estimator", objective=_vg(model), params=params, batch=batch, ctx=ctx,
                    key=jax.random.key(0))
  _, g2 = comp.call("grad_estimator", objective=_vg(model), params=params, batch=batch, ctx=ctx,
                    key=jax.random.key(1))
  assert max_abs_diff(g1, g2) > 1e-7


def test_fishr_penalty_helper_is_the_mean_scale():
  """penalties.fishr_penalty (Alg. 1's (1/E)Σ) times E is the official 'sum' value."""
  rng = np.random.default_rng(1)
  v = {"kernel": jnp.asarray(rng.random((3, 4, 1)), jnp.float32)}
  direct = float(jnp.sum((v["kernel"] - v["kernel"].mean(0)) ** 2))
  np.testing.assert_allclose(3 * float(penalties.fishr_penalty(v)), direct, rtol=1e-5)


def test_fedcurv_is_fedsgd_plus_fishr(tiny_binary):
  """FedILC's FedCurv (official ``--algorithm=fishr``) = FedSGD + λ∇L_Fishr: the same
  rounds as ``fishr_intra_arith`` bit for bit, and different from FedSGD (λ = 0)."""
  from fedjax_inv.core.engine import build_round, init_state
  data, model = tiny_binary
  e = data.num_clients

  def train(name, **kw):
    alg = make_algorithm(name, server_lr=0.05, **kw)
    rf = build_round(model, "binary", alg, e, e, execution="vmap")
    server, cs = init_state(alg, model.init(0), e)
    for _ in range(2):
      server, cs, _ = rf(server, cs, data, jax.random.key(0))
    return server.params

  curv, arith = train("fedcurv", fishr_lambda=2.0), train("fishr_intra_arith", fishr_lambda=2.0)
  sgd = train("fishr_intra_arith", fishr_lambda=0.0)
  chex.assert_trees_all_equal(curv, arith)
  assert max_abs_diff(curv, sgd) > 1e-6
