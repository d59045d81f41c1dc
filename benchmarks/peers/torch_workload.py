"""The torch side of the peers' FedAvg workload, shared by ``bench_pfl.py`` and
``bench_flower.py`` (they run in their own environments, from this folder, so this is a
plain module beside them, never part of fedjax_inv).

Workload (``mlp_fedavg`` / ``cnn_fedavg`` of ``benchmarks/workloads.py``): 64 synthetic
MNIST-shaped examples per client (x uniform in [0, 1), 10 uniform labels; the arrays of
``bench_peers.make_data``), local training = 5 SGD steps (lr 0.1) on batches of 32 drawn
with replacement. Models in torch with the layer shapes of ``fedjax_inv.models``:
``mlp`` 784-128-10 (101,770 parameters), ``cnn`` = ``models.cnn(1)`` (3x3 convs
1->32->64->64 'SAME', ReLU, 2x2 max-pool after the first two, global max, Linear 64->10;
56,394 parameters, He-normal conv kernels, zero biases).

FEMNIST workload (``femnist_fedavg``; Reddi et al. 2021 App. D, used by ``bench_pfl.py
--models femnist``): 3,400 writers whose training-set sizes are
``fedjax_inv/data/federated_synthetic.py::femnist_sizes(3400, seed=0)`` (TFF's 671,585
examples, LEAF's spread; the file is loaded by path, so neither jax nor the package is
imported), images 28x28x1 stored as uint8 (``make_femnist_data``: 62 blob templates at
190, a per-writer shift of -2..2 pixels, plus uniform uint8 noise 0..63; learnable-ish,
only the sizes and dtype matter), labels int64 in 0..61. Model ``femnist`` = Reddi et
al.'s EMNIST CNN as ``fedjax_inv.models.federated.femnist_cnn``: Conv 3x3 32 (valid) ReLU
-> Conv 3x3 64 ReLU -> MaxPool 2x2 -> Dropout 0.25 -> Flatten -> Dense 128 ReLU ->
Dropout 0.5 -> Dense 62 (1,206,590 parameters; Glorot-uniform kernels, zero biases; torch
flattens NCHW where fedjax_inv flattens NHWC, the same shapes otherwise). Its first layer
turns the uint8 batch into float32 / 255, so the pool stays uint8 in memory.

CIFAR10 workload (``cifar10_fedavg``; ``bench_pfl.py --models cifar10``): pfl-research's
own CIFAR10 benchmark setting (apple/pfl-research ``benchmarks/image_classification/
configs/baseline.yaml``: ``model_name: simple_cnn``, ``cohort_size: 50``,
``mean_datapoints_per_user: 50`` constant, ``local_batch_size: 10``, ``local_num_epochs:
1``, ``local_learning_rate: 0.1``, central SGD ``learning_rate: 1.0``, ``weight_by_samples:
false``). Model ``cifar10`` = ``simple_cnn((32, 32, 3), 10)`` of pfl-research's
``benchmarks/model/pytorch/cnn.py``, copied layer for layer (Transpose2D NHWC -> NCHW, Conv
3x3 3->32, ReLU, Conv 3x3 32->64, ReLU, MaxPool 2, Dropout 0.25, Flatten 12,544, Linear
128, ReLU, Dropout 0.5, Linear 10; Glorot-uniform weights, torch's default biases):
1,626,442 parameters, as ``benchmarks/cifar10_cnn.py`` on the fedjax_inv side. Data
(``make_cifar10_data``): 50 float32 images [32, 32, 3] (NHWC, as pfl's CIFAR10 pickles)
uniform in [0, 1) per client, 10 uniform labels (int64).
"""
from __future__ import annotations

N_PER_CLIENT = 64
BATCH = 32
STEPS = 5
LR = 0.1
NUM_CLASSES = 10
WORKLOADS = {"mlp": "mlp_fedavg", "cnn": "cnn_fedavg"}
EXPECTED_PARAMS = {"mlp": 784 * 128 + 128 + 128 * 10 + 10, "cnn": 56_394,
                   "femnist": 1_206_590,
                   # conv 3->32, conv 32->64, dense 12544->128, dense 128->10
                   "cifar10": (27 * 32 + 32) + (288 * 64 + 64) + (12_544 * 128 + 128)
                   + (128 * 10 + 10)}

# pfl-research's CIFAR10 benchmark (baseline.yaml): 50 images a user, 1 epoch of batch 10,
# client SGD lr 0.1, central SGD lr 1.0, users weighted equally.
CIFAR10_WORKLOAD = "cifar10_fedavg"
CIFAR10_N = 50
CIFAR10_BATCH = 10
CIFAR10_EPOCHS = 1
CIFAR10_LR = 0.1
CIFAR10_SHAPE = (32, 32, 3)

# FEMNIST FedAvg (Reddi et al. 2021 App. D): 10 writers a round from 3,400, 1 local epoch
# of batch 20, client SGD lr 0.1, server SGD lr 1.0, weighted by examples.
FEMNIST_WORKLOAD = "femnist_fedavg"
FEMNIST_CLIENTS = 3400
FEMNIST_COHORT = 10
FEMNIST_BATCH = 20
FEMNIST_LR = 0.1
FEMNIST_CLASSES = 62


def make_data(C: int, seed: int = 0):
  """The synthetic pool of ``bench_peers.make_data``: x [C, 64, 28, 28, 1] uniform [0, 1),
  y [C, 64] uniform labels (int32)."""
  import numpy as np
  rng = np.random.default_rng(seed)
  x = rng.random((C, N_PER_CLIENT, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, (C, N_PER_CLIENT)).astype(np.int32)
  return x, y


def make_cifar10_data(C: int, seed: int = 0):
  """CIFAR10-shaped synthetic clients: x [C, 50, 32, 32, 3] (NHWC) float32 uniform in
  [0, 1), y [C, 50] int64 uniform in 0..9."""
  import numpy as np
  rng = np.random.default_rng([int(seed), 0xC1FA])
  x = rng.random((C, CIFAR10_N) + CIFAR10_SHAPE, dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, (C, CIFAR10_N)).astype(np.int64)
  return x, y


def learnable_task(C: int, n_test: int, seed: int = 1, label_dtype: str = "int64"):
  """Labels from class templates: x = 0.8 U + 0.2 T_y, T_k a fixed random 0/1 28x28
  pattern per class (local texture, so the global-max CNN can learn it too). Returns
  ``((x [C, 64, 28, 28, 1], y [C, 64]), (x_test [n_test, ...], y_test [n_test]))``."""
  import numpy as np
  rng = np.random.default_rng(seed)
  T = (rng.random((NUM_CLASSES, 28, 28, 1)) < 0.5).astype(np.float32)

  def draw(shape):
    y = rng.integers(0, NUM_CLASSES, shape)
    x = (0.8 * rng.random(shape + (28, 28, 1)) + 0.2 * T[y]).astype(np.float32)
    return x, y.astype(label_dtype)

  return draw((C, N_PER_CLIENT)), draw((n_test,))


def to_model_layout(model: str, x):
  """Host layout the torch model takes, converted once outside the timed rounds: mlp
  [..., 784], cnn NCHW [..., 1, 28, 28]."""
  import numpy as np
  lead = x.shape[:-3]
  if model == "mlp":
    return np.ascontiguousarray(x.reshape(*lead, 784))
  return np.ascontiguousarray(np.moveaxis(x, -1, -3))


def femnist_sizes(num_clients: int = FEMNIST_CLIENTS, seed: int = 0):
  """``fedjax_inv/data/federated_synthetic.py::femnist_sizes`` (numpy only), loaded from
  its file: importing ``fedjax_inv.data`` would import jax through the package."""
  import importlib.util
  import os
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                      "fedjax_inv", "data", "federated_synthetic.py")
  spec = importlib.util.spec_from_file_location("_fedjax_inv_federated_synthetic",
                                                os.path.normpath(path))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.femnist_sizes(num_clients, seed)


def make_femnist_data(num_clients: int = FEMNIST_CLIENTS, seed: int = 0):
  """A FEMNIST-shaped pool with :func:`femnist_sizes` writers' sizes: returns ``(x uint8
  [N, 1, 28, 28] (NCHW), y int64 [N] in 0..61, offsets int64 [num_clients + 1])``, writer
  ``i`` owning rows ``offsets[i]:offsets[i + 1]`` (N = sizes.sum(), 671,585 for 3,400).
  Image = its label's blob template (pixels 0 or 190) rolled by the writer's shift
  (dy, dx in -2..2) plus uniform uint8 noise in 0..63, written straight into one uint8
  array (no float32 copy of the pool is ever made)."""
  import numpy as np
  sizes = np.asarray(femnist_sizes(num_clients, seed), dtype=np.int64)
  rng = np.random.default_rng([int(seed), 0xFE3])
  t = rng.random((FEMNIST_CLASSES, 28, 28), dtype=np.float32)
  for ax in (1, 2):  # 3-wide box blur, then the top 30 % of each template as the blob
    t = (np.roll(t, -1, ax) + t + np.roll(t, 1, ax)) / 3
  tmpl = np.where(t > np.quantile(t, 0.7, axis=(1, 2), keepdims=True), 190, 0).astype(
      np.uint8)
  offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
  x = np.empty((int(offsets[-1]), 1, 28, 28), np.uint8)
  y = rng.integers(0, FEMNIST_CLASSES, int(offsets[-1]))  # int64
  for i in range(len(sizes)):
    lo, hi = int(offsets[i]), int(offsets[i + 1])
    dy, dx = (int(v) for v in rng.integers(-2, 3, 2))
    xi = x[lo:hi, 0]
    xi[...] = np.roll(tmpl[y[lo:hi]], (dy, dx), axis=(1, 2))
    xi += rng.integers(0, 64, xi.shape, dtype=np.uint8)  # <= 190 + 63: no overflow
  return x, y, offsets


def femnist_body():
  """Reddi et al.'s EMNIST CNN (``fedjax_inv.models.federated.femnist_cnn``, 62 classes)
  on uint8 NCHW input: float32 / 255 first, then the layers; 1,206,590 parameters."""
  import torch
  from torch import nn

  class ToUnitFloat(nn.Module):

    def forward(self, x):
      return x.to(torch.float32) / 255.0  # uint8 pool -> float32 per batch only

  layers = [ToUnitFloat(), nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3),
            nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
            nn.Linear(12 * 12 * 64, 128), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(128, FEMNIST_CLASSES)]
  for m in layers:  # Keras' defaults, as femnist_cnn: Glorot-uniform kernels, zero biases
    if isinstance(m, (nn.Conv2d, nn.Linear)):
      nn.init.xavier_uniform_(m.weight)
      nn.init.zeros_(m.bias)
  return nn.Sequential(*layers)


def cifar10_body():
  """pfl-research's ``simple_cnn((32, 32, 3), 10)`` (``benchmarks/model/pytorch/cnn.py``)
  without its ``loss`` / ``metrics`` methods (``bench_pfl.py`` wraps every body in the same
  classifier): 1,626,442 parameters."""
  import torch
  from torch import nn

  class Transpose2D(nn.Module):  # pfl-research benchmarks/model/pytorch/layer.py

    def forward(self, inputs):
      return inputs.permute((0, 3, 1, 2))

  h, _, c = CIFAR10_SHAPE
  flatten = ((h - 4) // 2) ** 2 * 64
  model = nn.Sequential(Transpose2D(), nn.Conv2d(c, 32, kernel_size=(3, 3)), nn.ReLU(),
                        nn.Conv2d(32, 64, kernel_size=(3, 3)), nn.ReLU(),
                        nn.MaxPool2d((2, 2)), nn.Dropout(0.25), nn.Flatten(),
                        nn.Linear(flatten, 128), nn.ReLU(), nn.Dropout(0.5),
                        nn.Linear(128, NUM_CLASSES))
  for m in model.modules():  # "Apply Glorot (Xavier) uniform initialization" (as pfl)
    if isinstance(m, (nn.Conv2d, nn.Linear)):
      torch.nn.init.xavier_uniform_(m.weight)
  return model


def torch_body(model: str):
  """The ``torch.nn`` module of ``model`` ('mlp', 'cnn', 'femnist' or 'cifar10';
  ValueError otherwise)."""
  from torch import nn

  if model == "femnist":
    return femnist_body()
  if model == "cifar10":
    return cifar10_body()
  if model == "mlp":
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES))
  if model != "cnn":
    raise ValueError(f"model={model!r}; expected 'mlp', 'cnn', 'femnist' or 'cifar10'.")

  class GlobalMax(nn.Module):

    def forward(self, h):
      return h.amax(dim=(2, 3))

  convs = [nn.Conv2d(1, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1),
           nn.Conv2d(64, 64, 3, padding=1)]
  for c in convs:  # fedjax_inv's CNN: He-normal (fan_in, gain 2) kernels, zero bias
    nn.init.kaiming_normal_(c.weight, nonlinearity="relu")
    nn.init.zeros_(c.bias)
  return nn.Sequential(convs[0], nn.ReLU(), nn.MaxPool2d(2),
                       convs[1], nn.ReLU(), nn.MaxPool2d(2),
                       convs[2], nn.ReLU(), GlobalMax(), nn.Linear(64, NUM_CLASSES))


def param_count(module) -> int:
  return sum(p.numel() for p in module.parameters())
