"""Synthetic data of Invariant FedAvg §4.1 (tasks: ``fedjax_inv/tasks/synthetic.py``): the
hospital binary classification (Task 2,
eq. 16-19) and the linear regression of IRM Example 1 / Aubin et al. 2021 (Task 3,
eq. 20-23).

Both are generated with numpy from the ``seed`` (``numpy.random.SeedSequence``), touch no
files, and accept the data arguments of the task contract (``data_dir``, ``source``,
``download``) only to ignore them.
"""
from __future__ import annotations


import numpy as np

from fedjax_inv.core import validation as check

# ---------------------------------------------------------------------------------------
# Generators (pure numpy; defined before the fedjax_inv.tasks import below).
# ---------------------------------------------------------------------------------------


def sample_hospital_env(n: int, p_env: float, rng: np.random.Generator, *,
                        d_inv: int = 5, d_rand: int = 5, d_spu: int = 1,
                        label_noise: float = 0.25) -> dict:
  """One environment (client) of the synthetic hospital task (Invariant FedAvg eq. 16-19).

  ``x_inv ~ N(0, I_{d_inv})`` and ``x_rand ~ N(0, I_{d_rand})`` (the paper writes 𝒵;
  we take the standard normal); clean label ``y* = 1[Σ_j x_inv,j > 0]`` (eq. 18);
  observed label ``y = flip(y*, label_noise)``; every spurious feature
  ``x_spu,j = flip(y, p_env)`` independently (eq. 19), as a float 0./1.

  Args:
    n: samples.
    p_env: the environment's spurious flip probability ``p^e`` in ``[0, 1]``.
    rng: ``numpy.random.Generator``; draws x_inv, x_rand, label noise, spurious flips in
      that order.
    d_inv, d_rand, d_spu: feature counts (paper: 5, 5, 1).
    label_noise: probability that ``y`` differs from ``y*`` (see the module note in
      :func:`synthetic_hospital` for why the default is 0.25; 0 gives eq. 18 exactly).

  Returns:
    dict: 'x' float32 ``[n, d_inv + d_rand + d_spu]`` ordered (inv, rand, spu); 'y' int32
    ``[n]`` in {0, 1}; 'y_clean' int32 ``[n]``; 'spurious' int32 ``[n, d_spu]``.

  Raises:
    ValueError: non-positive sizes or probabilities outside [0, 1].

  Source: Invariant FedAvg §4.1 Task 2, eq. 16-19.
  """
  n = check.integer("n", n)
  d_inv = check.integer("d_inv", d_inv)
  d_rand = check.integer("d_rand", d_rand, 0)
  d_spu = check.integer("d_spu", d_spu, 0)
  p_env = check.probability("p_env", p_env)
  label_noise = check.probability("label_noise", label_noise)
  x_inv = rng.standard_normal((n, d_inv))
  x_rand = rng.standard_normal((n, d_rand))
  y_clean = (x_inv.sum(axis=1) > 0).astype(np.int32)
  y = y_clean ^ (rng.random(n) < label_noise).astype(np.int32)
  spu = y[:, None] ^ (rng.random((n, d_spu)) < p_env).astype(np.int32)
  x = np.concatenate([x_inv, x_rand, spu.astype(np.float64)], axis=1).astype(np.float32)
  return {"x": x, "y": y, "y_clean": y_clean, "spurious": spu}


def example1_weights(d_inv: int, d_spu: int, rng: np.random.Generator
                     ) -> tuple[np.ndarray, np.ndarray]:
  """The fixed matrices of IRM Example 1: ``W_yx [d_inv, d_inv]``, ``W_xy [d_spu, d_inv]``
  with i.i.d. entries ``N(0, 1/d_inv)`` (variance 1/d_inv), shared by all environments.

  Source: Invariant FedAvg §4.1 Task 3 (text after eq. 23); Aubin et al. 2021.
  """
  d_inv = check.integer("d_inv", d_inv)
  d_spu = check.integer("d_spu", d_spu)
  scale = 1.0 / np.sqrt(d_inv)
  return (rng.standard_normal((d_inv, d_inv)) * scale,
          rng.standard_normal((d_spu, d_inv)) * scale)


def sample_example1_env(n: int, sigma: float, sigma_spu: float, w_yx: np.ndarray,
                        w_xy: np.ndarray, rng: np.random.Generator, *,
                        noise_std: float = 1.0, shuffle_spurious: bool = False) -> dict:
  """One environment of the linear regression task (Invariant FedAvg eq. 20-23).

  ``x_inv ~ N(0, σ² I)`` (eq. 20); ``ỹ ~ N(W_yx x_inv, σ_n² I)`` (eq. 21, ``σ_n =
  noise_std``, the same in every environment); ``x_spu ~ N(W_xy ỹ, σ̃² I)`` (eq. 22);
  ``y = 1ᵀ ỹ`` (eq. 23). So ``E[y | x_inv] = (W_yxᵀ 1)ᵀ x_inv`` in every environment,
  while the regression of ``y`` on ``x_spu`` changes with ``σ, σ̃``. With
  ``shuffle_spurious`` the rows of ``x_spu`` are permuted between samples (the test sets
  of IRM §5.1 / Invariant FedAvg Task 3), which removes their correlation with ``y``.

  Args:
    n: samples; sigma, sigma_spu: ``σ^e``, ``σ̃^e`` (standard deviations, > 0).
    w_yx, w_xy: from :func:`example1_weights`.
    rng: numpy Generator (draws x_inv, ỹ noise, x_spu noise, then the permutation).
    noise_std: ``σ_n`` (> 0; the paper does not give it, we use 1).
    shuffle_spurious: permute ``x_spu`` across samples.

  Returns:
    dict: 'x' float32 ``[n, d_inv + d_spu]`` ordered (inv, spu); 'y' float32 ``[n]``;
    'y_tilde' float64 ``[n, d_inv]``.

  Raises:
    ValueError: non-positive ``n`` or standard deviations, or mismatched matrices.

  Source: Invariant FedAvg §4.1 Task 3, eq. 20-23; Aubin et al. 2021, Example 1.
  """
  n = check.integer("n", n)
  for what, v in (("sigma", sigma), ("sigma_spu", sigma_spu), ("noise_std", noise_std)):
    if not np.isfinite(v) or v <= 0:
      raise ValueError(f"{what}={v!r}; a standard deviation must be > 0.")
  w_yx, w_xy = np.asarray(w_yx), np.asarray(w_xy)
  d_inv = w_yx.shape[0]
  if w_yx.shape != (d_inv, d_inv) or w_xy.ndim != 2 or w_xy.shape[1] != d_inv:
    raise ValueError(f"W_yx must be [d_inv, d_inv] and W_xy [d_spu, d_inv], got "
                     f"{list(w_yx.shape)} and {list(w_xy.shape)}.")
  x_inv = rng.standard_normal((n, d_inv)) * sigma
  y_tilde = x_inv @ w_yx.T + noise_std * rng.standard_normal((n, d_inv))
  x_spu = y_tilde @ w_xy.T + sigma_spu * rng.standard_normal((n, w_xy.shape[0]))
  if shuffle_spurious:
    x_spu = x_spu[rng.permutation(n)]
  y = y_tilde.sum(axis=1)
  return {"x": np.concatenate([x_inv, x_spu], axis=1).astype(np.float32),
          "y": y.astype(np.float32), "y_tilde": y_tilde}
