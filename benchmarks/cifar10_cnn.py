"""pfl-research's CIFAR10 "simple CNN" as a fedjax_inv model, for the ``cifar10_fedavg``
workload of ``fedjax-inv bench`` (``benchmarks/workloads.py``) and its pfl twin
(``benchmarks/peers/torch_workload.py::cifar10_body``).

Source: apple/pfl-research ``benchmarks/model/pytorch/cnn.py::simple_cnn(input_shape,
num_outputs)``, which its CIFAR10 benchmark (``benchmarks/image_classification/configs/
baseline.yaml``: ``model_name: simple_cnn``) builds with ``input_shape=(32, 32, 3)``, 10
outputs: Transpose2D (NHWC -> NCHW) -> Conv 3x3 3->32 (valid) -> ReLU -> Conv 3x3 32->64
(valid) -> ReLU -> MaxPool 2x2 -> Dropout 0.25 -> Flatten (14 * 14 * 64 = 12,544) ->
Linear 12,544->128 -> ReLU -> Dropout 0.5 -> Linear 128->10; Glorot-uniform weights.

Here in NHWC (no transpose: JAX's convolutions take NHWC): the same layer shapes, so the
same parameter count, 896 + 18,496 + 1,605,760 + 1,290 = 1,626,442 (``PARAMS``). Biases
start at zero (pfl leaves torch's default uniform bias init; the start values do not
change a round's cost). Dropout is on in local training, as in pfl (its ``loss`` puts the
module in train mode): the model is a ``StochasticModel`` whose featurizer draws its masks
from the local step's key (``fedjax_inv.models.federated``).
"""
from __future__ import annotations

import jax
from flax import nnx

from fedjax_inv.models.conv import conv_general_dilated
from fedjax_inv.models.federated import StochasticModel, dropout
from fedjax_inv.models.pool import max_pool

INPUT_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
# conv1 3*3*3*32 + 32, conv2 3*3*32*64 + 64, dense 12544*128 + 128, classifier 128*10 + 10
PARAMS = (3 * 3 * 3 * 32 + 32) + (3 * 3 * 32 * 64 + 64) + (14 * 14 * 64 * 128 + 128) + (
    128 * NUM_CLASSES + NUM_CLASSES)

_glorot_uniform = nnx.initializers.glorot_uniform()


class SimpleCNNFeaturizer(nnx.Module):
  """``x [B, 32, 32, 3]`` -> Conv3x3(3->32, VALID) -> ReLU -> Conv3x3(32->64, VALID) ->
  ReLU -> MaxPool 2x2 -> Dropout(0.25) -> flatten (12,544) -> Dense(128) -> ReLU ->
  Dropout(0.5) -> ``z [B, 128]`` (dropout only when a key is passed)."""

  def __init__(self, input_shape=INPUT_SHAPE, rate1: float = 0.25, rate2: float = 0.5, *,
               rngs: nnx.Rngs):
    h, w, c = (int(v) for v in input_shape)
    conv = dict(kernel_size=(3, 3), padding="VALID", kernel_init=_glorot_uniform,
                conv_general_dilated=conv_general_dilated, rngs=rngs)
    self.conv1 = nnx.Conv(c, 32, **conv)
    self.conv2 = nnx.Conv(32, 64, **conv)
    self.dense = nnx.Linear(((h - 4) // 2) * ((w - 4) // 2) * 64, 128,
                            kernel_init=_glorot_uniform, rngs=rngs)
    self.input_shape = (h, w, c)
    self.rate1, self.rate2 = rate1, rate2

  def __call__(self, x, key=None):
    if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape:
      shape = ", ".join(map(str, self.input_shape))
      raise ValueError(f"simple_cnn expects images [B, {shape}], got shape "
                       f"{tuple(x.shape)}.")
    k1, k2 = (None, None) if key is None else tuple(jax.random.split(key))
    x = nnx.relu(self.conv2(nnx.relu(self.conv1(x))))
    x = dropout(max_pool(x, (2, 2), strides=(2, 2)), self.rate1, k1)
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    return dropout(x, self.rate2, k2)


class SimpleCNN(nnx.Module):
  """:class:`SimpleCNNFeaturizer` + ``classifier`` Dense(128 -> num_classes) (logits)."""

  def __init__(self, num_classes: int = NUM_CLASSES, input_shape=INPUT_SHAPE, *,
               rngs: nnx.Rngs):
    self.featurizer = SimpleCNNFeaturizer(input_shape, rngs=rngs)
    self.classifier = nnx.Linear(128, num_classes, kernel_init=_glorot_uniform, rngs=rngs)
    self.feature_dim = 128

  def __call__(self, x, key=None):
    return self.classifier(self.featurizer(x, key))


def simple_cnn(num_classes: int = NUM_CLASSES, input_shape=INPUT_SHAPE) -> StochasticModel:
  """pfl-research's ``simple_cnn(input_shape, num_classes)`` as a ``StochasticModel``
  (dropout in training): 1,626,442 parameters for CIFAR10 (``PARAMS``)."""
  return StochasticModel.from_factory(
      lambda rngs: SimpleCNN(int(num_classes), tuple(input_shape), rngs=rngs))
