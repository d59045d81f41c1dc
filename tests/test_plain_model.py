"""Any NNX module with a ``__call__`` is a model: the algorithms that read only the forward
pass train it (and FedAvg trains it exactly as the same network split into
featurizer / classifier); those that need the split refuse it in one line before compiling."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fedjax_inv import models
from fedjax_inv.privacy import client_dp as privacy
from fedjax_inv.runner import simulation
from fedjax_inv.algorithms import make_algorithm, registry
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks import Task

D, H = 4, 8
# The algorithms whose components read the featurizer / classifier split.
NEEDS_SPLIT = {"fedsr", "fedl2r", "fedcmi", "fediir", "fishr_inter_geo", "fishr_intra_geo",
               "fishr_intra_arith", "fedcurv"}


class Plain(nnx.Module):
  """Two dense layers and a ``__call__``; no featurizer / classifier."""

  def __init__(self, rngs):
    self.hidden = nnx.Linear(D, H, rngs=rngs)
    self.out = nnx.Linear(H, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(nnx.relu(self.hidden(x)))


class Split(nnx.Module):
  """The same network (same layers drawn in the same order) with the split."""

  def __init__(self, rngs):
    hidden = nnx.Linear(D, H, rngs=rngs)
    self.classifier = nnx.Linear(H, 1, rngs=rngs)
    self.featurizer = nnx.Sequential(hidden, nnx.relu)

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


class HalfSplit(Plain):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.featurizer = self.hidden


def as_plain(split_params):
  """Split's parameters under Plain's names."""
  return {"hidden": split_params["featurizer"]["layers"][0], "out": split_params["classifier"]}


def plain():
  return models.FunctionalModel.from_factory(lambda rngs: Plain(rngs))


@pytest.fixture(scope="module")
def data():
  """3 training clients and one held-out client of a linearly separable binary task."""
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, D)).astype(np.float32) for n in (40, 30, 50, 40)]
  ys = [(x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32) for x in xs]
  return from_client_arrays(xs[:3], ys[:3]), from_client_arrays(xs[3:], ys[3:])


def task(data, model):
  train, ood = data
  return Task("sep", "binary", train, {"ood": ood}, model, {})


def run(t, alg, rounds=15):
  return simulation.run(t, alg, rounds=rounds, seed=0, eval_every=5, execution="vmap",
                        progress=False)


def test_plain_module_is_its_own_featurizer():
  m = plain()
  assert not m.has_split and m.split_parts == () and m.module_name == "Plain"
  assert models.mlp(D, (H,), 1).has_split
  p = m.init(0)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(5, D)), jnp.float32)
  logits = m.apply(p, x)
  assert logits.shape == (5, 1)
  chex.assert_trees_all_close(m.features(p, x), logits)
  chex.assert_trees_all_close(m.classify(p, logits), logits)
  # Same layers, same draws: Split's init is Plain's under other names.
  s = models.FunctionalModel.from_factory(lambda rngs: Split(rngs))
  chex.assert_trees_all_equal(as_plain(s.init(3)), m.init(3))
  chex.assert_trees_all_close(s.apply(s.init(3), x), m.apply(m.init(3), x))


def test_a_module_without_call_or_split_is_refused():
  class NoCall(nnx.Module):
    def __init__(self, rngs):
      self.dense = nnx.Linear(D, 1, rngs=rngs)

  with pytest.raises(TypeError, match="NoCall has no __call__"):
    models.FunctionalModel.from_factory(lambda rngs: NoCall(rngs))


def test_task_refuses_a_module_instance(data):
  with pytest.raises(ValueError, match="model must be a models.FunctionalModel, got Plain; "
                                       "wrap an NNX module with"):
    task(data, Plain(nnx.Rngs(0)))


def _dp_fedavg(num_clients):
  alg = make_algorithm("fedavg", client_lr=0.5, local_steps=5, batch_size=16)
  s = privacy.DPSettings(clip=1.0, noise_multiplier=0.1).check()
  return privacy.apply(alg, s, num_clients, num_clients)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "dp_fedavg"])
def test_plain_module_trains(data, name):
  t = task(data, plain())
  if name == "dp_fedavg":
    alg = _dp_fedavg(t.train.num_clients)
  else:
    kw = dict(mu=0.01) if name == "fedprox" else {}
    alg = make_algorithm(name, client_lr=0.5, local_steps=5, batch_size=16, **kw)
  res = run(t, alg)
  first, last = res.history[0], res.final
  assert last["train_loss"] < first["train_loss"]
  assert last["train_loss"] < 0.45
  assert last["train_accuracy"] > 0.85 and last["ood_accuracy"] > 0.8  # chance: ~0.5
  if name == "dp_fedavg":
    assert res.privacy is not None and res.privacy["epsilon"] > 0


def test_fedavg_plain_equals_split(data):
  alg = make_algorithm("fedavg", client_lr=0.5, local_steps=5, batch_size=16)
  a = run(task(data, plain()), alg, rounds=10)
  b = run(task(data, models.FunctionalModel.from_factory(lambda rngs: Split(rngs))), alg,
          rounds=10)
  chex.assert_trees_all_close(a.params, as_plain(b.params), rtol=1e-5, atol=1e-6)
  assert [h["round"] for h in a.history] == [h["round"] for h in b.history]
  for ha, hb in zip(a.history, b.history):
    chex.assert_trees_all_close(ha, hb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["fedsr", "fediir", "fishr_inter_geo"])
def test_split_algorithms_refuse_a_plain_module_before_compiling(data, name, monkeypatch):
  def no_compile(*a, **k):
    raise AssertionError("build_round reached")

  monkeypatch.setattr(simulation, "build_round", no_compile)
  reads = r" \(component 'fishr' reads them\)" if name == "fishr_inter_geo" else ""
  want = (rf"^{name} needs a model with \.featurizer \(\[B, \.\.\.\] -> \[B, d\]\) and "
          rf"\.classifier \(\[B, d\] -> \[B, K\]\){reads}; Plain has neither\. Split the "
          r"model into those two attributes \(see models\.mlp\)\.$")
  with pytest.raises(ValueError, match=want):
    run(task(data, plain()), make_algorithm(name), rounds=1)
  with pytest.raises(ValueError, match="HalfSplit has only .featurizer"):
    make_algorithm(name).model_for(
        models.FunctionalModel.from_factory(lambda rngs: HalfSplit(rngs)))


def test_which_algorithms_need_the_split():
  need = {n for n in registry() if any(c.needs_split for c in make_algorithm(n).components)}
  assert need == NEEDS_SPLIT
  m = plain()
  for n in sorted(registry()):
    if n in NEEDS_SPLIT:
      with pytest.raises(ValueError, match=f"^{n} needs a model with"):
        make_algorithm(n).model_for(m)
    else:
      assert make_algorithm(n).model_for(m) is m


@pytest.mark.slow
def test_every_forward_pass_algorithm_trains_a_plain_module(data):
  t = task(data, plain())
  kw = {"median": dict(aggregator="median"),  # a robust aggregator
        "inv_fedavg": dict(warmup_rounds=0)}     # the IRM penalty on from round 0
  for n in sorted(set(registry()) - NEEDS_SPLIT) + ["median"]:
    alg = make_algorithm("fedavg" if n == "median" else n, **kw.get(n, {}))
    res = simulation.run(t, alg, rounds=2, seed=0, eval_every=1, execution="vmap",
                         progress=False)
    assert np.isfinite(res.final["train_loss"]), n
    assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves(res.params)), n
