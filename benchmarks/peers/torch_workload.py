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
"""
from __future__ import annotations

N_PER_CLIENT = 64
BATCH = 32
STEPS = 5
LR = 0.1
NUM_CLASSES = 10
WORKLOADS = {"mlp": "mlp_fedavg", "cnn": "cnn_fedavg"}
EXPECTED_PARAMS = {"mlp": 784 * 128 + 128 + 128 * 10 + 10, "cnn": 56_394}


def make_data(C: int, seed: int = 0):
  """The synthetic pool of ``bench_peers.make_data``: x [C, 64, 28, 28, 1] uniform [0, 1),
  y [C, 64] uniform labels (int32)."""
  import numpy as np
  rng = np.random.default_rng(seed)
  x = rng.random((C, N_PER_CLIENT, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, NUM_CLASSES, (C, N_PER_CLIENT)).astype(np.int32)
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


def torch_body(model: str):
  """The ``torch.nn`` module of ``model`` ('mlp' or 'cnn'; ValueError otherwise)."""
  from torch import nn

  if model == "mlp":
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, NUM_CLASSES))
  if model != "cnn":
    raise ValueError(f"model={model!r}; expected 'mlp' or 'cnn'.")

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
