"""The standard cross-device benchmark models of Reddi et al. 2021, "Adaptive Federated
Optimization" (ICLR 2021, App. B), as :class:`~fedjax_inv.models.FunctionalModel` s.

Sources read for this port (the Keras models of the TFF baselines):

* EMNIST-62 character recognition — ``create_conv_dropout_model`` in
  google-research/federated ``utils/models/emnist_models.py`` and tensorflow/federated
  ``python/simulation/baselines/emnist/emnist_models.py``: :func:`femnist_cnn`.
* Shakespeare next-character prediction — ``create_recurrent_model`` in
  ``utils/models/shakespeare_models.py`` / ``baselines/shakespeare/
  char_prediction_models.py`` (Embedding 8 → LSTM 256 → LSTM 256 → Dense), here in the
  LEAF formulation (TalwalkarLab/leaf ``models/shakespeare/stacked_lstm.py``: one
  prediction per 80-character window, from the last time step): :func:`char_lstm`.
* CIFAR-100 — ``create_resnet18`` in ``utils/models/resnet_models.py`` /
  ``python/simulation/models/resnet_models.py``, called by the CIFAR-100 baseline with
  ``input_shape=(24, 24, 3)`` crops: :func:`cifar100_resnet18` (reuses
  :mod:`fedjax_inv.models.resnet`; the differences are listed there).

Dropout. :func:`femnist_cnn` has dropout layers; the package's ``features(params, x)``
has no random key, so dropout here is a pure function of an explicit key:
``featurizer(x, key=None)`` applies no dropout when ``key is None`` (evaluation, and every
caller that does not know about keys) and inverted dropout with masks drawn from ``key``
otherwise. :class:`StochasticModel` (``stochastic = True``) forwards that key:
``features(params, x, key=None)``, ``apply(params, x, key=None)``. A training loop turns
dropout on by passing the local step's key when ``getattr(model, 'stochastic', False)``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from fedjax_inv.models import FunctionalModel
from fedjax_inv.models.conv import conv_general_dilated
from fedjax_inv.models.pool import max_pool
from fedjax_inv.models.resnet import resnet

__all__ = [
    "CharLSTM",
    "CharLSTMFeaturizer",
    "FemnistCNN",
    "FemnistCNNFeaturizer",
    "StochasticModel",
    "char_lstm",
    "cifar100_resnet18",
    "dropout",
    "femnist_cnn",
]

# Keras' defaults, which the TFF baselines use: Glorot-uniform kernels and zero biases for
# Conv2D / Dense (baselines/emnist/emnist_models.py), He-normal input kernels, orthogonal
# recurrent kernels and unit forget-gate bias for the LSTM (char_prediction_models.py,
# Keras LSTM(unit_forget_bias=True)), RandomUniform(-0.05, 0.05) embeddings.
_glorot_uniform = nnx.initializers.glorot_uniform()
_he_normal = nnx.initializers.he_normal()
_embed_init = nnx.initializers.uniform(0.1)  # U[0, 0.1), shifted to U[-0.05, 0.05) below


def _keras_embed_init(key, shape, dtype=jnp.float32):
  return _embed_init(key, shape, dtype) - jnp.asarray(0.05, dtype)


def _forget_bias_one(hidden: int):
  """Bias init of a fused ``[i, f, g, o]`` LSTM gate vector ``[4·hidden]``: 1 on the
  forget gate, 0 elsewhere (Keras ``unit_forget_bias=True``)."""
  def init(key, shape, dtype=jnp.float32):
    del key
    return jnp.zeros(shape, dtype).at[hidden:2 * hidden].set(1)
  return init


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  """Inverted dropout as a pure function of ``key``.

  ``key is None`` (or ``rate == 0``) returns ``x`` unchanged. Otherwise each entry is kept
  with probability ``1 - rate`` (a ``jax.random.bernoulli`` mask of ``x.shape`` drawn from
  ``key``) and scaled by ``1 / (1 - rate)``, so ``E[dropout(x)] = x``.

  Raises:
    ValueError: ``rate`` outside ``[0, 1)``.
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout rate={rate}; it must be in [0, 1).")
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class StochasticModel(FunctionalModel):
  """A :class:`FunctionalModel` whose featurizer takes an optional random key
  (``featurizer(x, key=None)``), for dropout.

  ``features(params, x)`` / ``apply(params, x)`` (no key) are deterministic, as for every
  other model (evaluation); with ``key`` the featurizer draws its dropout masks from it.
  ``stochastic = True`` tells a training loop to pass the local step's key.
  """
  stochastic = True

  def features(self, params, x, key=None):  # pylint: disable=arguments-differ
    return self._merge(params).featurizer(x, key)

  def apply(self, params, x, key=None):  # pylint: disable=arguments-differ
    m = self._merge(params)
    return m.classifier(m.featurizer(x, key))


# ---------------------------------------------------------------------------------------
# EMNIST-62: CNN with dropout.
# ---------------------------------------------------------------------------------------


class FemnistCNNFeaturizer(nnx.Module):
  """``x [B, 28, 28]`` or ``[B, 28, 28, 1]`` → Conv3×3(1→32, VALID) → ReLU →
  Conv3×3(32→64, VALID) → ReLU → MaxPool 2×2 → Dropout(rate1) → flatten (9216) →
  Dense(9216→128) → ReLU → Dropout(rate2) → ``z [B, 128]``."""

  def __init__(self, rate1: float, rate2: float, *, rngs: nnx.Rngs):
    conv = dict(kernel_size=(3, 3), padding="VALID", kernel_init=_glorot_uniform,
                conv_general_dilated=conv_general_dilated, rngs=rngs)
    self.conv1 = nnx.Conv(1, 32, **conv)
    self.conv2 = nnx.Conv(32, 64, **conv)
    self.dense = nnx.Linear(12 * 12 * 64, 128, kernel_init=_glorot_uniform, rngs=rngs)
    self.rate1, self.rate2 = rate1, rate2

  def __call__(self, x, key=None):
    if x.ndim == 3:
      x = x[..., None]
    if x.ndim != 4 or tuple(x.shape[1:]) != (28, 28, 1):
      raise ValueError(f"femnist_cnn expects images [B, 28, 28] or [B, 28, 28, 1], got "
                       f"shape {tuple(x.shape)}.")
    k1, k2 = (None, None) if key is None else tuple(jax.random.split(key))
    x = nnx.relu(self.conv2(nnx.relu(self.conv1(x))))
    x = dropout(max_pool(x, (2, 2), strides=(2, 2)), self.rate1, k1)
    x = nnx.relu(self.dense(x.reshape(x.shape[0], -1)))
    return dropout(x, self.rate2, k2)


class FemnistCNN(nnx.Module):
  """:class:`FemnistCNNFeaturizer` + ``classifier`` Dense(128 → num_classes) (logits; the
  Keras model's softmax belongs to the loss here)."""

  def __init__(self, num_classes: int, rate1: float, rate2: float, *, rngs: nnx.Rngs):
    self.featurizer = FemnistCNNFeaturizer(rate1, rate2, rngs=rngs)
    self.classifier = nnx.Linear(128, num_classes, kernel_init=_glorot_uniform, rngs=rngs)
    self.feature_dim = 128

  def __call__(self, x, key=None):
    return self.classifier(self.featurizer(x, key))


def femnist_cnn(num_classes: int = 62, dropout: bool = True) -> FunctionalModel:
  """EMNIST character-recognition CNN of Reddi et al. 2021 (App. B, "EMNIST CR").

  Source: ``create_conv_dropout_model`` (google-research/federated
  ``utils/models/emnist_models.py``; tensorflow/federated
  ``simulation/baselines/emnist/emnist_models.py``): Conv 3×3 32 (valid) ReLU → Conv 3×3
  64 ReLU → MaxPool 2×2 → Dropout 0.25 → Flatten → Dense 128 ReLU → Dropout 0.5 → Dense
  ``num_classes`` (62 for EMNIST-62, 10 for digits). Glorot-uniform kernels, zero biases.

  Shapes: ``x [B, 28, 28]`` or ``[B, 28, 28, 1]`` float32 → ``z [B, 128]`` (after the
  second dropout) → logits ``[B, num_classes]``. Params ``featurizer/{conv1, conv2,
  dense}``, ``classifier``; count ``320 + 18,496 + 1,179,776 + 129·num_classes``:
  1,206,590 for 62 classes, 1,199,882 for 10 (TFF's docstring gives 1,199,882).

  Args:
    num_classes: outputs ``K``.
    dropout: True → a :class:`StochasticModel`: dropout is applied only when a key is
      passed (``features(params, x, key)``); False → a plain ``FunctionalModel`` without
      dropout (the featurizer ignores a key).

  Raises:
    ValueError: ``num_classes < 1`` (here); an input not of shape ``[B, 28, 28(, 1)]``
      (when called).
  """
  if int(num_classes) < 1:
    raise ValueError(f"num_classes={num_classes}; it must be >= 1.")
  k = int(num_classes)
  if dropout:
    return StochasticModel.from_factory(lambda rngs: FemnistCNN(k, 0.25, 0.5, rngs=rngs))
  return FunctionalModel.from_factory(lambda rngs: FemnistCNN(k, 0.0, 0.0, rngs=rngs))


# ---------------------------------------------------------------------------------------
# Shakespeare: stacked character LSTM.
# ---------------------------------------------------------------------------------------


class CharLSTMFeaturizer(nnx.Module):
  """``x [B, seq_len]`` (character ids stored as float32) → int32 → Embed(vocab → embed)
  → ``num_layers`` stacked LSTMs of width ``hidden`` (a ``jax.lax.scan`` over time, zero
  initial state) → ``z [B, hidden]``, the top layer's hidden state at the last step."""

  def __init__(self, vocab_size: int, embed_dim: int, hidden: int, num_layers: int,
               seq_len: int, *, rngs: nnx.Rngs):
    self.embed = nnx.Embed(vocab_size, embed_dim, embedding_init=_keras_embed_init,
                           rngs=rngs)
    cells = []
    d = embed_dim
    for _ in range(num_layers):
      cells.append(nnx.OptimizedLSTMCell(d, hidden, kernel_init=_he_normal,
                                         bias_init=_forget_bias_one(hidden), rngs=rngs))
      d = hidden
    self.cells = nnx.List(cells)
    self.hidden = hidden
    self.seq_len = seq_len

  def __call__(self, x, key=None):
    del key  # no dropout in this model
    if x.ndim != 2 or x.shape[1] != self.seq_len:
      raise ValueError(f"char_lstm expects character ids [B, {self.seq_len}], got shape "
                       f"{tuple(x.shape)}.")
    h = self.embed(x.astype(jnp.int32))                 # [B, T, E]
    h = jnp.swapaxes(h, 0, 1)                            # [T, B, E]
    zeros = jnp.zeros((x.shape[0], self.hidden), h.dtype)
    for cell in self.cells:
      def step(carry, x_t, cell=cell):
        return cell(carry, x_t)
      _, h = jax.lax.scan(step, (zeros, zeros), h)      # carry (c, h); outputs [T, B, H]
    return h[-1]


class CharLSTM(nnx.Module):
  """:class:`CharLSTMFeaturizer` + ``classifier`` Dense(hidden → vocab_size) (logits)."""

  def __init__(self, vocab_size: int, embed_dim: int, hidden: int, num_layers: int,
               seq_len: int, *, rngs: nnx.Rngs):
    self.featurizer = CharLSTMFeaturizer(vocab_size, embed_dim, hidden, num_layers,
                                         seq_len, rngs=rngs)
    self.classifier = nnx.Linear(hidden, vocab_size, kernel_init=_glorot_uniform,
                                 rngs=rngs)
    self.feature_dim = hidden

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


def char_lstm(vocab_size: int, embed_dim: int = 8, hidden: int = 256, num_layers: int = 2,
              seq_len: int = 80) -> FunctionalModel:
  """Shakespeare next-character LSTM (Reddi et al. 2021 App. B; McMahan et al. 2017).

  Sources: TFF ``create_recurrent_model`` (google-research/federated
  ``utils/models/shakespeare_models.py``; tensorflow/federated
  ``simulation/baselines/shakespeare/char_prediction_models.py``): Embedding 8 → LSTM 256
  → LSTM 256 → Dense ``vocab_size`` logits; LEAF ``models/shakespeare/stacked_lstm.py``
  (seq_len 80, 80 classes, 256 hidden): the same stack, predicting ONE next character from
  the last time step — the formulation used here. TFF predicts a character at every step
  instead (``return_sequences=True``); that is not what this model computes.

  Cells are flax's ``nnx.OptimizedLSTMCell`` (gates ``i, f, g, o`` from one fused
  ``[in, 4H]`` input kernel without bias and one ``[H, 4H]`` recurrent kernel with bias;
  ``c' = σ(f)·c + σ(i)·tanh(g)``, ``h' = σ(o)·tanh(c')``), the same gate layout and
  parameter count as Keras' LSTM; He-normal input kernels, orthogonal recurrent kernels,
  forget-gate bias 1, U(-0.05, 0.05) embeddings (the Keras initializers TFF uses).

  Shapes: ``x [B, seq_len]`` float32 holding integer ids in ``[0, vocab_size)`` (an id
  outside gives NaN embeddings) → ``z [B, hidden]`` → logits ``[B, vocab_size]``. Params
  ``featurizer/{embed, cells/<l>/{dense_i, dense_h}}``, ``classifier``; count
  ``vocab·embed + Σ_l 4H(d_l + H + 1) + (H + 1)·vocab`` with ``d_0 = embed``,
  ``d_l = H``: 817,872 for ``vocab_size=80`` (LEAF) and the defaults.

  Raises:
    ValueError: a size < 1 (here); an input not of shape ``[B, seq_len]`` (when called).
  """
  sizes = dict(vocab_size=vocab_size, embed_dim=embed_dim, hidden=hidden,
               num_layers=num_layers, seq_len=seq_len)
  if any(int(v) < 1 for v in sizes.values()):
    raise ValueError(f"char_lstm needs positive sizes, got {sizes}.")
  v, e, h, n, t = (int(s) for s in sizes.values())
  return FunctionalModel.from_factory(lambda rngs: CharLSTM(v, e, h, n, t, rngs=rngs))


# ---------------------------------------------------------------------------------------
# CIFAR-100: ResNet-18 with GroupNorm.
# ---------------------------------------------------------------------------------------


def cifar100_resnet18(num_classes: int = 100) -> FunctionalModel:
  """ResNet-18 with GroupNorm for 24×24 CIFAR-100 crops (Reddi et al. 2021 App. B), built
  with :func:`fedjax_inv.models.resnet.resnet`.

  Source: TFF ``resnet_models.create_resnet18(input_shape=(24, 24, 3), num_classes=100)``
  (google-research/federated ``utils/models/resnet_models.py``; tensorflow/federated
  ``simulation/models/resnet_models.py``, called by ``baselines/cifar100/
  image_classification_tasks.py`` with the default 24×24 crop). Settings chosen:

  * ``groups=2``: every BatchNorm replaced by GroupNorm with 2 groups, the default of the
    GroupNorm layer TFF used then (tensorflow_addons ``GroupNormalization(groups=2)``,
    later TFF's own ``simulation/models/group_norm.py``, also ``groups=2``; since January
    2023 TFF uses Keras' ``GroupNormalization``, whose default is 32 groups).
  * ``small_input=False``: ``create_resnet18`` keeps the ImageNet stem (7×7/2 conv, 3×3/2
    max-pool) even for 24×24 crops: 24 → 12 → 6 before the first stage.
  * ``normalize=False``: TFF's model has no input normalization; the CIFAR-100 pipeline
    applies ``tf.image.per_image_standardization`` to the crops, which belongs to the
    data (task) side here.
  * ``base_width=64``, ``feature_dim=512`` (the trunk width, which TFF global-average
    pools into its classifier), ``in_channels=3``.

  Differences from TFF's network that ``resnet()``'s arguments cannot remove: TFF's is a
  pre-activation (v2) ResNet (GN → ReLU → conv, a final GN → ReLU before pooling), and
  its stages do not downsample (``_residual_block`` is called without strides, so every
  stage runs at 6×6); ``resnet()`` is a post-activation (v1) ResNet with stride-2 stages
  (6 → 3 → 2 → 1), GroupNorm ε = 1e-5 (TFF: 1e-3), and a Linear(512 → 512) projection
  before the classifier (262,656 parameters TFF does not have). The convolution and norm
  parameter count of the trunk is the same (11,176,512) in both.

  Shapes: ``x [B, 24, 24, 3]`` float32 (other image sizes run too) → ``z [B, 512]`` → logits
  ``[B, num_classes]``. Parameter count 11,490,468 for 100 classes (TFF's: 11,227,812).

  Raises:
    ValueError: ``num_classes < 1``.
  """
  if int(num_classes) < 1:
    raise ValueError(f"num_classes={num_classes}; it must be >= 1.")
  return resnet(18, int(num_classes), feature_dim=512, in_channels=3, base_width=64,
                groups=2, small_input=False, normalize=False)
