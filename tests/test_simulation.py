"""Determinism, errors before compile, and the user-facing run loop."""
import numpy as np
import pytest

from fedjax_inv import models
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner import simulation
from fedjax_inv.core.engine import build_round
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks import Task
from tests import reference as oracle


def _task(tiny_binary):
  data, model = tiny_binary
  return Task("tiny", "binary", data, {"ood": data.take(np.array([0]))}, model, {})


@pytest.mark.slow
def test_same_seed_same_bits_different_seed_differs(tiny_binary):
  task = _task(tiny_binary)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=8)
  kw = dict(rounds=4, clients_per_round=3, eval_every=2, progress=False)
  a = simulation.run(task, alg, seed=1, **kw)
  b = simulation.run(task, alg, seed=1, **kw)
  c = simulation.run(task, alg, seed=2, **kw)
  assert a.history == b.history  # exact float equality
  assert a.history != c.history
  assert [h["round"] for h in a.history] == [2, 4]
  for k in ("train_accuracy", "ood_accuracy", "train_loss", "ood_loss"):
    assert k in a.final
  # The reported metrics are those of the final model, recomputed here by the oracle.
  for name, data in (("train", task.train), ("ood", task.eval_sets["ood"])):
    want = oracle.pooled_eval(lambda x: alg.model_for(task.model).apply(a.params, x),
                             "binary", data)
    np.testing.assert_allclose(a.final[f"{name}_loss"], want["loss"], rtol=1e-5)
    np.testing.assert_allclose(a.final[f"{name}_accuracy"], want["accuracy"], atol=1e-9)


def test_training_fits_a_separable_task():
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(40, 4)).astype(np.float32) for _ in range(3)]
  ys = [(x[:, 0] > 0).astype(np.int32) for x in xs]
  data = from_client_arrays(xs, ys)
  task = Task("sep", "binary", data, {}, models.mlp(4, (8,), 1), {})
  alg = make_algorithm("fedavg", client_lr=0.5, local_steps=5, batch_size=16)
  res = simulation.run(task, alg, rounds=20, seed=0, progress=False)
  assert res.final["train_accuracy"] > 0.9


def test_errors_before_compile(tiny_binary):
  data, model = tiny_binary
  alg = make_algorithm("fedavg")
  with pytest.raises(ValueError, match="clients_per_round=9"):
    build_round(model, "binary", alg, 5, 9)
  with pytest.raises(ValueError, match="execution='fast'"):
    build_round(model, "binary", alg, 5, 2, execution="fast")
  with pytest.raises(ValueError, match="loss kind"):
    build_round(model, "ranking", alg, 5, 2)
  with pytest.raises(ValueError, match="rounds=0"):
    simulation.run(_task(tiny_binary), alg, rounds=0)
  with pytest.raises(ValueError, match="unknown algorithm 'fedfoo'"):
    make_algorithm("fedfoo")
  with pytest.raises(ValueError, match="unknown hyperparameters"):
    make_algorithm("fedavg", muu=1.0)
  with pytest.raises(ValueError, match="client_optimizer='rmsprop'"):
    make_algorithm("fedavg", client_optimizer="rmsprop")
  with pytest.raises(ValueError, match="scaffold needs client_optimizer='sgd'"):
    make_algorithm("scaffold", client_optimizer="adam")
  with pytest.raises(ValueError, match="local_steps=0"):
    make_algorithm("fedavg", local_steps=0)


def test_divergence_stops_at_the_first_non_finite_round(tiny_binary, monkeypatch):
  # issue 11: NaN was only checked after the last round (`--lr nan --rounds 3000` ran all
  # 3000). The objective is injected non-finite from round 7 on; the loop must stop at
  # the next check (round 10 < 40, no eval before) and report round 7, not 10.
  real_build = simulation.build_round
  calls = []

  def build(*a, **k):
    fn = real_build(*a, **k)

    class Wrapped:
      strategy = fn.strategy

      def __call__(self, server, cstates, data, key):
        server, cstates, m = fn(server, cstates, data, key)
        calls.append(1)
        if len(calls) >= 7:
          m = dict(m, train_loss=m["train_loss"] * np.float32("inf"))
        return server, cstates, m
    return Wrapped()

  monkeypatch.setattr(simulation, "build_round", build)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=1, batch_size=8)
  with pytest.raises(simulation.DivergedError, match="round 7") as e:
    simulation.run(_task(tiny_binary), alg, rounds=40, eval_every=40, progress=False)
  assert e.value.round == 7 and e.value.history == []
  assert len(calls) == simulation.CHECK_EVERY  # stopped at the first check, not round 40
  assert isinstance(e.value, FloatingPointError)


def test_nan_learning_rate_stops_early(tiny_binary):
  # make_algorithm refuses a NaN rate (the schema); the factory itself builds it, so the
  # divergence check is what stops this run.
  from fedjax_inv.algorithms import registry
  with pytest.raises(ValueError, match="client_lr=nan"):
    make_algorithm("fedavg", client_lr=float("nan"))
  alg = registry()["fedavg"].factory(client_lr=float("nan"), local_steps=1, batch_size=8)
  with pytest.raises(simulation.DivergedError) as e:
    simulation.run(_task(tiny_binary), alg, rounds=3000, eval_every=3000, progress=False)
  # round 1's objective is the loss of the initial model (1 local step, taken after it);
  # the NaN step makes round 2's objective NaN: stopped there, not after 3000 rounds.
  assert e.value.round == 2


@pytest.mark.parametrize("kw,msg", [
    (dict(clients_per_round=0), "clients_per_round=0"),
    (dict(eval_every=0), "eval_every=0"),
    (dict(chunk_size=0, execution="chunked"), "chunk_size=0"),
    (dict(checkpoint_every=0, checkpoint_dir="x"), "checkpoint_every=0"),
    (dict(eval_every=1.5), "eval_every=1.5"),
])
def test_zero_is_refused_not_replaced_by_the_default(tiny_binary, kw, msg):
  # issue 11: 0 silently became "all clients" / "rounds // 20" / the auto chunk size.
  alg = make_algorithm("fedavg")
  with pytest.raises(ValueError, match=msg.replace(".", r"\.")):
    simulation.run(_task(tiny_binary), alg, rounds=2, progress=False, **kw)
