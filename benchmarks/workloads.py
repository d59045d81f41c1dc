"""The benchmark workloads and plans of ``fedjax-inv bench``: what is timed (a model, an
algorithm, MNIST-shaped synthetic clients) and at which cohort sizes and implementations.

Workloads (synthetic data of MNIST shape ``[C, 64, 28, 28, 1]``, 10 classes, labels
uniform: throughput does not depend on the pixel values):
  * ``mlp_fedavg``: FedAvg, MLP 784-128-10, 64 examples per client, 5 local SGD steps of
    batch 32 (FedAvg, McMahan et al. 2017, Alg. 1);
  * ``cnn_fedavg``: the same with the RotatedMNIST ConvNet stand-in ``models.cnn(1)``;
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


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark workload: a model, an algorithm and MNIST-shaped synthetic clients.

  Attributes:
    name: row label, e.g. ``'mlp_fedavg'``.
    model: ``'mlp'`` (784-128-10) or ``'cnn'`` (``models.cnn(1)``, 32-64-64 channels).
    algorithm: registry name (``fedjax_inv.algorithms``).
    hparams: keyword arguments for ``make_algorithm`` (local steps, batch size, lr).
  """
  name: str
  model: str
  algorithm: str
  hparams: tuple = tuple(sorted(LOCAL.items()))

  def make_model(self):
    """The workload's ``FunctionalModel`` (10 outputs). ValueError: unknown model."""
    from fedjax_inv import models
    if self.model == "mlp":
      return models.mlp(784, (128,), NUM_CLASSES)
    if self.model == "cnn":
      return models.cnn(1, num_outputs=NUM_CLASSES)
    raise ValueError(f"model={self.model!r}; expected 'mlp' or 'cnn'.")

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
  """``Workload`` objects for ``names`` ('mlp', 'cnn', 'heavy' or 'mlp_<algorithm>').

  Raises:
    ValueError: a name of none of these forms (the message lists them).
  """
  out = []
  for n in names:
    if n in ("mlp", "mlp_fedavg"):
      out.append(Workload("mlp_fedavg", "mlp", "fedavg"))
    elif n in ("cnn", "cnn_fedavg"):
      out.append(Workload("cnn_fedavg", "cnn", "fedavg"))
    elif n == "heavy":
      out += [Workload(f"mlp_{a}", "mlp", a) for a in HEAVY_ALGORITHMS]
    elif n.startswith("mlp_") or n.startswith("cnn_"):
      model, alg = n.split("_", 1)
      out.append(Workload(n, model, alg))
    else:
      raise ValueError(f"--workloads {n!r}: use mlp, cnn, heavy, or mlp_<algorithm> / "
                       "cnn_<algorithm> with a registered algorithm name.")
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
