"""Issue 13: hyperparameter sweeps (fedjax_inv/runner/sweep.py). Traced hyperparameters
(client/server learning rate, FedProx mu, Fishr lambda, FedIIR gamma, FedGMA tau) let a grid × seeds
run as one batched program whose every replica equals the sequential run of that point;
names that change the program fall back to one run after another, with the reason."""
import chex
import numpy as np
import pytest

from fedjax_inv import Task
from fedjax_inv.runner import sweep
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import simulation
from fedjax_inv.runner.replicas import run_replicas


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0, 3]))}, model, {})


KW = dict(rounds=6, clients_per_round=3, eval_every=3, progress=False,
          reporting={"select": ["min:ood_loss"]})


def test_parse_sweep_items_aliases_scopes_and_errors():
  p = sweep.parse_sweep(["lr=0.1,0.03", "fedprox.mu=0,0.01", "aggregator=mean,gma"])
  assert p == {None: {"client_lr": [0.1, 0.03], "aggregator": ["mean", "gma"]},
               "fedprox": {"mu": [0, 0.01]}}
  assert sweep.spec_for(p, "fedprox") == {"client_lr": [0.1, 0.03],
                                           "aggregator": ["mean", "gma"], "mu": [0, 0.01]}
  assert sweep.spec_for(p, "fedavg") == {"client_lr": [0.1, 0.03],
                                          "aggregator": ["mean", "gma"]}
  assert sweep.parse_sweep({"mu": [0, 0.5]}) == {None: {"mu": [0, 0.5]}}
  for bad, msg in [("mu", "NAME=V1,V2"), ("mu=0,,1", "empty value"),
                   ("mu=0.1,0.1", "repeated"), (".mu=1", "NAME=V1,V2")]:
    with pytest.raises(ValueError, match=msg):
      sweep.parse_sweep([bad])
  with pytest.raises(ValueError, match="given twice"):
    sweep.parse_sweep(["mu=1", "mu=2"])
  with pytest.raises(ValueError, match="give one of them"):
    sweep.spec_for(sweep.parse_sweep(["mu=1", "fedprox.mu=2"]), "fedprox")


def test_points_are_the_cartesian_product_in_order_and_labelled():
  pts = sweep.points({"client_lr": [0.1, 0.03], "mu": [0, 0.5]})
  assert pts == [{"client_lr": 0.1, "mu": 0}, {"client_lr": 0.1, "mu": 0.5},
                 {"client_lr": 0.03, "mu": 0}, {"client_lr": 0.03, "mu": 0.5}]
  assert sweep.label("fedprox", pts[1]) == "fedprox@client_lr=0.1,mu=0.5"
  assert sweep.label("fedavg", {}) == "fedavg"
  assert sweep.points({}) == [{}]


def _make(name, **fixed):
  return lambda p: make_algorithm(name, **{**fixed, **p})


def test_plan_batches_traced_names_and_explains_the_others():
  pts = sweep.points({"client_lr": [0.1, 0.03], "mu": [0.0, 0.5]})
  pl = sweep.plan("fedprox", _make("fedprox", local_steps=2, batch_size=8), pts)
  assert pl.batched and pl.traced == ("client_lr", "mu") and pl.reason == ""
  assert pl.structure.hparams["client_lr"] == 1.0 and [a.hparams["mu"] for a in pl.concrete] == [
      0.0, 0.5, 0.0, 0.5]
  pl = sweep.plan("fedgma", _make("fedgma"), sweep.points({"tau": [0.2, 0.6]}))
  assert pl.batched and pl.traced == ("tau",)  # the mask's finalize traces tau
  pl = sweep.plan("and_mask", _make("and_mask"), sweep.points({"rescale": [False, True]}))
  assert not pl.batched and "rescale is not traced by and_mask" in pl.reason
  pl = sweep.plan("fedavg", _make("fedavg"), sweep.points({"local_steps": [1, 3]}))
  assert not pl.batched and "local_steps" in pl.reason
  # a value the algorithm refuses fails before anything runs, naming the point
  with pytest.raises(ValueError, match=r"fedprox@mu=-1: mu=-1"):
    sweep.plan("fedprox", _make("fedprox"), sweep.points({"mu": [0.1, -1]}))


def _assert_equal_runs(a, b, rtol):
  """Equal within ``rtol`` (float32 summation / rounding order; cf. test_replicas)."""
  atol = 1e-7
  assert [e["round"] for e in a.history] == [e["round"] for e in b.history]
  for x, y in zip(a.history, b.history):
    for k in x:
      np.testing.assert_allclose(x[k], y[k], rtol=rtol, atol=atol, err_msg=k)
  chex.assert_trees_all_close(a.params, b.params, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name,spec,fixed,rtol", [
    # plain SGD at both ends (vmapped matmuls may sum in another order: float32 ulps)
    ("fedprox", {"client_lr": [0.1, 0.03], "mu": [0.0, 0.5]}, {}, 2e-6),
    # momentum clients, FedAdam server (Reddi et al.'s adaptive step)
    ("fedadam", {"server_lr": [0.01, 0.1]}, {"client_optimizer": "momentum"}, 2e-6),
    # a component coefficient on the pre-stage + loss path
    ("fediir", {"gamma": [0.0, 0.5]}, {}, 2e-6),
    # the aggregator's threshold (FedGMA's soft mask on the server step)
    ("fedgma", {"tau": [0.0, 0.6]}, {}, 2e-6),
    # Ditto's λ and the personal steps' rate, which follows the traced client lr
    ("ditto", {"ditto_lambda": [0.0, 1.0], "client_lr": [0.1, 0.03]}, {}, 2e-6),
])
@pytest.mark.slow
def test_batched_sweep_equals_sequential_runs(tiny_binary, name, spec, fixed, rtol):
  task = _task(tiny_binary)
  fixed = dict(client_lr=0.1, local_steps=2, batch_size=8, **fixed)
  fixed = {k: v for k, v in fixed.items() if k not in spec}
  seeds = [3] if len(sweep.points(spec)) > 2 else [3, 0]  # a seed repeats across points
  out = sweep.run_sweep(task, name, spec, seeds=seeds, overrides=fixed,
                        replicas="batched", **KW)
  assert all(o["batched"] for o in out)
  assert len(out) == len(sweep.points(spec)) * len(seeds)
  finals = set()
  for o in out:
    alg = make_algorithm(name, **fixed, **o["point"])
    ref = simulation.run(task, alg, seed=o["seed"], **KW)
    _assert_equal_runs(o["result"], ref, rtol)
    assert o["hparams"] == alg.hparams
    # Ditto's λ moves only the personal models (its global model is FedAvg's)
    key = "personal_train_loss" if name == "ditto" else "ood_loss"
    finals.add(round(o["result"].final[key], 7))
  assert len(finals) == len(out)  # every point and seed is a different run


@pytest.mark.parametrize("kind,name", [
    ("client", "sgd"), ("client", "momentum"), ("client", "adam"), ("server", "sgd"),
    ("server", "momentum"), ("server", "adam"), ("server", "yogi")])
def test_a_traced_learning_rate_is_the_optimizer_built_at_that_rate(kind, name):
  """One path for fixed and swept rates: under a replica's traced rate the optimizer is
  the one built at that rate (bit for bit, three steps), and with no traced rate it is the
  built one."""
  import jax
  import jax.numpy as jnp
  from fedjax_inv.algorithms import base
  from fedjax_inv.core.algorithm import HPARAMS, Context, optimizer_traced

  def ctx(extras):
    return Context(params=None, round=jnp.int32(0), extras=extras, client={},
                   num_clients=jnp.float32(3), cohort=jnp.float32(3))

  build = (lambda lr: base.client_optimizer(name, lr, weight_decay=0.01)) \
      if kind == "client" else (lambda lr: base.server_optimizer(name, lr))
  hp = f"{kind}_lr"
  assert optimizer_traced(build(0.5)) == (hp,)
  params = {"w": jnp.asarray([0.3, -1.2, 2.0]), "b": jnp.asarray(0.7)}
  grads = [jax.tree.map(lambda p, i=i: jnp.sin(p * (i + 1)), params) for i in range(3)]

  def steps(opt, context, traced):
    def run(lr):
      c = context if not traced else ctx({HPARAMS: {hp: lr}})
      state, p, out = opt.init(params), params, []
      for g in grads:
        u, state = opt.update(g, state, p, ctx=c)
        p = jax.tree.map(jnp.add, p, u)
        out.append(p)
      return out
    return jax.jit(run)(jnp.float32(0.03))

  want = steps(build(0.03), ctx({}), False)
  chex.assert_trees_all_equal(steps(build(1.0), None, True), want)  # the traced rate
  chex.assert_trees_all_equal(steps(build(0.03), ctx({HPARAMS: {"mu": 1.0}}), False),
                              want)  # another traced name: the built rate


def test_an_optimizer_that_does_not_read_the_rate_makes_the_sweep_sequential(tiny_binary):
  """A user's plain optax optimizer does not read the round's rate: the algorithm no longer
  lists client_lr as traced, so a sweep over it runs one after another (never a batched
  sweep whose rates are silently ignored)."""
  import optax
  alg = make_algorithm("fedprox", client_lr=0.1)
  assert alg.traced == ("client_lr", "mu", "server_lr")
  plain = alg.replace(client_optimizer=optax.sgd(0.1))
  assert plain.traced == ("mu", "server_lr")
  with pytest.raises(ValueError, match=r"hparams \['client_lr'\]: fedprox does not read"):
    run_replicas(_task(tiny_binary), plain, seeds=[0, 1],
                 hparams=[{"client_lr": 0.1}, {"client_lr": 0.2}], **KW)
  # FedGMA's mask after its base's server optimizer keeps the server rate traced
  assert "server_lr" in make_algorithm("fedgma").traced


@pytest.mark.slow
def test_fishr_lambda_is_traced(tiny_binary):
  task = _task(tiny_binary)
  spec = {"fishr_lambda": [0.0, 15.0]}
  out = sweep.run_sweep(task, "fishr_inter_geo", spec, seeds=[1], replicas="batched",
                        **KW)
  assert [o["batched"] for o in out] == [True, True]
  for o in out:
    ref = simulation.run(task, make_algorithm("fishr_inter_geo", **o["point"]), seed=1,
                         **KW)
    _assert_equal_runs(o["result"], ref, 2e-6)


@pytest.mark.slow
def test_untraceable_sweep_runs_one_after_another(tiny_binary):
  task = _task(tiny_binary)
  out = sweep.run_sweep(task, "fedavg", {"local_steps": [1, 2]}, seeds=[0],
                        overrides={"client_lr": 0.1, "batch_size": 8},
                        replicas="batched", **KW)
  assert [o["batched"] for o in out] == [False, False]
  assert [o["label"] for o in out] == ["fedavg@local_steps=1", "fedavg@local_steps=2"]
  ref = simulation.run(task, make_algorithm("fedavg", client_lr=0.1, batch_size=8,
                                            local_steps=2), seed=0, **KW)
  _assert_equal_runs(out[1]["result"], ref, 0.0)


def test_bad_traced_hyperparameters_are_refused_before_compiling(tiny_binary):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg")
  with pytest.raises(ValueError, match=r"\['mu'\]: fedavg does not read them"):
    run_replicas(task, alg, seeds=[0, 1], hparams=[{"mu": 0.1}, {"mu": 0.2}], **KW)
  with pytest.raises(ValueError, match="pair is repeated"):
    run_replicas(task, alg, seeds=[0, 0], hparams=[{"client_lr": 1.0}] * 2, **KW)
  with pytest.raises(ValueError, match="one dict per replica"):
    run_replicas(task, alg, seeds=[0, 1], hparams=[{"client_lr": 1.0}], **KW)
  with pytest.raises(ValueError, match="finite number"):
    run_replicas(task, alg, seeds=[0, 1], hparams=[{"client_lr": float("nan")},
                                                   {"client_lr": 1.0}], **KW)
  with pytest.raises(ValueError, match="both swept and fixed"):
    sweep.run_sweep(task, "fedprox", {"mu": [0, 1]}, seeds=[0], overrides={"mu": 1},
                    **KW)


@pytest.mark.slow
def test_run_experiment_sweep_writes_one_row_per_point(tmp_path):
  import json
  from fedjax_inv.runner.experiment import run_experiment
  cfg = dict(task="colored_mnist", algorithm="fedavg,fedprox", rounds=2, seeds=2,
             sweep=["lr=0.1,0.05", "fedprox.mu=0,0.5"], replicas="batched",
             out=str(tmp_path / "r"))
  import io
  log = io.StringIO()
  summary = run_experiment(cfg, progress=False, stream=log)
  rows = [r["algorithm"] for r in summary["table"]]
  assert rows == ["fedavg@client_lr=0.1", "fedavg@client_lr=0.05",
                  "fedprox@client_lr=0.1,mu=0", "fedprox@client_lr=0.1,mu=0.5",
                  "fedprox@client_lr=0.05,mu=0", "fedprox@client_lr=0.05,mu=0.5"]
  assert all(r["seeds"] == 2 for r in summary["table"])
  assert summary["sweep"]["fedprox"]["runs"] == "batched: client_lr, mu traced"
  one = json.loads((tmp_path / "r" / "fedprox@client_lr=0.05,mu=0.5" / "seed1" /
                    "summary.json").read_text())
  assert one["sweep"] == {"client_lr": 0.05, "mu": 0.5} and one["hparams"]["mu"] == 0.5
  assert one["hparams"]["client_lr"] == 0.05 and one["base_algorithm"] == "fedprox"
  assert "fedprox: 4 sweep points × 2 seed(s), batched" in log.getvalue()
  with pytest.raises(ValueError, match="not an algorithm of this run"):
    run_experiment(dict(cfg, sweep=["fedsr.mu=1,2"], out=str(tmp_path / "x")),
                   progress=False, stream=io.StringIO())
  assert not (tmp_path / "x").exists()
