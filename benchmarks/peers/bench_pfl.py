"""The FedAvg workloads of ``fedjax-inv bench`` run with Apple's pfl-research (``pfl``).

Runs in its own environment, made by ``benchmarks/peers/setup_pfl.sh``
(``benchmarks/peers/.venv-pfl``: ``pfl[pytorch]`` with the CPU torch wheel; never a
dependency of fedjax_inv), and prints JSON rows in the format of ``bench_peers.py``
(``source="peer"``), which ``fedjax-inv bench --peers`` can merge by workload and ``C``.

Workload (``mlp_fedavg`` / ``cnn_fedavg`` of ``benchmarks/harness.py``): C clients per
round, pool = C (every client trains every round), 64 synthetic MNIST-shaped examples per
client (x uniform in [0, 1), 10 uniform labels; the same arrays as ``bench_peers.py``),
local training = 5 SGD steps (lr 0.1) on batches of 32 drawn with replacement, server =
weighted mean of the client models (FedAvg, McMahan et al. 2017). Models, in torch:

  * ``mlp``: 784-128-10 with ReLU (101,770 parameters).
  * ``cnn``: ``fedjax_inv.models.cnn(1)``: 3x3 convs 1->32->64->64 ('SAME' padding, ReLU,
    2x2 max-pool after the first two), global max over positions, Linear 64->10
    (56,394 parameters, the same layer shapes; He-normal conv init as there).

pfl configuration (its "Fast distributed simulations" guide and API docs):

  * ``pfl.model.pytorch.PyTorchModel`` with ``local_optimizer_create=torch.optim.SGD``
    and a central ``torch.optim.SGD(lr=1.0)``: FedAvg's server step ``w + mean delta``.
  * ``pfl.algorithm.FederatedAveraging`` with ``NNAlgorithmParams(train_cohort_size=C,
    val_cohort_size=None, evaluation_frequency`` > rounds) and ``NNTrainHyperParams(
    local_learning_rate=0.1, local_batch_size=32, local_num_epochs=1)``.
  * Data: ``pfl.data.FederatedDataset`` over pfl's in-memory ``Dataset`` (the guide: "If
    all data can fit into RAM, then using Dataset is the fastest"), tensors created once
    (pfl's ``to_tensor`` passes torch tensors through), the ``'minimize_reuse'`` user
    sampler (cycles through the pool: with cohort = pool every client trains once a
    round). pfl has no with-replacement batching and its ``local_num_steps`` stops at the
    end of the user's data (64 examples = 2 batches of 32), so ``make_dataset_fn`` draws
    the round's 5 x 32 example indices with replacement and hands pfl a 160-example
    ``Dataset``; one epoch of batch 32 is then exactly the 5 steps (the same gather the
    other peers do per batch).
  * ``pfl.aggregate.simulate.SimulatedBackend`` with the ``WeightByDatapoints``
    postprocessor (all clients have 160, so the weighted mean is the plain mean), no
    privacy mechanism, no central evaluation, ``run(send_metrics_to_platform=False)``
    (the generic platform prints every metric to stdout otherwise).
  * Parallelism: pfl's multi-process simulation (the guide's "Multi-process training";
    on CPU torch.distributed uses gloo): P worker processes started with
    ``PFL_WORKER_ADDRESSES`` / ``PFL_WORKER_RANK``, each training its share of the cohort,
    the summed updates all-reduced every round. A config ``PxT`` is P processes with T
    torch threads each (``P`` alone: T = cores // P). The default runs ``1`` (one process,
    torch's default threads) and, on a machine with more cores, also ``1x1`` and ``Nx1``
    (N = cores): on a busy 2-core host 1-thread processes were much faster than torch's
    2 intra-op threads (as for the plain torch peer of bench_peers.py).
    ``PyTorchModel(use_torch_compile=True)`` is left off, as in pfl's image
    classification benchmarks: it wraps the module in ``torch.compile``, but pfl trains
    through ``module.loss(...)``, which the ``OptimizedModule`` forwards to the original,
    uncompiled module (checked: no dynamo frames compiled, first round unchanged), so
    it does nothing for the ``loss`` / ``metrics`` modules pfl requires.

Every (config, model, C) runs in fresh worker processes (clean peak RSS, clean thread
settings). Timing: a pfl callback takes ``time.perf_counter()`` after each central
iteration; the first iteration also includes pfl's per-user evaluation before and after
local training, which ``FederatedNNAlgorithm`` always does at iteration 0. Like
``bench_peers.timed``: the first round (``first_round_s``) and ``warmup - 1`` more are
untimed, then ``rounds`` timed ones (at least 2, fewer when they would exceed
``--budget-s``; the ranks agree on the count by an all-reduce). ``round_s`` is the median
over the timed rounds of the slowest rank's time; ``rss_peak_mb`` is the sum over the
worker processes of ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (absolute, torch and
pfl included: about 0.45 GB per process here). Rows carry the harness's peer fields plus
``first_round_s``, ``rss_peak_mb``, ``processes`` and ``threads``.

FEMNIST workload (``--models femnist``; ``workload="femnist_fedavg"``, Reddi et al. 2021
App. D): FedAvg over a pool of 3,400 writers (``--femnist-clients``) whose training-set
sizes are ``femnist_sizes(3400, seed=0)`` of ``fedjax_inv/data/federated_synthetic.py``
(loaded from its file by path: it imports numpy only, the package would import jax):
671,585 examples, 2..475 per writer. Images 28x28x1 are generated with numpy
(``torch_workload.make_femnist_data``: 62 blob templates + a per-writer shift + uint8
noise; ~3 s for the whole pool) and stored as **uint8** (NCHW), labels int64 in 0..61;
the model's first layer converts each batch to float32 / 255, so the pool takes 527 MB
per worker process and pfl never holds a float32 copy of it. Model: Reddi et al.'s
EMNIST CNN, as ``fedjax_inv.models.federated.femnist_cnn``: Conv 3x3 32 (valid) ReLU ->
Conv 3x3 64 ReLU -> MaxPool 2x2 -> Dropout 0.25 -> Flatten -> Dense 128 ReLU -> Dropout
0.5 -> Dense 62, Glorot-uniform kernels, zero biases; 1,206,590 parameters (asserted).
pfl configuration, as pfl-research's own FEMNIST benchmark (``benchmarks/dataset/
femnist.py``): ``FederatedDataset.from_slices({writer: (x uint8 tensor, y int64
tensor)}, get_user_sampler('random', writers))`` (the per-user in-memory ``Dataset``;
each writer's tensors are views into one pool tensor, created once), i.e. 10 users a
round (``--femnist-cohort``) drawn uniformly with replacement by pfl's random sampler;
``NNTrainHyperParams(local_learning_rate=0.1, local_batch_size=20, local_num_epochs=1)``
(one pass over the writer's own data in stored order, ceil(n / 20) steps, the last batch
partial; pfl does not shuffle), client ``torch.optim.SGD``, central
``torch.optim.SGD(lr=1.0)``, ``WeightByDatapoints`` (FedAvg weighted by examples),
dropout on in training (pfl's ``loss`` puts the module in train mode), no evaluation in
the timed rounds (``evaluation_frequency`` > rounds, ``val_cohort_size=None``), the same
``SimulatedBackend`` / process layouts / timing as above. Its rows carry ``C`` (writers
a round), ``clients`` = ``pool`` (writers), ``client_updates_per_s`` = C / ``round_s``,
``setup_s`` (seconds from the worker's process start, i.e. the launcher's ``Popen``, to
the end of building the pool and the pfl objects: interpreter start, imports and data
generation included; max over ranks), ``first_round_at_s`` (from process start to the
end of the first trained round; max over ranks), ``params``, ``examples`` (the pool's),
``round_times_s`` and ``round_examples`` (per timed round: the slowest rank's time and the
cohort's examples summed over ranks; random cohorts differ in size, so a round's time
follows its draw), ``examples_per_s`` (their ratio of sums), ``versions`` and
``machine`` (cpu model, cores).

CIFAR10 workload (``--models cifar10``; ``workload="cifar10_fedavg"``): pfl-research's own
CIFAR10 benchmark setting (``benchmarks/image_classification/configs/baseline.yaml`` of
apple/pfl-research, read for this port): its ``simple_cnn`` for (32, 32, 3), 10 classes
(``torch_workload.cifar10_body``, 1,626,442 parameters, asserted; dropout on in training),
50 images per user (float32 NHWC, as pfl's CIFAR10 pickles after normalization; here
uniform [0, 1)), ``NNTrainHyperParams(local_learning_rate=0.1, local_batch_size=10,
local_num_epochs=1)`` (one pass in stored order: 5 steps of 10), central
``torch.optim.SGD(lr=1.0)``, ``WeightByUser`` (``weight_by_samples: false``). Each user's
``Dataset`` holds views of one pool tensor placed on pfl's device once (pfl's benchmark
converts its arrays with ``to_tensor``, which puts them on the default device); the
``'minimize_reuse'`` sampler with cohort = pool = C (every client trains once a round, as on
the fedjax_inv side; pfl's own run samples 50 of 1,000 users at random). Rows as the MLP /
ConvNet rows.

GPU (``--device cuda``): every worker process shares the one GPU (``PFL_PYTORCH_DEVICE``
names it for every rank). The client pools live on the device (moved there once, before
the timed rounds; on the CPU nothing moves). pfl creates its process group with NCCL
whenever CUDA is available, and NCCL refuses two ranks on one GPU ("Duplicate GPU
detected"), so ``--dist-backend auto`` (the default) makes a multi-process run on one
CUDA device use gloo (which all-reduces CUDA tensors) by wrapping
``torch.distributed.init_process_group`` before pfl is imported; rows record
``dist_backend``. ``--tf32 off`` (the default) sets ``torch.backends.cuda.matmul.allow_tf32
= False`` and ``torch.backends.cudnn.allow_tf32 = False`` in every worker (float32-exact
products and convolutions, as fedjax_inv's ``--precision highest``; torch's own default
lets cuDNN convolutions use TF32), ``on`` sets both True, ``default`` leaves torch's; rows
record the flags read back (``tf32``). A CUDA timer synchronizes the device before each
lap. Rows carry ``device_mem_peak_mb`` (the sum over ranks of
``torch.cuda.max_memory_allocated()`` at the end of the worker: pool, model, optimizer,
activations; not the CUDA contexts), ``device_mem_peak_mb_per_rank`` and
``device_mem_reserved_peak_mb`` (``max_memory_reserved``, summed), and the GPU's name.
``--json FILE`` is rewritten after every measurement (``meta.partial`` until the end), so
a run stopped by a time limit keeps the rows it finished.

``--check-training`` checks, per model: the parameter count and shapes (fedjax_inv's, in
torch's layout), one pfl round against the same FedAvg round written out in plain torch
(same batches; max abs difference ~1e-8), and 20 rounds of 10 clients on a learnable
synthetic task (x = 0.8 U + 0.2 T_y with a random 0/1 template per class): held-out
accuracy rises from chance (measured: MLP 0.09 -> 1.00, CNN 0.09 -> 0.33). Exit 1 if a
check fails. For ``femnist`` (``--check-training --models femnist``): the
parameter count and ``--check-rounds`` rounds of ``--clients-check`` writers drawn from
the first 100 of a 120-writer FEMNIST-shaped pool, tested on the other 20 writers (no
torch reference round: its dropout masks would differ).

Usage:
  bash benchmarks/peers/setup_pfl.sh
  benchmarks/peers/.venv-pfl/bin/python benchmarks/peers/bench_pfl.py \\
      --clients 10,100,1000 --models mlp,cnn --rounds 5 --warmup 1 --json -
  ... bench_pfl.py --configs 1,1x1,2x1 --clients 100        (pick the process layout)
  ... bench_pfl.py --check-training                          (shows that pfl learns)
  ... bench_pfl.py --models femnist --rounds 10 --budget-s 300 --json -   (FEMNIST)
  ... bench_pfl.py --models femnist --femnist-clients 200 --rounds 2    (quick smoke)
  ... bench_pfl.py --device cuda --configs 1,2,4,8 --models mlp,cnn,cifar10 \\
      --clients 10,100,1000 --tf32 off --json pfl.json        (GPU, processes per GPU)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

from torch_workload import (BATCH, CIFAR10_BATCH, CIFAR10_EPOCHS, CIFAR10_LR,
                            CIFAR10_WORKLOAD, EXPECTED_PARAMS, FEMNIST_BATCH, FEMNIST_LR,
                            FEMNIST_WORKLOAD, LR, N_PER_CLIENT, STEPS, WORKLOADS,
                            learnable_task, make_cifar10_data, make_data,
                            make_femnist_data, param_count, to_model_layout, torch_body)

MODELS = tuple(WORKLOADS) + ("femnist", "cifar10")


def workload_name(model: str) -> str:
  return {"femnist": FEMNIST_WORKLOAD, "cifar10": CIFAR10_WORKLOAD}.get(model,
                                                                          WORKLOADS.get(model))


def pfl_device():
  """pfl's default device (``PFL_PYTORCH_DEVICE``, else CUDA when available, ...)."""
  from pfl.internal.ops.pytorch_ops import get_default_device
  return get_default_device()


def set_tf32(mode: str) -> dict:
  """``off``: float32-exact CUDA matmuls and cuDNN convolutions
  (``torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False``);
  ``on``: both True; ``default``: torch's own. Returns the flags read back."""
  import torch
  if mode in ("off", "on"):
    torch.backends.cuda.matmul.allow_tf32 = mode == "on"
    torch.backends.cudnn.allow_tf32 = mode == "on"
  elif mode != "default":
    raise ValueError(f"--tf32 {mode!r}: use off, on or default.")
  out = dict(mode=mode)
  for name, get in (("matmul_allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32),
                    ("cudnn_allow_tf32", lambda: torch.backends.cudnn.allow_tf32),
                    ("float32_matmul_precision", torch.get_float32_matmul_precision)):
    try:
      out[name] = get()
    except Exception as e:  # noqa: BLE001 - record, never fail on a read-back
      out[name] = f"unreadable: {type(e).__name__}"
  return out


def force_dist_backend(backend: str) -> None:
  """Makes pfl's ``torch.distributed.init_process_group(backend=...)`` use ``backend``
  (call before pfl is imported: pfl creates its process group at import)."""
  import torch.distributed as td
  init = td.init_process_group

  def init_process_group(*args, **kw):
    kw["backend"] = backend
    return init(*args, **kw)

  td.init_process_group = init_process_group


def resolve_dist_backend(choice: str, procs: int, device: str) -> str:
  """``auto``: gloo for several processes on one CUDA device (NCCL refuses two ranks on
  one GPU), else ``pfl`` (pfl's own choice: NCCL with CUDA, gloo without). One process
  makes no process group: always ``pfl``."""
  if procs == 1:
    return "pfl"
  if choice != "auto":
    return choice
  return "gloo" if device.startswith("cuda") else "pfl"

# --------------------------------------------------------------------------- shared


def build_torch_model(model: str):
  """The torch module with pfl's required ``loss`` / ``metrics`` methods."""
  import torch
  from torch import nn
  from pfl.metrics import Weighted

  class Classifier(nn.Module):

    def __init__(self, body: nn.Module):
      super().__init__()
      self.body = body

    def forward(self, x):
      return self.body(x)

    # pfl calls loss(*raw_data, **train_kwargs) per local step, as in pfl's benchmarks
    # (benchmarks/model/pytorch/metrics.py: image_classification_loss / _metrics).
    def loss(self, x, y, eval=False):  # noqa: A002 - pfl's keyword
      self.eval() if eval else self.train()
      return nn.functional.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):  # noqa: A002
      self.eval() if eval else self.train()
      logits = self(x)
      n = len(x)
      return {"loss": Weighted(nn.functional.cross_entropy(logits, y, reduction="sum")
                               .item(), n),
              "accuracy": Weighted((logits.argmax(-1) == y).sum().item(), n)}

  return Classifier(torch_body(model))


def build_pfl(model: str, X, Y, rounds_total: int, seed: int = 0, callbacks=()):
  """Builds the pfl objects for FedAvg on pool (X [C, 64, ...], Y [C, 64]) and returns
  ``(run, pfl_model, torch_module)``; ``run()`` does ``rounds_total`` central iterations
  with cohort = pool = C. Every rank must call this with the same arguments."""
  import numpy as np
  import torch
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler

  C = X.shape[0]
  # Identical initial model and sampler seeds on every rank (each applies the same
  # all-reduced update to its own copy).
  np.random.seed(seed)
  torch.manual_seed(seed)
  module = build_torch_model(model)
  dev = pfl_device()  # the pool lives on pfl's device (a no-op on the CPU)
  X = torch.as_tensor(X).to(dev)
  Y = torch.as_tensor(Y).long().to(dev)
  calls = [0] * C

  def make_dataset_fn(user_id: int):
    # This round's 5 batches of 32, drawn with replacement from the user's 64 examples
    # (reproducible per (seed, user, call) for the reference check).
    rng = np.random.default_rng((seed, user_id, calls[user_id]))
    calls[user_id] += 1
    idx = torch.from_numpy(rng.integers(0, N_PER_CLIENT, STEPS * BATCH)).to(dev)
    return Dataset((X[user_id, idx], Y[user_id, idx]), user_id=str(user_id))

  fd = FederatedDataset(make_dataset_fn, get_user_sampler("minimize_reuse", list(range(C))))
  return (*_fedavg(module, fd, C, rounds_total, LR, BATCH, callbacks), module)


def _fedavg(module, fd, cohort: int, rounds_total: int, lr: float, batch: int, callbacks,
            by_user: bool = False):
  """``(run, pfl_model)``: pfl's FedAvg over the federated dataset ``fd`` (a central
  SGD at lr 1.0, data-point weighting or, ``by_user``, equal user weights; no evaluation
  before ``rounds_total``), ``cohort`` users a round, 1 local epoch of ``batch`` at client
  lr ``lr``."""
  import torch
  from pfl.aggregate.simulate import SimulatedBackend
  from pfl.aggregate.weighting import WeightByDatapoints, WeightByUser
  from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
  from pfl.hyperparam import NNTrainHyperParams
  from pfl.model.pytorch import PyTorchModel
  params = [p for p in module.parameters() if p.requires_grad]
  pfl_model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                           central_optimizer=torch.optim.SGD(params, lr=1.0))
  backend = SimulatedBackend(training_data=fd, val_data=fd,
                             postprocessors=[WeightByUser() if by_user
                                             else WeightByDatapoints()])
  algo = FederatedAveraging()
  algo_params = NNAlgorithmParams(central_num_iterations=rounds_total,
                                  evaluation_frequency=rounds_total + 1,
                                  train_cohort_size=cohort, val_cohort_size=None)
  train_params = NNTrainHyperParams(local_learning_rate=lr, local_num_epochs=1,
                                    local_batch_size=batch)

  def run():
    return algo.run(algorithm_params=algo_params, backend=backend, model=pfl_model,
                    model_train_params=train_params, callbacks=list(callbacks),
                    send_metrics_to_platform=False)

  return run, pfl_model


def build_pfl_cifar10(X, Y, rounds_total: int, seed: int = 0, callbacks=()):
  """pfl-research's CIFAR10 setting over the pool (X float32 [C, 50, 32, 32, 3] NHWC, Y
  int64 [C, 50]): ``simple_cnn``, cohort = pool = C ('minimize_reuse' sampler), each user
  a ``Dataset`` of views into the device-resident pool, 1 epoch of batch 10 at lr 0.1,
  central SGD lr 1.0, ``WeightByUser``. Returns ``(run, pfl_model, torch_module)``."""
  import numpy as np
  import torch
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler

  C = X.shape[0]
  np.random.seed(seed)
  torch.manual_seed(seed)
  module = build_torch_model("cifar10")
  n = param_count(module)
  assert n == EXPECTED_PARAMS["cifar10"], f"cifar10 simple_cnn has {n} parameters"
  dev = pfl_device()
  X = torch.as_tensor(X).to(dev)
  Y = torch.as_tensor(Y).long().to(dev)

  def make_dataset_fn(user_id: int):
    return Dataset((X[user_id], Y[user_id]), user_id=str(user_id))

  fd = FederatedDataset(make_dataset_fn, get_user_sampler("minimize_reuse", list(range(C))))
  assert CIFAR10_EPOCHS == 1
  return (*_fedavg(module, fd, C, rounds_total, CIFAR10_LR, CIFAR10_BATCH, callbacks,
                   by_user=True), module)


def build_pfl_femnist(pool: dict, cohort: int, rounds_total: int, seed: int = 0,
                      callbacks=(), examples_log: list | None = None):
  """The pfl objects for FEMNIST FedAvg over ``pool`` ({writer id: (x uint8 [n, 1, 28,
  28], y int64 [n]) torch tensors}): ``cohort`` writers a round from pfl's random user
  sampler, 1 local epoch of batch 20, client SGD lr 0.1, server SGD lr 1.0, weighted by
  data points. Returns ``(run, pfl_model, torch_module)`` as :func:`build_pfl`;
  ``examples_log`` (a list) gets the size of every writer this rank is handed."""
  import numpy as np
  import torch
  from pfl.data.dataset import Dataset
  from pfl.data.federated_dataset import FederatedDataset
  from pfl.data.sampling import get_user_sampler

  np.random.seed(seed)  # same model, dataset seeds and user draws on every rank
  torch.manual_seed(seed)
  module = build_torch_model("femnist")
  n = param_count(module)
  assert n == EXPECTED_PARAMS["femnist"], f"femnist CNN has {n} parameters"
  # As pfl-research's benchmarks/dataset/femnist.py: FederatedDataset.from_slices(pool,
  # get_user_sampler('random', writers)); written out to count each writer's examples.
  def make_dataset_fn(user_id):
    if examples_log is not None:
      examples_log.append(len(pool[user_id][1]))
    return Dataset(pool[user_id], user_id=user_id)

  fd = FederatedDataset(make_dataset_fn, get_user_sampler("random", list(pool)))
  return (*_fedavg(module, fd, cohort, rounds_total, FEMNIST_LR, FEMNIST_BATCH, callbacks),
          module)


def femnist_pool(num_clients: int, seed: int = 0) -> dict:
  """{writer id: (x uint8 [n, 1, 28, 28], y int64 [n])}: torch views into one uint8 pool
  tensor and one int64 label tensor (``torch_workload.make_femnist_data``)."""
  import torch
  x, y, offsets = make_femnist_data(num_clients, seed)
  X, Y = torch.from_numpy(x), torch.from_numpy(y)  # share the numpy memory
  dev = pfl_device()
  if dev.type != "cpu":  # the pool on the device once (views of it per writer)
    X, Y = X.to(dev), Y.to(dev)
  return {f"f{i:04d}_{i % 100:02d}": (X[int(offsets[i]):int(offsets[i + 1])],
                                      Y[int(offsets[i]):int(offsets[i + 1])])
          for i in range(num_clients)}


def machine() -> dict:
  """CPU model (``/proc/cpuinfo``'s first model name, else ``platform.processor()``) and
  core count."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  return dict(cpu=cpu, cores=os.cpu_count() or 1)


def versions() -> dict:
  out = {}
  for mod in ("pfl", "torch", "numpy"):
    try:
      out[mod] = __import__(mod).__version__
    except Exception as e:  # noqa: BLE001 - report what is missing
      out[mod] = f"unavailable: {type(e).__name__}: {e}"
  return out


# --------------------------------------------------------------------------- one worker


def worker_main(a) -> int:
  """One pfl process of a (possibly multi-process) run; writes its result to ``a.out``."""
  import resource
  import torch
  if a.threads > 0:
    torch.set_num_threads(a.threads)
  tf32 = set_tf32(a.tf32)
  if a.dist_backend in ("gloo", "nccl"):
    force_dist_backend(a.dist_backend)  # before pfl creates its process group at import
  from pfl.callback.base import TrainingProcessCallback
  from pfl.internal.ops import pytorch_ops
  from pfl.metrics import Metrics

  dist = pytorch_ops.distributed  # created at import from PFL_WORKER_* (or single process)
  t0 = a.t0 if a.t0 is not None else time.time()  # the launcher's time at Popen
  femnist = a.model == "femnist"
  cuda = pfl_device().type == "cuda"
  seen = []  # femnist: sizes of the writers this rank trains, in order
  if femnist:
    pool = femnist_pool(a.femnist_clients, a.seed)
    examples = sum(len(v[1]) for v in pool.values())
  elif a.model == "cifar10":
    X, y = make_cifar10_data(a.clients, a.seed)
  else:
    x, y = make_data(a.clients, a.seed)
    X = to_model_layout(a.model, x)
    del x
  first_rounds = max(1, a.warmup)

  class Timer(TrainingProcessCallback):
    """Per-central-iteration wall times; after round 0 the ranks agree on how many timed
    rounds fit the budget (all-reduce of the slowest first round)."""

    def __init__(self):
      self.laps, self.stop_after = [], first_rounds + a.rounds
      self.examples, self.seen_before = [], 0

    def on_train_begin(self, *, model):
      self.t = time.perf_counter()
      return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
      if cuda:
        torch.cuda.synchronize()  # the round's kernels are done
      now = time.perf_counter()
      self.laps.append(now - self.t)
      self.examples.append(sum(seen) - self.seen_before)  # this rank's, this round
      self.seen_before = sum(seen)
      if central_iteration == 0:
        self.first_round_at = time.time() - t0
      if central_iteration == 0 and a.rounds > 2:
        first = torch.tensor([self.laps[0]])
        if dist.world_size > 1:
          first = dist.all_reduce([first])[0] / dist.world_size  # mean over ranks
        timed = max(2, min(a.rounds, int(a.budget_s / max(float(first[0]), 1e-9))))
        self.stop_after = first_rounds + timed
      self.t = time.perf_counter()
      return len(self.laps) >= self.stop_after, Metrics()

  timer = Timer()
  if femnist:
    run, _, module = build_pfl_femnist(pool, a.clients, first_rounds + a.rounds, a.seed,
                                       [timer], seen)
  elif a.model == "cifar10":
    run, _, module = build_pfl_cifar10(X, y, first_rounds + a.rounds, a.seed, [timer])
  else:
    run, _, module = build_pfl(a.model, X, y, first_rounds + a.rounds, a.seed, [timer])
  setup_s = time.time() - t0
  if cuda:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()  # the peak of the training, pool and model included
  run()
  laps = timer.laps
  mem = {}
  if cuda:
    mem = dict(device_mem_peak_bytes=torch.cuda.max_memory_allocated(),
               device_mem_reserved_peak_bytes=torch.cuda.max_memory_reserved(),
               gpu=torch.cuda.get_device_name())
  res = dict(rank=dist.global_rank, world=dist.world_size, threads=torch.get_num_threads(),
             params=param_count(module), first_round_s=laps[0],
             timed=laps[first_rounds:], ru_maxrss_kb=resource.getrusage(
                 resource.RUSAGE_SELF).ru_maxrss, setup_s=setup_s,
             first_round_at_s=timer.first_round_at, device=str(pfl_device()), tf32=tf32,
             dist_backend=a.dist_backend, **mem, **versions())
  if femnist:
    res.update(examples=examples, writers=len(pool),
               timed_examples=timer.examples[first_rounds:len(laps)])
  with open(a.out, "w") as f:
    json.dump(res, f)
  return 0


# --------------------------------------------------------------------------- launcher


def parse_config(spec: str, cores: int) -> tuple[int, int]:
  """'P' -> (P, cores // P); 'PxT' -> (P, T); T = 0: torch's default thread count."""
  procs, _, threads = spec.lower().partition("x")
  procs = int(procs)
  if procs < 1:
    raise ValueError(f"config {spec!r}: use >= 1 processes.")
  if not threads:
    return procs, (0 if procs == 1 else max(1, cores // procs))
  return procs, int(threads)


def free_ports(n: int) -> list[int]:
  socks = []
  try:
    for _ in range(n):
      s = socket.socket()
      s.bind(("127.0.0.1", 0))
      socks.append(s)
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def launch(model: str, C: int, procs: int, threads: int, a) -> list[dict]:
  """Runs one measurement in ``procs`` fresh worker processes; returns their results."""
  with tempfile.TemporaryDirectory(prefix="bench_pfl_") as tmp:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PFL_WORKER_", "TORCHELASTIC", "XLA_FLAGS"))}
    env["PFL_PYTORCH_DEVICE"] = a.device
    if threads > 0:
      env["OMP_NUM_THREADS"] = str(threads)
    ports = free_ports(procs) if procs > 1 else []
    children = []
    for r in range(procs):
      e = dict(env)
      if procs > 1:
        e.update(PFL_WORKER_ADDRESSES=",".join(f"localhost:{p}" for p in ports),
                 PFL_WORKER_RANK=str(r), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(procs))
      out = os.path.join(tmp, f"rank{r}.json")
      cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
             "--clients", str(C), "--threads", str(threads), "--warmup", str(a.warmup),
             "--rounds", str(a.rounds), "--budget-s", str(a.budget_s), "--seed",
             str(a.seed), "--femnist-clients", str(a.femnist_clients), "--out", out,
             "--tf32", a.tf32, "--dist-backend",
             resolve_dist_backend(a.dist_backend, procs, a.device)]
      log = open(os.path.join(tmp, f"rank{r}.log"), "w")
      cmd += ["--t0", repr(time.time())]  # the worker's process start, for setup_s
      children.append((subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT),
                       out, log))
    deadline = time.monotonic() + a.timeout_s
    failed = None
    for proc, _, _ in children:
      try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        if rc != 0 and failed is None:
          failed = f"exit {rc}"
      except subprocess.TimeoutExpired:
        failed = failed or f"timed out after {a.timeout_s:.0f} s"
        break
    if failed:
      for proc, _, _ in children:  # only the processes started here, by their handles
        if proc.poll() is None:
          proc.kill()
          proc.wait()
    results, logs = [], []
    for r, (proc, out, log) in enumerate(children):
      log.close()
      if a.logs:  # keep the workers' full output (pfl's warnings, tracebacks)
        os.makedirs(a.logs, exist_ok=True)
        with open(log.name) as f, open(os.path.join(
            a.logs, f"{model}_C{C}_{procs}x{threads}_rank{r}.log"), "w") as g:
          g.write(f.read())
      with open(log.name) as f:
        logs.append(f"rank {r}: " + f.read()[-1500:])
      if os.path.exists(out):
        with open(out) as f:
          results.append(json.load(f))
    if failed or len(results) != procs:
      raise RuntimeError(f"pfl workers failed ({failed or 'missing results'}):\n"
                         + "\n".join(logs))
    return results


def device_fields(results: list[dict]) -> dict:
  """The GPU fields of a row: device, process-group backend, TF32 flags, and the device
  memory peaks (summed over ranks; None on the CPU)."""
  r0 = min(results, key=lambda r: r["rank"])
  peaks = [r.get("device_mem_peak_bytes") for r in results]
  have = all(p is not None for p in peaks)
  mb = lambda b: round(b / 2 ** 20, 1)  # noqa: E731
  return dict(device=r0.get("device"), gpu=r0.get("gpu"), tf32=r0.get("tf32"),
              dist_backend=r0.get("dist_backend"),
              device_mem_peak_mb=mb(sum(peaks)) if have else None,
              device_mem_peak_mb_per_rank=[mb(p) for p in peaks] if have else None,
              device_mem_reserved_peak_mb=(
                  mb(sum(r["device_mem_reserved_peak_bytes"] for r in results))
                  if have else None))


def make_row(model: str, C: int, procs: int, results: list[dict]) -> dict:
  r0 = min(results, key=lambda r: r["rank"])
  n = min(len(r["timed"]) for r in results)
  times = [max(r["timed"][i] for r in results) for i in range(n)]  # slowest rank
  first = max(r["first_round_s"] for r in results)
  med = statistics.median(times)
  t = r0["threads"]
  layout = (f"{t} thread{'s' * (t > 1)}" if procs == 1 else
            f"{procs} procs x {t} thread{'s' * (t > 1)}")
  impl = f"pfl {r0['pfl']} (torch {r0['torch'].split('+')[0]}, {layout})"
  rss = sum(r["ru_maxrss_kb"] for r in results) / 1024.0
  recipe = (f"cifar10 simple_cnn, 50 examples a user, 1 epoch of batch {CIFAR10_BATCH}, lr "
            f"{CIFAR10_LR}, WeightByUser; " if model == "cifar10" else "")
  note = (f"pfl FederatedAveraging + SimulatedBackend, PyTorchModel, in-memory Dataset; "
          f"{recipe}{procs} process{'es' * (procs > 1)} x torch.set_num_threads({t})"
          + ("; multi-process via PFL_WORKER_ADDRESSES (gloo all-reduce)" if procs > 1
             else "") + f"; {r0['params']} params; first round includes pfl's iteration-0 "
          "per-user evaluation")
  return dict(source="peer", workload=workload_name(model), model=model,
              algorithm="fedavg", clients=C, pool=C, impl=impl, strategy=None,
              chunk_size=None, rounds_timed=len(times), round_s=med, round_s_min=min(times),
              round_s_max=max(times), client_updates_per_s=C / med,
              compile_s=max(0.0, first - med), first_round_s=first, rss_peak_mb=rss,
              processes=procs, threads=t, params=r0["params"], ratio_vs_loop=None,
              **device_fields(results), note=note)


def make_femnist_row(C: int, procs: int, results: list[dict]) -> dict:
  """The ``femnist_fedavg`` row: the timing of :func:`make_row` plus ``C``, ``setup_s``,
  ``first_round_at_s`` (max over ranks), ``examples``, per timed round its time and its
  cohort's examples (summed over ranks), ``examples_per_s``, ``versions``, ``machine``."""
  r0 = min(results, key=lambda r: r["rank"])
  n = min(len(r["timed"]) for r in results)
  times = [max(r["timed"][i] for r in results) for i in range(n)]  # slowest rank
  ex = [sum(r["timed_examples"][i] for r in results) for i in range(n)]  # all ranks
  first = max(r["first_round_s"] for r in results)
  med = statistics.median(times)
  t = r0["threads"]
  layout = (f"{t} thread{'s' * (t > 1)}" if procs == 1 else
            f"{procs} procs x {t} thread{'s' * (t > 1)}")
  impl = f"pfl {r0['pfl']} (torch {r0['torch'].split('+')[0]}, {layout})"
  note = ("pfl FederatedAveraging + SimulatedBackend, PyTorchModel, "
          "FederatedDataset.from_slices (in-memory Dataset per writer, uint8 images), "
          f"'random' user sampler; {C} of {r0['writers']} writers a round, 1 epoch of "
          f"batch {FEMNIST_BATCH}, client SGD lr {FEMNIST_LR}, server SGD lr 1.0, "
          f"WeightByDatapoints; {procs} process{'es' * (procs > 1)} x "
          f"torch.set_num_threads({t})"
          + ("; multi-process via PFL_WORKER_ADDRESSES (gloo all-reduce)" if procs > 1
             else "") + f"; {r0['params']} params; first round includes pfl's "
          "iteration-0 per-user evaluation")
  return dict(source="peer", workload=FEMNIST_WORKLOAD, model="femnist_cnn",
              algorithm="fedavg", C=C, clients=r0["writers"], pool=r0["writers"],
              examples=r0["examples"], impl=impl, rounds_timed=len(times), round_s=med,
              round_s_min=min(times), round_s_max=max(times),
              client_updates_per_s=C / med, round_times_s=times,
              round_examples=ex, examples_per_s=sum(ex) / sum(times),
              compile_s=max(0.0, first - med), first_round_s=first,
              setup_s=max(r["setup_s"] for r in results),
              first_round_at_s=max(r["first_round_at_s"] for r in results),
              rss_peak_mb=sum(r["ru_maxrss_kb"] for r in results) / 1024.0,
              processes=procs, threads=t, params=r0["params"],
              versions={k: r0[k] for k in ("pfl", "torch", "numpy")}, machine=machine(),
              **device_fields(results), note=note)


def bench_main(a) -> int:
  cores = os.cpu_count() or 1
  specs = [s for s in a.configs.split(",") if s] if a.configs else (
      ["1x1", "1"] + [f"{cores}x1"] if cores > 1 else ["1"])
  clients = [int(c) for c in a.clients.split(",") if c]
  models = [m for m in a.models.split(",") if m]
  rows, notes = [], []
  meta = dict(python=platform.python_version(), cpu_count=cores,
              cpu=machine()["cpu"], device=a.device, tf32=a.tf32,
              dist_backend=a.dist_backend, command=" ".join(sys.argv), **versions())

  def write(partial: bool):
    if a.json and a.json != "-":
      tmp = a.json + ".tmp"
      with open(tmp, "w") as f:
        f.write(json.dumps(dict(meta=dict(meta, partial=partial), rows=rows, notes=notes),
                           indent=1))
      os.replace(tmp, a.json)

  for spec in specs:
    procs, threads = parse_config(spec, cores)
    for model in models:
      if model not in MODELS:
        notes.append(f"unknown model {model!r}; choose from {list(MODELS)}")
        continue
      last = None
      for C in ([a.femnist_cohort] if model == "femnist" else clients):
        if last and last[1] * C / last[0] > a.max_round_s:
          notes.append(f"pfl {spec} {model}: C={C} skipped (predicted "
                       f"{last[1] * C / last[0]:.0f} s per round from C={last[0]}, > "
                       f"--max-round-s {a.max_round_s:.0f})")
          continue
        print(f"  pfl {spec} {model} C={C} ...", file=sys.stderr, flush=True)
        try:
          results = launch(model, C, procs, threads, a)
          r = (make_femnist_row(C, procs, results) if model == "femnist" else
               make_row(model, C, procs, results))
          rows.append(r)
          last = (C, r["round_s"])
        except Exception as e:  # record the exact error, go on with the other configs
          notes.append(f"pfl {spec} {model}: C={C} failed: {type(e).__name__}: {e}\n"
                       f"{traceback.format_exc(limit=2)}")
          break
        finally:
          write(partial=True)  # a run stopped by a time limit keeps what it measured
  try:
    meta["loadavg"] = os.getloadavg()
  except OSError:
    pass
  payload = dict(meta=meta, rows=rows, notes=notes)
  text = json.dumps(payload, indent=1)
  if a.json == "-":
    print(text)
  elif a.json:
    write(partial=False)
  else:
    for r in rows:
      print(f"{r['workload']:14s} {r['impl']:40s} C={r.get('C', r['clients']):<6d} "
            f"{r['round_s']:.4g} s/round ({r['client_updates_per_s']:.0f} updates/s, "
            f"first {r['first_round_s']:.3g} s, peak RSS {r['rss_peak_mb']:.0f} MB)")
    for n in notes:
      print(n)
  return 0


# --------------------------------------------------------------------------- checks


def reference_round(model: str, module0, X, Y, seed: int = 0):
  """One FedAvg round written out in plain torch with the same batches pfl gets:
  returns the new flat parameter vector."""
  import copy
  import numpy as np
  import torch
  g = torch.nn.utils.parameters_to_vector(module0.parameters()).detach().clone()
  acc = torch.zeros_like(g)
  X, Y = torch.as_tensor(X), torch.as_tensor(Y).long()
  for c in range(X.shape[0]):
    m = copy.deepcopy(module0)
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    idx = torch.from_numpy(np.random.default_rng((seed, c, 0)).integers(
        0, N_PER_CLIENT, STEPS * BATCH))
    for s in range(STEPS):
      b = idx[s * BATCH:(s + 1) * BATCH]
      opt.zero_grad()
      torch.nn.functional.cross_entropy(m(X[c, b]), Y[c, b]).backward()
      opt.step()
    acc += torch.nn.utils.parameters_to_vector(m.parameters()).detach() - g
  return g + acc / X.shape[0]


def femnist_check(a) -> dict:
  """FEMNIST: the parameter count, and ``--check-rounds`` pfl rounds of
  ``--clients-check`` writers from the first 100 of a 120-writer FEMNIST-shaped pool,
  tested on the other 20 writers' examples (held-out writers, their own shifts)."""
  import torch
  from pfl.data.dataset import Dataset
  from pfl.hyperparam import NNEvalHyperParams
  pool = femnist_pool(120, a.seed)
  ids = list(pool)
  train = {k: pool[k] for k in ids[:100]}
  test = Dataset((torch.cat([pool[k][0] for k in ids[100:]]),
                  torch.cat([pool[k][1] for k in ids[100:]])))
  run, pfl_model, module = build_pfl_femnist(train, a.clients_check, a.check_rounds,
                                             a.seed)
  n = param_count(module)
  ev = NNEvalHyperParams(local_batch_size=500)

  def acc():
    md = {str(k): v.overall_value for k, v in pfl_model.evaluate(test, eval_params=ev)}
    return md["accuracy"], md["loss"]

  acc0, loss0 = acc()
  t0 = time.perf_counter()
  run()
  secs = time.perf_counter() - t0
  acc1, loss1 = acc()
  c = dict(model="femnist", params=n, expected_params=EXPECTED_PARAMS["femnist"],
           param_shapes=[tuple(p.shape) for p in module.parameters()],
           clients=a.clients_check, pool=100, test_examples=len(test),
           rounds=a.check_rounds, test_acc_before=acc0, test_acc_after=acc1,
           test_loss_before=loss0, test_loss_after=loss1, train_seconds=secs)
  c["ok"] = n == EXPECTED_PARAMS["femnist"] and acc1 > acc0 + 0.2
  print(f"femnist: {n} params (expected {EXPECTED_PARAMS['femnist']})\n  "
        f"{a.check_rounds} rounds x {a.clients_check} writers: test accuracy (20 "
        f"held-out writers, {len(test)} examples) {acc0:.3f} -> {acc1:.3f}, loss "
        f"{loss0:.3f} -> {loss1:.3f} ({secs:.1f} s)  {'OK' if c['ok'] else 'FAIL'}", file=sys.stderr,
        flush=True)
  return c


def cifar10_check(a) -> dict:
  """CIFAR10: the parameter count and shapes, and 2 pfl rounds of 4 clients that move
  the weights (no torch reference round: its dropout masks would differ)."""
  import torch
  x, y = make_cifar10_data(4, a.seed)
  run, _, module = build_pfl_cifar10(x, y, 2, a.seed)
  before = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
  t0 = time.perf_counter()
  run()
  secs = time.perf_counter() - t0
  moved = float((torch.nn.utils.parameters_to_vector(module.parameters()).detach()
                 - before).abs().max())
  n = param_count(module)
  c = dict(model="cifar10", params=n, expected_params=EXPECTED_PARAMS["cifar10"],
           param_shapes=[tuple(p.shape) for p in module.parameters()], clients=4,
           rounds=2, max_abs_change=moved, train_seconds=secs)
  c["ok"] = n == EXPECTED_PARAMS["cifar10"] and moved > 0
  print(f"cifar10: {n} params (expected {EXPECTED_PARAMS['cifar10']}) "
        f"{c['param_shapes']}\n  2 rounds x 4 clients: max |change| {moved:.2e} "
        f"({secs:.1f} s)  {'OK' if c['ok'] else 'FAIL'}", file=sys.stderr, flush=True)
  return c


def check_main(a) -> int:
  import torch
  if a.threads > 0:
    torch.set_num_threads(a.threads)
  from pfl.data.dataset import Dataset
  from pfl.hyperparam import NNEvalHyperParams
  out = dict(meta=dict(python=platform.python_version(), **versions()), checks=[])
  ok = True
  for model in [m for m in a.models.split(",") if m]:
    if model in ("femnist", "cifar10"):  # no torch reference round: dropout draws differ
      c = femnist_check(a) if model == "femnist" else cifar10_check(a)
      ok &= c["ok"]
      out["checks"].append(c)
      continue
    # 1. the torch model has fedjax_inv's layer shapes
    m = build_torch_model(model)
    shapes = [tuple(p.shape) for p in m.parameters()]
    n = param_count(m)
    # 2. one pfl round == the same FedAvg round written out in torch
    C = 4
    x, y = make_data(C, a.seed)
    X = to_model_layout(model, x)
    run, pfl_model, module = build_pfl(model, X, y, 1, a.seed)
    import copy
    before = copy.deepcopy(module)
    ref = reference_round(model, before, X, y, a.seed)
    run()
    got = torch.nn.utils.parameters_to_vector(module.parameters()).detach()
    diff = float((got - ref).abs().max())
    moved = float((got - torch.nn.utils.parameters_to_vector(before.parameters()).detach())
                  .abs().max())
    # 3. learning on a learnable synthetic task
    (xt, yt), (xe, ye) = learnable_task(a.clients_check, 2000)
    Xt, Xe = to_model_layout(model, xt), to_model_layout(model, xe)
    run, pfl_model, module = build_pfl(model, Xt, yt, a.check_rounds, a.seed)
    test = Dataset((torch.as_tensor(Xe), torch.as_tensor(ye)))
    ev = NNEvalHyperParams(local_batch_size=500)

    def acc():
      md = {str(k): v.overall_value for k, v in pfl_model.evaluate(test, eval_params=ev)}
      return md["accuracy"], md["loss"]

    acc0, loss0 = acc()
    t0 = time.perf_counter()
    run()
    secs = time.perf_counter() - t0
    acc1, loss1 = acc()
    c = dict(model=model, params=n, expected_params=EXPECTED_PARAMS[model],
             param_shapes=shapes, one_round_vs_reference_max_abs_diff=diff,
             one_round_max_abs_change=moved, clients=a.clients_check,
             rounds=a.check_rounds, test_acc_before=acc0, test_acc_after=acc1,
             test_loss_before=loss0, test_loss_after=loss1, train_seconds=secs)
    c["ok"] = (n == EXPECTED_PARAMS[model] and diff < 1e-4 * max(1.0, moved)
               and acc1 > acc0 + 0.2)
    ok &= c["ok"]
    out["checks"].append(c)
    print(f"{model}: {n} params (expected {EXPECTED_PARAMS[model]}) {shapes}\n"
          f"  one round vs torch reference: max |diff| {diff:.2e} (update max "
          f"{moved:.2e})\n  {a.check_rounds} rounds x {a.clients_check} clients: test "
          f"accuracy {acc0:.3f} -> {acc1:.3f}, loss {loss0:.3f} -> {loss1:.3f} "
          f"({secs:.1f} s)  {'OK' if c['ok'] else 'FAIL'}", file=sys.stderr, flush=True)
  if a.json == "-":
    print(json.dumps(out, indent=1))
  elif a.json:
    with open(a.json, "w") as f:
      json.dump(out, f, indent=1)
  return 0 if ok else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--clients", default="10,100", help="comma list of cohort sizes")
  p.add_argument("--models", default="mlp,cnn",
                 help="comma list from mlp,cnn,femnist,cifar10 (femnist: the FEMNIST FedAvg "
                      "workload; it ignores --clients, see --femnist-*; cifar10: "
                      "pfl-research's own CIFAR10 setting, simple_cnn, 50 images a user, 1 "
                      "epoch of batch 10)")
  p.add_argument("--femnist-clients", type=int, default=3400,
                 help="femnist: writers in the pool (sizes femnist_sizes(N, seed))")
  p.add_argument("--femnist-cohort", type=int, default=10,
                 help="femnist: writers sampled a round (C)")
  p.add_argument("--logs", default=None,
                 help="folder to keep every worker's full stdout/stderr in")
  p.add_argument("--configs", default=None,
                 help="comma list of process layouts 'P' or 'PxT' (P pfl worker "
                      "processes x T torch threads; 'P' = cores // P threads, '1' = "
                      "torch's default); default '1x1,1,<cores>x1' ('1' on one core)")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--budget-s", type=float, default=60.0,
                 help="fewer timed rounds (>= 2) when they would take longer")
  p.add_argument("--max-round-s", type=float, default=300.0,
                 help="skip a larger C when its predicted round (linear in C) is longer")
  p.add_argument("--timeout-s", type=float, default=1800.0,
                 help="per (config, model, C) measurement")
  p.add_argument("--device", default="cpu", help="PFL_PYTORCH_DEVICE for the workers")
  p.add_argument("--tf32", default="off", choices=("off", "on", "default"),
                 help="CUDA float32 arithmetic in every worker: off = "
                      "torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn."
                      "allow_tf32 = False (float32-exact, the default), on = both True, "
                      "default = torch's own (cuDNN convolutions in TF32)")
  p.add_argument("--dist-backend", default="auto", choices=("auto", "pfl", "gloo", "nccl"),
                 help="torch.distributed backend of a multi-process run: auto = gloo for "
                      "several processes on one CUDA device (NCCL refuses two ranks on "
                      "one GPU), else pfl's own choice (pfl)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default=None, help="write JSON here ('-' = stdout)")
  p.add_argument("--check-training", action="store_true",
                 help="check the models' shapes, one pfl round against a torch "
                      "reference, and learning on a learnable synthetic task")
  p.add_argument("--check-rounds", type=int, default=20)
  p.add_argument("--clients-check", type=int, default=10)
  # internal: one worker process of a measurement
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
  p.add_argument("--threads", type=int, default=0,
                 help="torch threads in --check-training (0: torch's default)")
  p.add_argument("--out", default=None, help=argparse.SUPPRESS)
  p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.rounds < 1 or a.warmup < 0:
    p.error(f"--rounds {a.rounds} / --warmup {a.warmup}: use rounds >= 1, warmup >= 0")
  if a.worker:
    a.clients = int(a.clients)
    return worker_main(a)
  if a.check_training:
    return check_main(a)
  return bench_main(a)


if __name__ == "__main__":
  sys.exit(main())
