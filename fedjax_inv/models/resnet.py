"""ResNet-18 / ResNet-50 featurizers with GroupNorm, for the DomainBed-style tasks.

FedSR §5 (PACS: ResNet-18; OfficeHome, DomainNet: ResNet-50) and FedIIR §5 (VLCS, PACS:
ResNet-18; OfficeHome: ResNet-50) both "replace the last fully connected layer of the
backbone with a linear layer of dimension 512 for ResNet18 and 2048 for ResNet50" to form
the representation network Φ. So here:

  featurizer Φ: [input normalization] → ResNet trunk → global average pool
                → Linear(trunk width → ``feature_dim``)   (z, no non-linearity after it)
  classifier w: Linear(feature_dim → num_classes)                          (FedSR §5)
                or Linear → ReLU → Linear with ``classifier_hidden``      (FedIIR §5:
                "two fully connected layers as the classifier")

Normalization — a deliberate choice: the torchvision ResNets the papers use have
BatchNorm, whose running statistics are not trainable parameters and do not federate
cleanly (they are averaged, or kept local, differently by every port; Hsieh et al. 2020
show BatchNorm failing under non-IID clients). ``FunctionalModel`` keeps only
``nnx.Param`` state, so every normalization layer here is **GroupNorm** (Wu & He 2018;
32 groups), which has only an affine scale/bias and no batch statistics: train, eval,
and every client compute the same function of the same parameters. Consequently,
ImageNet-pretrained *BatchNorm* checkpoints cannot be loaded as they are; use a GroupNorm
checkpoint (e.g. a converted GN ResNet) or train from scratch.

Inputs are channels-last ``[B, H, W, 3]`` float32 in [0, 1] (the task contract). With
``normalize=True`` (default) the featurizer first standardizes with the ImageNet channel
means/stds (FedSR §5's preprocessing), as fixed constants — not parameters.

Pretrained weights are never downloaded: :func:`load_pretrained` reads a user-supplied
``.npz`` whose keys are the parameter-dict paths joined by ``/`` (e.g.
``featurizer/stem_conv/kernel``); :func:`save_params` writes that format, and
:func:`param_paths` lists the expected keys and shapes.
"""
from __future__ import annotations

import os
import pathlib
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from fedjax_inv.models import FunctionalModel
from fedjax_inv.models.conv import conv_general_dilated
from fedjax_inv.models.pool import max_pool

__all__ = [
    "ResNet",
    "load_pretrained",
    "param_paths",
    "resnet",
    "resnet18",
    "resnet50",
    "save_params",
    "with_pretrained",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# depth -> (block type, blocks per stage)
_CONFIGS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
}

_conv_init = nnx.initializers.variance_scaling(2.0, "fan_out", "normal")  # He (torchvision)


def _groups(channels: int, groups: int) -> int:
  g = min(groups, channels)
  while channels % g:
    g -= 1
  return g


def _norm(ch: int, groups: int, rngs: nnx.Rngs) -> nnx.GroupNorm:
  return nnx.GroupNorm(ch, num_groups=_groups(ch, groups), epsilon=1e-5, rngs=rngs)


def _conv(cin: int, cout: int, k: int, stride: int, rngs: nnx.Rngs) -> nnx.Conv:
  return nnx.Conv(cin, cout, kernel_size=(k, k), strides=(stride, stride),
                  padding=[(k // 2, k // 2)] * 2, use_bias=False, kernel_init=_conv_init,
                  conv_general_dilated=conv_general_dilated, rngs=rngs)


class BasicBlock(nnx.Module):
  """ResNet basic block (two 3×3 convs), He et al. 2016 Fig. 2, GroupNorm instead of BN."""
  expansion = 1

  def __init__(self, cin: int, width: int, stride: int, groups: int, *, rngs: nnx.Rngs):
    cout = width * self.expansion
    self.conv1 = _conv(cin, width, 3, stride, rngs)
    self.norm1 = _norm(width, groups, rngs)
    self.conv2 = _conv(width, cout, 3, 1, rngs)
    self.norm2 = _norm(cout, groups, rngs)
    self.has_proj = stride != 1 or cin != cout
    if self.has_proj:
      self.proj_conv = _conv(cin, cout, 1, stride, rngs)
      self.proj_norm = _norm(cout, groups, rngs)

  def __call__(self, x):
    y = nnx.relu(self.norm1(self.conv1(x)))
    y = self.norm2(self.conv2(y))
    sc = self.proj_norm(self.proj_conv(x)) if self.has_proj else x
    return nnx.relu(y + sc)


class Bottleneck(nnx.Module):
  """ResNet bottleneck block (1×1, 3×3 with the stride, 1×1 ×4), torchvision "v1.5"
  layout, GroupNorm instead of BN."""
  expansion = 4

  def __init__(self, cin: int, width: int, stride: int, groups: int, *, rngs: nnx.Rngs):
    cout = width * self.expansion
    self.conv1 = _conv(cin, width, 1, 1, rngs)
    self.norm1 = _norm(width, groups, rngs)
    self.conv2 = _conv(width, width, 3, stride, rngs)
    self.norm2 = _norm(width, groups, rngs)
    self.conv3 = _conv(width, cout, 1, 1, rngs)
    self.norm3 = _norm(cout, groups, rngs)
    self.has_proj = stride != 1 or cin != cout
    if self.has_proj:
      self.proj_conv = _conv(cin, cout, 1, stride, rngs)
      self.proj_norm = _norm(cout, groups, rngs)

  def __call__(self, x):
    y = nnx.relu(self.norm1(self.conv1(x)))
    y = nnx.relu(self.norm2(self.conv2(y)))
    y = self.norm3(self.conv3(y))
    sc = self.proj_norm(self.proj_conv(x)) if self.has_proj else x
    return nnx.relu(y + sc)


class ResNetFeaturizer(nnx.Module):
  """Φ: ``x [B, H, W, in_channels]`` in [0, 1] → ``z [B, feature_dim]``.

  Stem: 7×7/2 conv → GN → ReLU → 3×3/2 max-pool (ImageNet layout), or with
  ``small_input=True`` a 3×3/1 conv and no pooling (CIFAR layout, for 32×32 inputs).
  Then 4 stages of widths ``base_width × (1, 2, 4, 8)`` (strides 1, 2, 2, 2), global
  average pooling, and the linear projection to ``feature_dim`` that FedSR §5 / FedIIR §5
  put in place of the ImageNet classifier.
  """

  def __init__(self, depth: int, feature_dim: int, in_channels: int, base_width: int,
               groups: int, small_input: bool, normalize: bool, *, rngs: nnx.Rngs):
    block_type, counts = _CONFIGS[depth]
    block = BasicBlock if block_type == "basic" else Bottleneck
    self.normalize = normalize
    self.small_input = small_input
    k, s = (3, 1) if small_input else (7, 2)
    self.stem_conv = _conv(in_channels, base_width, k, s, rngs)
    self.stem_norm = _norm(base_width, groups, rngs)
    blocks = []
    cin = base_width
    for stage, n in enumerate(counts):
      width = base_width * 2 ** stage
      for i in range(n):
        stride = 2 if (stage > 0 and i == 0) else 1
        blocks.append(block(cin, width, stride, groups, rngs=rngs))
        cin = width * block.expansion
    self.blocks = nnx.List(blocks)
    self.trunk_dim = cin
    self.projection = nnx.Linear(cin, feature_dim, rngs=rngs)

  def __call__(self, x):
    return self.projection(self.trunk(x))

  def trunk(self, x):
    """``[B, H, W, C] -> [B, trunk_dim]``: everything before ``projection`` (the
    representation layer that FedSR's probabilistic head replaces)."""
    if x.ndim != 4:
      raise ValueError(f"ResNet expects channels-last images [B, H, W, C], got shape "
                       f"{x.shape}.")
    if self.normalize and x.shape[-1] == 3:
      x = (x - jnp.asarray(IMAGENET_MEAN, x.dtype)) / jnp.asarray(IMAGENET_STD, x.dtype)
    x = nnx.relu(self.stem_norm(self.stem_conv(x)))
    if not self.small_input:
      x = max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for b in self.blocks:
      x = b(x)
    return jnp.mean(x, axis=(1, 2))


class ResNet(nnx.Module):
  """ResNet featurizer + linear (or two-layer) classifier.

  Attributes: ``featurizer`` (:class:`ResNetFeaturizer`), ``classifier``, ``feature_dim``.
  """

  def __init__(self, depth: int, num_classes: int, *, feature_dim: int | None = None,
               in_channels: int = 3, base_width: int = 64, groups: int = 32,
               small_input: bool = False, normalize: bool = True,
               classifier_hidden: int | None = None, rngs: nnx.Rngs):
    if depth not in _CONFIGS:
      raise ValueError(f"depth={depth}; choose one of {sorted(_CONFIGS)}.")
    if num_classes < 1 or in_channels < 1 or base_width < 1 or groups < 1:
      raise ValueError(f"ResNet needs positive sizes, got num_classes={num_classes}, "
                       f"in_channels={in_channels}, base_width={base_width}, "
                       f"groups={groups}.")
    if feature_dim is None:
      feature_dim = 512 if _CONFIGS[depth][0] == "basic" else 2048
    if feature_dim < 1:
      raise ValueError(f"feature_dim={feature_dim}; it must be >= 1.")
    self.featurizer = ResNetFeaturizer(depth, feature_dim, in_channels, base_width, groups,
                                       small_input, normalize, rngs=rngs)
    if classifier_hidden is None:
      self.classifier = nnx.Linear(feature_dim, num_classes, rngs=rngs)
    else:
      if classifier_hidden < 1:
        raise ValueError(f"classifier_hidden={classifier_hidden}; use a positive width "
                         "or None for a single linear layer.")
      self.classifier = nnx.Sequential(nnx.Linear(feature_dim, classifier_hidden, rngs=rngs),
                                       nnx.relu,
                                       nnx.Linear(classifier_hidden, num_classes, rngs=rngs))
    self.feature_dim = feature_dim

  def __call__(self, x):
    return self.classifier(self.featurizer(x))


def resnet(depth: int, num_classes: int, *, feature_dim: int | None = None,
           in_channels: int = 3, base_width: int = 64, groups: int = 32,
           small_input: bool = False, normalize: bool = True,
           classifier_hidden: int | None = None) -> FunctionalModel:
  """``FunctionalModel`` of a GroupNorm ResNet (see module docstring).

  Args:
    depth: 18, 34 (basic blocks) or 50 (bottleneck blocks).
    num_classes: logits ``K`` (1 for a binary task).
    feature_dim: size of ``z``; default 512 (ResNet-18/34) or 2048 (ResNet-50), as in
      FedSR §5 and FedIIR §5.
    in_channels: input channels (3 for RGB; 1 for grayscale — then no ImageNet
      normalization is applied).
    base_width: channels of the first stage (64 in the papers; smaller for CPU tests).
    groups: GroupNorm groups (32; reduced to a divisor of the channels when needed).
    small_input: CIFAR-style stem (3×3/1, no max-pool) for ~32×32 inputs.
    normalize: standardize [0, 1] RGB inputs with ImageNet mean/std first (FedSR §5).
    classifier_hidden: None → one linear classifier (FedSR §5); an int → Linear → ReLU →
      Linear with that hidden width (FedIIR §5's two fully connected layers).

  Returns:
    ``FunctionalModel``; params ``{'featurizer': ..., 'classifier': ...}``.

  Raises:
    ValueError: unknown depth or non-positive sizes.
  """
  if depth not in _CONFIGS:
    raise ValueError(f"depth={depth}; choose one of {sorted(_CONFIGS)}.")
  return FunctionalModel.from_factory(
      lambda rngs: ResNet(depth, num_classes, feature_dim=feature_dim,
                          in_channels=in_channels, base_width=base_width, groups=groups,
                          small_input=small_input, normalize=normalize,
                          classifier_hidden=classifier_hidden, rngs=rngs))


def resnet18(num_classes: int, **kw) -> FunctionalModel:
  """ResNet-18 featurizer (z ∈ R^512) + classifier: FedSR §5 (PACS), FedIIR §5 (VLCS,
  PACS). Keyword arguments as in :func:`resnet`."""
  return resnet(18, num_classes, **kw)


def resnet50(num_classes: int, **kw) -> FunctionalModel:
  """ResNet-50 featurizer (z ∈ R^2048) + classifier: FedSR §5 (OfficeHome, DomainNet),
  FedIIR §5 (OfficeHome). Keyword arguments as in :func:`resnet`."""
  return resnet(50, num_classes, **kw)


# ---------------------------------------------------------------------------------------
# Pretrained weights from a user-supplied file.
# ---------------------------------------------------------------------------------------


def _flatten(tree: Any, prefix: tuple = ()) -> dict[str, Any]:
  out = {}
  if isinstance(tree, dict):
    for k in tree:
      out.update(_flatten(tree[k], prefix + (str(k),)))
  else:
    out["/".join(prefix)] = tree
  return out


def _unflatten_like(template: Any, flat: dict[str, Any], prefix: tuple = ()) -> Any:
  if isinstance(template, dict):
    return {k: _unflatten_like(v, flat, prefix + (str(k),)) for k, v in template.items()}
  return flat["/".join(prefix)]


def param_paths(params: Any) -> dict[str, tuple[int, ...]]:
  """``{'featurizer/stem_conv/kernel': shape, ...}``: the keys (and array shapes) of the
  ``.npz`` format read by :func:`load_pretrained`."""
  return {k: tuple(np.shape(v)) for k, v in _flatten(params).items()}


def save_params(params: Any, path: str | os.PathLike) -> pathlib.Path:
  """Writes ``params`` as an ``.npz`` keyed by ``/``-joined parameter paths (the format of
  :func:`load_pretrained`). Written to a temporary file and moved into place."""
  path = pathlib.Path(path)
  if path.suffix != ".npz":
    path = path.with_suffix(".npz")
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
  try:
    np.savez(tmp, **{k: np.asarray(v) for k, v in _flatten(params).items()})
    os.replace(tmp, path)
  finally:
    if tmp.exists():
      tmp.unlink()
  return path


def load_pretrained(params: Any, path: str | os.PathLike, *, prefix: str = "",
                    strict: bool = True) -> Any:
  """Returns ``params`` with the arrays of a user-supplied ``.npz`` file put in.

  File format: ``numpy.savez`` archive whose keys are the ``/``-joined paths of the
  parameter dict (``featurizer/stem_conv/kernel``, ``featurizer/blocks/0/norm1/scale``,
  ``classifier/kernel``, ... — see :func:`param_paths`; conv kernels are
  ``[kh, kw, in, out]``, linear kernels ``[in, out]``). Nothing is ever downloaded.

  Args:
    params: the parameter pytree to fill (e.g. ``model.init(0)``); it gives the expected
      keys, shapes and dtypes.
    path: the ``.npz`` file.
    prefix: only load keys under this path prefix, e.g. ``'featurizer'`` to take a
      pretrained backbone and keep the fresh classifier (the usual fine-tuning setup).
    strict: with True every expected key under ``prefix`` must be in the file and the file
      must hold no other key under ``prefix``; with False, missing keys keep their current
      values and extra keys are ignored (shapes must still match).

  Returns:
    A new params pytree (same structure, float32 arrays).

  Raises:
    FileNotFoundError: ``path`` does not exist.
    ValueError: not an ``.npz`` archive, missing or unexpected keys (``strict``), or a
      shape mismatch (each listed with the expected shape).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(
        f"pretrained weights file '{path}' not found. Weights are never downloaded: "
        "supply an .npz whose keys are '/'-joined parameter paths (see "
        "fedjax_inv.models.resnet.param_paths(model.init(0)) and save_params).")
  try:
    with np.load(path, allow_pickle=False) as f:
      file_arrays = {k: f[k] for k in f.files}
  except (ValueError, OSError) as e:
    raise ValueError(f"'{path}' is not a readable .npz archive ({e}); write it with "
                     "numpy.savez or fedjax_inv.models.resnet.save_params.") from e
  flat = _flatten(params)
  pre = prefix.strip("/")

  def selected(k: str) -> bool:
    return not pre or k == pre or k.startswith(pre + "/")

  wanted = [k for k in flat if selected(k)]
  if not wanted:
    raise ValueError(f"prefix={prefix!r} matches no parameter; top-level keys are "
                     f"{sorted({k.split('/')[0] for k in flat})}.")
  missing = [k for k in wanted if k not in file_arrays]
  unexpected = [k for k in file_arrays if selected(k) and k not in flat]
  bad_shape = [f"{k}: file {file_arrays[k].shape}, model {np.shape(flat[k])}"
               for k in wanted if k in file_arrays
               and tuple(file_arrays[k].shape) != tuple(np.shape(flat[k]))]
  problems = []
  if bad_shape:
    problems.append(f"{len(bad_shape)} shape mismatch(es): " + "; ".join(bad_shape[:10]))
  if strict and missing:
    problems.append(f"{len(missing)} missing key(s): {missing[:10]}")
  if strict and unexpected:
    problems.append(f"{len(unexpected)} unexpected key(s): {unexpected[:10]}")
  if problems:
    raise ValueError(
        f"pretrained weights '{path}' do not fit the model: " + " | ".join(problems) +
        ". Check the architecture (depth, feature_dim, classifier, GroupNorm), use "
        "prefix='featurizer' to load only the backbone, or strict=False to skip "
        "missing/extra keys.")
  new = {k: (jnp.asarray(file_arrays[k], jnp.asarray(v).dtype) if k in wanted
             and k in file_arrays else v) for k, v in flat.items()}
  return _unflatten_like(params, new)


class _PretrainedModel(FunctionalModel):
  """A ``FunctionalModel`` whose ``init(seed)`` puts user-supplied weights into the fresh
  parameters (see :func:`with_pretrained`)."""

  def init(self, seed):  # pylint: disable=missing-function-docstring
    params = FunctionalModel.init(self, seed)
    path, prefix, strict = self._pretrained
    return load_pretrained(params, path, prefix=prefix, strict=strict)


def with_pretrained(model: FunctionalModel, path: str | os.PathLike, *,
                    prefix: str = "featurizer", strict: bool = True) -> FunctionalModel:
  """``model`` whose ``init(seed)`` loads the ``.npz`` at ``path`` (see
  :func:`load_pretrained`) over the freshly initialized parameters — by default only the
  featurizer, so the classifier starts fresh (FedSR §5 / FedIIR §5 fine-tune a backbone).

  The file is checked here (keys and shapes), before anything compiles. A
  ``model_transform`` that rebuilds the model from ``model.factory`` must copy the base's
  ``init(seed)`` to keep the weights; FedSR's does (all but the replaced projection).

  Raises:
    FileNotFoundError: no file at ``path``.
    ValueError: the file does not fit the model (see :func:`load_pretrained`).
  """
  load_pretrained(FunctionalModel.init(model, 0), path, prefix=prefix, strict=strict)
  new = _PretrainedModel(model.factory, model.graphdef, model.template, model.feature_dim)
  object.__setattr__(new, "_pretrained", (str(path), prefix, strict))
  return new
