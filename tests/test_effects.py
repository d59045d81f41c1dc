"""Effects that must show on ColoredMNIST (IRM protocol, bundled offline digits).

FedAvg learns the color (train ≈ 0.85, OOD ≈ 0.1). Any predictor that uses only the
color has ``train_acc + ood_acc <= 1.05`` (color agrees with the label 85% of the time on
the training clients and 10% on the OOD client), so a sum clearly above that shows the
digit shape is used. Protocol: the task's defaults (full-batch clients, one local SGD
step, 2 clients of 2,000 images, OOD 1,000). Adam clients that restart every round would
move by ``lr·sign(g)`` with one local step, which cancels the clients' opposite IRM
gradients (measured in ``experiments/colored_mnist_invariance.md``). Every comparison uses the
same rounds,
client optimizer, learning rate and seed for FedAvg and the invariance method.
"""
import functools

import pytest

from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner.simulation import run
from fedjax_inv.tasks import make_task

SEEDS = (0, 1)
PROTOCOLS = {
    # name: (rounds, common knobs, method, method knobs)
    "irm": (300, dict(client_optimizer="sgd", client_lr=1.0), "inv_fedavg",
            dict(penalty_weight=1e4, warmup_rounds=100)),
    "iir": (150, dict(client_optimizer="sgd", client_lr=0.01), "fediir",
            dict(gamma=3e4, ema=0.0)),
}


@functools.lru_cache(maxsize=None)
def _task():
  return make_task("colored_mnist")


@functools.lru_cache(maxsize=None)
def _final(protocol: str, name: str, seed: int):
  rounds, common, _, _ = PROTOCOLS[protocol]
  task = _task()
  kw = dict(common)
  if name != "fedavg":
    kw.update(PROTOCOLS[protocol][3])
  res = run(task, make_algorithm(name, **task.algorithm_settings(name, kw)), rounds=rounds,
            seed=seed, progress=False,
            eval_every=rounds)
  return res.final["train_accuracy"], res.final["ood_accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_inv_fedavg_beats_fedavg_out_of_distribution(seed):
  fa_train, fa_ood = _final("irm", "fedavg", seed)
  train, ood = _final("irm", "inv_fedavg", seed)
  assert fa_ood < 0.3 and fa_train > 0.8, (fa_train, fa_ood)  # FedAvg uses the color
  assert ood > fa_ood + 0.2, (ood, fa_ood)
  assert ood > 0.4, ood
  assert train > 0.6 and train + ood > 1.15, (train, ood)  # the digit shape is used


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_fediir_beats_fedavg_out_of_distribution(seed):
  fa_train, fa_ood = _final("iir", "fedavg", seed)
  train, ood = _final("iir", "fediir", seed)
  assert fa_ood < 0.15 and fa_train > 0.8, (fa_train, fa_ood)
  assert ood > fa_ood + 0.15, (ood, fa_ood)
  assert train > 0.55, train  # not the trivial constant / anti-color predictor


@functools.lru_cache(maxsize=None)
def _hospital(name: str, seed: int):
  # Invariant FedAvg §4.1 Task 2 at a CI size (5,000 samples per client instead of 50,000,
  # 1,000 rounds instead of 10,000); the task's defaults otherwise (full-batch SGD lr 1.0,
  # E=1; inv_fedavg λ=1e4 after a 100-round warm-up). Full size:
  # experiments/invariant_fedavg/ (FedAvg 0.110 vs Inv 0.614 OOD over 3 seeds).
  task = make_task("synthetic_hospital", seed=seed, n_per_client=5000)
  res = run(task, make_algorithm(name, **task.algorithm_settings(name)), rounds=1000,
            seed=seed, progress=False, eval_every=1000)
  return res.final["train_accuracy"], res.final["ood_accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_inv_fedavg_beats_fedavg_on_synthetic_classification(seed):
  fa_train, fa_ood = _hospital("fedavg", seed)
  train, ood = _hospital("inv_fedavg", seed)
  # FedAvg relies on the spurious feature: train ≈ 0.85, OOD ≈ 0.1 (paper 0.85 / 0.11).
  assert fa_train > 0.8 and fa_ood < 0.2, (fa_train, fa_ood)
  # The paper's effect (0.11 -> 0.62): at this size +0.33..+0.39 measured on seeds 0, 1.
  assert ood > fa_ood + 0.3, (ood, fa_ood)
  assert train + ood > 1.1, (train, ood)  # x_inv is used, not a spurious-only predictor
