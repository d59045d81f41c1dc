"""Flax NNX models with an explicit featurizer / classifier split, and their pure form.

Fishr, FedSR and FedIIR act on the split between the featurizer Φ (input →
representation ``z``) and the final linear classifier ``w`` (``z`` → logits), so every model
here exposes ``.featurizer`` and ``.classifier`` submodules, and ``FunctionalModel`` turns
them into pure functions of a parameter pytree (a nested dict with top-level keys
``'featurizer'`` and ``'classifier'``) that the engine can ``vmap`` over a client axis.
``FunctionalModel`` also takes any other NNX module with a ``__call__``: the algorithms
that only need the full forward pass (FedAvg, FedProx, SCAFFOLD, DP-FedAvg, ...) train
it; those that need the split refuse it before compiling (``Algorithm.model_for``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from fedjax_inv.models.conv import conv_general_dilated
from fedjax_inv.models.pool import max_pool

Params = Any


class MLP(nnx.Module):
  """Multi-layer perceptron: flatten → [Linear → ReLU] × len(hidden) → Linear.

  Featurizer: all hidden layers (``z`` = last hidden activation, ``[B, hidden[-1]]``).
  Classifier: one ``nnx.Linear(hidden[-1], num_outputs)``.

  Paper settings: FedILC §5.1.1 Color-MNIST uses hidden=(390, 390), num_outputs=1 on
  2×14×14 inputs; Invariant FedAvg §4.1 Task 1 uses hidden=(40,), Task 2 hidden=(10,),
  Task 3 hidden=(30,). The IRM reference code (Arjovsky et al. 2019) uses (390, 390) too.
  """

  def __init__(self, in_features: int, hidden: tuple[int, ...], num_outputs: int, *,
               rngs: nnx.Rngs):
    if in_features <= 0 or num_outputs <= 0 or any(h <= 0 for h in hidden) or not hidden:
      raise ValueError(f"MLP needs positive sizes and >=1 hidden layer, got in_features="
                       f"{in_features}, hidden={hidden}, num_outputs={num_outputs}.")
    layers = []
    d = in_features
    for h in hidden:
      layers += [nnx.Linear(d, h, rngs=rngs), nnx.relu]
      d = h
    self.featurizer = nnx.Sequential(lambda x: x.reshape(x.shape[0], -1), *layers)
    self.classifier = nnx.Linear(d, num_outputs, rngs=rngs)
    self.feature_dim = d

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


# He (Kaiming) normal init for convolutions followed by ReLU (He et al. 2015): keeps the
# activation variance across layers; flax's default (LeCun normal) halves it per ReLU layer.
_he_normal = nnx.initializers.variance_scaling(2.0, "fan_in", "normal")
CNN_POOLS = ("max", "mean")


class CNN(nnx.Module):
  """Small ConvNet: [Conv3×3 → ReLU → (MaxPool 2×2)] blocks → global pool → Linear.

  Input ``[B, H, W, C]`` channels-last in [0, 1]. Featurizer output ``[B, channels[-1]]``.
  A light stand-in for the DomainBed MNIST ConvNet (FedIIR App. F.2) in CPU tests.

  ``pool='max'`` (default) takes the global max over positions; ``'mean'`` the global
  mean. Measured (2-core CPU, bundled 5k MNIST, RotatedMNIST 0° held out, 300 central
  steps of batch 64, SGD-momentum 0.9 lr 0.01, seed 0): the mean-pooled net with flax's
  default LeCun init reached 22% test / 35% train accuracy (the "13% after 300 steps"
  report), He init + mean pool 28% / 56%, He init + max pool 68% / 93%: averaging a thin
  stroke's activations over the whole 7×7 grid dilutes the signal, a max keeps it.
  Convolutions use He-normal init (ReLU follows each).
  """

  def __init__(self, in_channels: int, channels: tuple[int, ...], num_outputs: int, *,
               pool: str = "max", rngs: nnx.Rngs):
    if pool not in CNN_POOLS:
      raise ValueError(f"pool={pool!r}; choose one of {CNN_POOLS}.")
    if in_channels <= 0 or num_outputs <= 0 or not channels or any(c <= 0 for c in channels):
      raise ValueError(f"CNN needs positive sizes and >= 1 conv layer, got in_channels="
                       f"{in_channels}, channels={channels}, num_outputs={num_outputs}.")
    convs = []
    c = in_channels
    for i, ch in enumerate(channels):
      convs.append(nnx.Conv(c, ch, kernel_size=(3, 3), kernel_init=_he_normal, rngs=rngs,
                            conv_general_dilated=conv_general_dilated))
      convs.append(nnx.relu)
      if i < len(channels) - 1:
        convs.append(lambda x: max_pool(x, (2, 2), strides=(2, 2)))
      c = ch
    reduce = jnp.max if pool == "max" else jnp.mean
    self.featurizer = nnx.Sequential(*convs, lambda x: reduce(x, axis=(1, 2)))
    self.classifier = nnx.Linear(c, num_outputs, rngs=rngs)
    self.feature_dim = c

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


class ConvNetFeaturizer(nnx.Module):
  """FedSR's RotatedMNIST representation network g_θ: two 3×3 convolutions and a fully
  connected layer (FedSR §4.2).

  ``x [B, H, W, C]`` in [0, 1] → Conv3×3(C→c1, VALID) → ReLU → MaxPool 2×2 →
  Conv3×3(c1→c2, VALID) → ReLU → MaxPool 2×2 → flatten → ``projection``
  (``nnx.Linear(c2·h·w → z_dim)``, no non-linearity after it) → ``z [B, z_dim]``.
  For 28×28 inputs ``h = w = 5`` (28→26→13→11→5).

  ``projection`` is the representation layer: FedSR's probabilistic head replaces it by a
  ``Linear(c2·h·w → 2·z_dim)`` producing ``(μ, pre-σ)`` (``fedjax_inv.algorithms.fedsr``).
  """

  def __init__(self, in_channels: int, image_size: tuple[int, int], channels, z_dim: int,
               *, rngs: nnx.Rngs):
    c1, c2 = channels
    self.conv1 = nnx.Conv(in_channels, c1, (3, 3), padding="VALID", kernel_init=_he_normal,
                          rngs=rngs, conv_general_dilated=conv_general_dilated)
    self.conv2 = nnx.Conv(c1, c2, (3, 3), padding="VALID", kernel_init=_he_normal,
                          rngs=rngs, conv_general_dilated=conv_general_dilated)
    h, w = ((s - 2) // 2 for s in image_size)
    h, w = (h - 2) // 2, (w - 2) // 2
    self.trunk_dim = c2 * h * w
    self.projection = nnx.Linear(self.trunk_dim, z_dim, rngs=rngs)

  def trunk(self, x):
    """``[B, H, W, C] -> [B, trunk_dim]`` (everything before the projection)."""
    x = max_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))
    x = max_pool(nnx.relu(self.conv2(x)), (2, 2), strides=(2, 2))
    return x.reshape(x.shape[0], -1)

  def __call__(self, x):
    return self.projection(self.trunk(x))


class ConvNet(nnx.Module):
  """FedSR's RotatedMNIST network (FedSR §4.2): :class:`ConvNetFeaturizer` (z ∈ R^z_dim,
  64 in the paper) + a single linear classifier ``Linear(z_dim → num_outputs)``."""

  def __init__(self, in_channels: int, image_size: tuple[int, int], channels,
               z_dim: int, num_outputs: int, *, rngs: nnx.Rngs):
    if (in_channels < 1 or num_outputs < 1 or z_dim < 1 or len(tuple(channels)) != 2
        or any(int(c) < 1 for c in channels)):
      raise ValueError(f"ConvNet needs in_channels, z_dim, num_outputs >= 1 and two "
                       f"positive conv widths, got in_channels={in_channels}, "
                       f"channels={channels}, z_dim={z_dim}, num_outputs={num_outputs}.")
    if min(image_size) < 10:
      raise ValueError(f"image_size={image_size}; two VALID 3×3 convs and 2×2 pools need "
                       "at least 10×10 pixels.")
    self.featurizer = ConvNetFeaturizer(in_channels, tuple(image_size), tuple(channels),
                                        z_dim, rngs=rngs)
    self.classifier = nnx.Linear(z_dim, num_outputs, rngs=rngs)
    self.feature_dim = z_dim

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


# The submodules of the featurizer / classifier split.
SPLIT = ("featurizer", "classifier")


def _has_split(module) -> bool:
  return all(hasattr(module, p) for p in SPLIT)


@dataclasses.dataclass(frozen=True)
class FunctionalModel:
  """Pure-function view of an NNX model: one with ``featurizer`` / ``classifier``
  submodules (:attr:`has_split`), or any other module with a ``__call__``.

  Attributes:
    factory: ``rngs -> nnx.Module``; called once per ``init``.
    graphdef, template: from ``nnx.split(module, nnx.Param)`` of one instance.
    dense_chain: for models that are a chain of dense layers (``mlp``), a
      :class:`DenseChain` exposing each layer's input and pre-activation, which lets
      per-example statistics of the gradients be computed in closed form (FedILC
      Intra-Geo); None otherwise.
  Shapes: ``features(params, x[B, ...]) -> z[B, d]``; ``classify(params, z) -> logits[B, K]``;
  ``apply(params, x) -> logits[B, K]``. A model without the split is its own featurizer:
  ``features`` is its whole forward pass (``z`` = the logits, ``d = K``), ``classify``
  the identity and ``apply`` its ``__call__``, so the algorithms that read only the
  forward pass train it; those that need the split (a component with ``needs_split``:
  Fishr, FedSR, FedIIR) refuse it in ``Algorithm.model_for``, before compiling.
  """
  factory: Callable[[nnx.Rngs], nnx.Module]
  graphdef: Any
  template: Any
  feature_dim: int
  dense_chain: Any = None

  @classmethod
  def from_factory(cls, factory: Callable[[nnx.Rngs], nnx.Module],
                   dense_chain: "DenseChain | None" = None) -> "FunctionalModel":
    """``FunctionalModel`` of the module ``factory(rngs)`` builds.

    Args:
      factory: ``rngs -> nnx.Module``: a module with ``.featurizer`` (``[B, ...] ->
        [B, d]``) and ``.classifier`` (``[B, d] -> [B, K]``), or any module whose
        ``__call__`` maps ``[B, ...] -> [B, K]``.
      dense_chain: optional :class:`DenseChain` of the module (``mlp``).

    Raises:
      TypeError: the module has neither the featurizer / classifier split nor a
        ``__call__``.
    """
    module = factory(nnx.Rngs(0))
    if not (_has_split(module) or callable(module)):
      raise TypeError(f"{type(module).__name__} has no __call__ and no .featurizer / "
                      ".classifier submodules; give it a __call__ ([B, ...] -> [B, K]).")
    graphdef, template = nnx.split(module, nnx.Param)
    return cls(factory, graphdef, template, int(getattr(module, "feature_dim", -1)),
               dense_chain)

  def init(self, seed: int | jax.Array) -> Params:
    """Fresh parameters as a nested dict of float32 arrays."""
    key = seed if isinstance(seed, jax.Array) else jax.random.key(int(seed))
    _, state = nnx.split(self.factory(nnx.Rngs(params=key)), nnx.Param)
    return nnx.to_pure_dict(state)

  def _merge(self, params: Params) -> nnx.Module:
    state = jax.tree.map(lambda v: v, self.template)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(self.graphdef, state)

  @functools.cached_property
  def _parts(self) -> tuple:
    """``(class name, which of 'featurizer' / 'classifier' the module has)``."""
    m = self._merge(nnx.to_pure_dict(self.template))
    return type(m).__name__, tuple(p for p in SPLIT if hasattr(m, p))

  @property
  def module_name(self) -> str:
    """The module's class name (for messages)."""
    return self._parts[0]

  @property
  def split_parts(self) -> tuple:
    """Which of ``'featurizer'`` and ``'classifier'`` the module has."""
    return self._parts[1]

  @property
  def has_split(self) -> bool:
    """True when the module has both ``.featurizer`` and ``.classifier`` (what Fishr,
    FedSR and FedIIR need); False for any other module (its ``__call__`` is the model)."""
    return len(self.split_parts) == len(SPLIT)

  def features(self, params: Params, x: jax.Array) -> jax.Array:
    m = self._merge(params)
    return m.featurizer(x) if self.has_split else m(x)

  def classify(self, params: Params, z: jax.Array) -> jax.Array:
    return self._merge(params).classifier(z) if self.has_split else z

  def apply(self, params: Params, x: jax.Array) -> jax.Array:
    m = self._merge(params)
    return m.classifier(m.featurizer(x)) if self.has_split else m(x)

  def num_params(self) -> int:
    return int(sum(math.prod(l.shape) for l in jax.tree.leaves(nnx.to_pure_dict(self.template))))


@dataclasses.dataclass(frozen=True)
class DenseChain:
  """An MLP's parameters as a chain of dense layers ``h_l = a_{l-1} W_l + b_l``,
  ``a_l = relu(h_l)`` (no activation after the last layer, the classifier).

  Attributes:
    layers: ``params -> [{'kernel': [d_in, d_out], 'bias': [d_out]}, ...]`` in forward
      order (featurizer layers, then the classifier).
    rebuild: ``(params, [pytree per layer]) -> pytree shaped like params`` (the inverse
      of ``layers``: puts per-layer values back at the layers' places).

  ``forward(params, x, taps)`` runs the chain with ``taps[l]`` (``[B, d_out_l]``) added to
  each pre-activation and returns ``(logits [B, K], inputs)``, ``inputs[l] = a_{l-1}``
  (``[B, d_in_l]``). The gradient of a loss summed over examples w.r.t. ``taps[l]`` is,
  row by row, each example's gradient w.r.t. ``h_l``; a layer's per-example kernel
  gradient is the outer product ``a_{l-1,i} ⊗ δ_{l,i}``.
  """
  layers: Callable
  rebuild: Callable

  def forward(self, params, x, taps):
    a = x.reshape(x.shape[0], -1)
    inputs = []
    chain = self.layers(params)
    for i, (layer, tap) in enumerate(zip(chain, taps)):
      inputs.append(a)
      h = a @ layer["kernel"] + layer["bias"] + tap
      a = jax.nn.relu(h) if i < len(chain) - 1 else h
    return a, inputs


def _mlp_layers(params):
  feat = params["featurizer"]["layers"]
  return [feat[k] for k in sorted(feat)] + [params["classifier"]]


def _mlp_rebuild(params, per_layer):
  keys = sorted(params["featurizer"]["layers"])
  return {"featurizer": {"layers": dict(zip(keys, per_layer[:-1]))},
          "classifier": per_layer[-1]}


def mlp(in_features: int, hidden=(390, 390), num_outputs: int = 1) -> FunctionalModel:
  """``FunctionalModel`` of :class:`MLP` (see there for the papers' sizes), with its
  :class:`DenseChain`."""
  return FunctionalModel.from_factory(
      lambda rngs: MLP(in_features, tuple(hidden), num_outputs, rngs=rngs),
      DenseChain(_mlp_layers, _mlp_rebuild))


def cnn(in_channels: int, channels=(32, 64, 64), num_outputs: int = 10,
        pool: str = "max") -> FunctionalModel:
  """``FunctionalModel`` of :class:`CNN` (``pool``: 'max' or 'mean' global pooling).

  Raises:
    ValueError: non-positive sizes or an unknown ``pool``.
  """
  return FunctionalModel.from_factory(
      lambda rngs: CNN(in_channels, tuple(channels), num_outputs, pool=pool, rngs=rngs))


def convnet(in_channels: int = 1, image_size=(28, 28), channels=(32, 64), z_dim: int = 64,
            num_outputs: int = 10) -> FunctionalModel:
  """``FunctionalModel`` of :class:`ConvNet`, FedSR's RotatedMNIST network (FedSR §4.2:
  "two 3x3 convolutional layers and a fully connected layer ... a representation z of 64
  dimensions. A single linear layer is then used to map the representation z to the ten
  output classes"). Channel widths 32, 64 and the 2×2 max-pools follow DIVA's encoder
  (Ilse et al. 2020, FedSR's ref. [15]); the paper does not state them.

  Shapes: ``x [B, 28, 28, 1]`` → ``z [B, z_dim]`` → logits ``[B, num_outputs]``; params
  ``featurizer/{conv1, conv2, projection}``, ``classifier``.

  Raises:
    ValueError: non-positive sizes, not two channel widths, images under 10×10.
  """
  return FunctionalModel.from_factory(
      lambda rngs: ConvNet(int(in_channels), tuple(int(s) for s in image_size),
                           tuple(channels), int(z_dim), int(num_outputs), rngs=rngs))
