"""The benchmark workloads and plans of ``fedjax-inv bench``: what is timed (a model, an
algorithm, MNIST-shaped synthetic clients) and at which cohort sizes and implementations.

Workloads (synthetic data, MNIST-shaped ``[C, 64, 28, 28, 1]`` unless said otherwise, 10
classes, labels uniform: throughput does not depend on the pixel values):
  * ``mlp_fedavg``: FedAvg, MLP 784-128-10, 64 examples per client, 5 local SGD steps of
    batch 32 (FedAvg, McMahan et al. 2017, Alg. 1);
  * ``cnn_fedavg``: the same with the RotatedMNIST ConvNet stand-in ``models.cnn(1)``;
  * ``cifar10_fedavg`` (``--workloads cifar10``): pfl-research's own CIFAR10 benchmark
    setting (apple/pfl-research ``benchmarks/image_classification/configs/baseline.yaml``):
    its "simple CNN" (``benchmarks/cifar10_cnn.py``, 1,626,442 parameters, dropout in
    training), 50 examples per client of shape ``[32, 32, 3]`` (``mean_datapoints_per_user:
    50``, constant), 1 local epoch of batch 10 (= 5 steps; ``local_epochs=1``), client SGD
    lr 0.1, server SGD lr 1.0 (pfl's cohort is 50 of 1,000 users; here pool N = C as for
    the other workloads);
  * ``mlp_<alg>`` for the heavy algorithms ``fishr_inter_geo``, ``fishr_intra_geo``
    (FedILC Alg. 1/2), ``fediir`` (FedIIR Alg. 1), ``fedsr`` (FedSR §3) when the
    registry knows them.

Plans: ``QUICK`` (``--quick``) and ``FULL`` (the default): ``(workload, cohort sizes,
implementations)`` triples plus warm-up/timed rounds, time budgets and the matmul size.
"""
from __future__ import annotations

import dataclasses

HEAVY_ALGORITHMS = ("fishr_inter_geo", "fishr_intra_geo", "fediir", "fedsr")
ENGINE_IMPLS = ("auto", "vmap", "scan", "chunked", "sharded")
IMPLS = ("loop",) + ENGINE_IMPLS
CLIENT_COUNTS = (10, 100, 1000, 10000)
EXAMPLES_PER_CLIENT = 64
FEATURE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
LOCAL = dict(client_lr=0.1, local_steps=5, batch_size=32)
# pfl-research's CIFAR10 setting: 50 images [32, 32, 3] per user, 1 epoch of batch 10.
CIFAR10_WORKLOAD = "cifar10_fedavg"
CIFAR10_FEATURE_SHAPE = (32, 32, 3)
CIFAR10_EXAMPLES_PER_CLIENT = 50
CIFAR10_LOCAL = dict(client_lr=0.1, local_epochs=1, batch_size=10)
CIFAR10_NAMES = ("cifar10", "cifar10_fedavg", "cnn_cifar10", "cnn_cifar10_fedavg")


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark workload: a model, an algorithm and synthetic clients.

  Attributes:
    name: row label, e.g. ``'mlp_fedavg'``.
    model: ``'mlp'`` (784-128-10), ``'cnn'`` (``models.cnn(1)``, 32-64-64 channels) or
      ``'cifar10_cnn'`` (pfl-research's simple CNN, ``benchmarks/cifar10_cnn.py``).
    algorithm: registry name (``fedjax_inv.algorithms``).
    hparams: keyword arguments for ``make_algorithm`` (local steps, batch size, lr).
    feature_shape: one example's shape (``[28, 28, 1]``; CIFAR10 ``[32, 32, 3]``).
    n_per_client: examples per synthetic client (64; CIFAR10 50).
  """
  name: str
  model: str
  algorithm: str
  hparams: tuple = tuple(sorted(LOCAL.items()))
  feature_shape: tuple = FEATURE_SHAPE
  n_per_client: int = EXAMPLES_PER_CLIENT

  def make_model(self):
    """The workload's ``FunctionalModel`` (10 outputs). ValueError: unknown model."""
    from fedjax_inv import models
    if self.model == "mlp":
      return models.mlp(784, (128,), NUM_CLASSES)
    if self.model == "cnn":
      return models.cnn(1, num_outputs=NUM_CLASSES)
    if self.model == "cifar10_cnn":
      from .cifar10_cnn import simple_cnn
      return simple_cnn(NUM_CLASSES, self.feature_shape)
    raise ValueError(f"model={self.model!r}; expected 'mlp', 'cnn' or 'cifar10_cnn'.")

  def describe(self) -> dict:
    """The workload's data and local recipe, for the JSON's meta."""
    return dict(model=self.model, algorithm=self.algorithm,
                feature_shape=list(self.feature_shape), n_per_client=self.n_per_client,
                local=dict(self.hparams))

  def make_algorithm(self):
    """The algorithm with the workload's local recipe; falls back to the factory's own
    defaults (returned note says so) when it fixes some of them."""
    from fedjax_inv.algorithms import make_algorithm
    try:
      return make_algorithm(self.algorithm, **dict(self.hparams)), ""
    except ValueError:
      alg = make_algorithm(self.algorithm)
      return alg, (f"{self.algorithm} fixes its local recipe: {alg.local_steps} local "
                   f"step(s) of {alg.batch_size or 'all 64'} examples, client lr "
                   f"{alg.hparams.get('client_lr')}")


def workloads(names: list[str]) -> list[Workload]:
  """``Workload`` objects for ``names`` ('mlp', 'cnn', 'cifar10', 'heavy' or
  'mlp_<algorithm>').

  Raises:
    ValueError: a name of none of these forms (the message lists them).
  """
  out = []
  for n in names:
    if n in ("mlp", "mlp_fedavg"):
      out.append(Workload("mlp_fedavg", "mlp", "fedavg"))
    elif n in ("cnn", "cnn_fedavg"):
      out.append(Workload("cnn_fedavg", "cnn", "fedavg"))
    elif n in CIFAR10_NAMES:
      out.append(Workload(CIFAR10_WORKLOAD, "cifar10_cnn", "fedavg",
                          tuple(sorted(CIFAR10_LOCAL.items())), CIFAR10_FEATURE_SHAPE,
                          CIFAR10_EXAMPLES_PER_CLIENT))
    elif n == "heavy":
      out += [Workload(f"mlp_{a}", "mlp", a) for a in HEAVY_ALGORITHMS]
    elif n.startswith("mlp_") or n.startswith("cnn_"):
      model, alg = n.split("_", 1)
      out.append(Workload(n, model, alg))
    else:
      raise ValueError(f"--workloads {n!r}: use mlp, cnn, cifar10, heavy, or "
                       "mlp_<algorithm> / cnn_<algorithm> with a registered algorithm "
                       "name.")
  return out


def synthetic_pool(num_clients: int, n_per_client: int = EXAMPLES_PER_CLIENT,
                   feature_shape=FEATURE_SHAPE, num_classes: int = NUM_CLASSES,
                   seed: int = 0):
  """A device-resident pool of MNIST-shaped synthetic clients.

  Returns ``ClientData`` with ``x: [N, n, *feature_shape]`` float32 uniform in [0, 1),
  ``y: [N, n]`` int32 uniform in ``[0, num_classes)``, ``n: [N]`` all equal to
  ``n_per_client`` (generated on device, no host copy).

  Raises:
    ValueError: a non-positive size.
  """
  import jax
  import jax.numpy as jnp
  from fedjax_inv.core.data import ClientData
  if num_clients < 1 or n_per_client < 1 or num_classes < 2:
    raise ValueError(f"synthetic_pool: num_clients={num_clients}, n_per_client="
                     f"{n_per_client}, num_classes={num_classes}; use positive sizes and "
                     ">= 2 classes.")

  @jax.jit
  def make(key):
    kx, ky = jax.random.split(key)
    x = jax.random.uniform(kx, (num_clients, n_per_client) + tuple(feature_shape))
    y = jax.random.randint(ky, (num_clients, n_per_client), 0, num_classes)
    return x, y

  x, y = make(jax.random.key(seed))
  return ClientData(x=x, y=y, n=jnp.full((num_clients,), n_per_client, jnp.int32))


# (workload names, cohort sizes, implementations) per plan, and its timing settings.
QUICK = dict(plan=[("mlp", (10, 100), ("loop", "auto", "vmap", "chunked", "sharded")),
                   ("mlp_fishr_inter_geo", (10,), ("loop", "auto")),
                   ("mlp_fediir", (10,), ("loop", "auto")),
                   ("mlp_fedsr", (10,), ("loop", "auto"))],
             warmup=1, rounds=3, budget_s=5.0, max_impl_s=30.0, matmul_n=1024)
FULL = dict(plan=[("mlp", CLIENT_COUNTS, IMPLS),
                  ("mlp_fedsgd", (10, 100, 1000), ("loop", "auto")),
                  ("heavy", (10, 100, 1000), ("loop", "auto", "vmap", "sharded")),
                  ("cnn", (10, 100), ("loop", "auto", "vmap", "sharded"))],
            warmup=1, rounds=5, budget_s=60.0, max_impl_s=240.0, matmul_n=2048)
