"""Synthetic tasks of Invariant FedAvg §4.1: the hospital binary classification (Task 2,
eq. 16-19) and the linear regression of IRM Example 1 / Aubin et al. 2021 (Task 3,
eq. 20-23).

Both are generated with numpy from the ``seed`` (``numpy.random.SeedSequence``), touch no
files, and accept the data arguments of the task contract (``data_dir``, ``source``,
``download``) only to ignore them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

# ---------------------------------------------------------------------------------------
# Generators (pure numpy; defined before the fedjax_inv.tasks import below).
# ---------------------------------------------------------------------------------------


def _check_prob(p, what: str) -> float:
  p = float(p)
  if not 0.0 <= p <= 1.0:
    raise ValueError(f"{what}={p}; it must be a probability in [0, 1].")
  return p


def _check_count(v, what: str, minimum: int = 1) -> int:
  if int(v) != v or v < minimum:
    raise ValueError(f"{what}={v!r}; it must be an integer >= {minimum}.")
  return int(v)


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
  n = _check_count(n, "n")
  d_inv = _check_count(d_inv, "d_inv")
  d_rand = _check_count(d_rand, "d_rand", 0)
  d_spu = _check_count(d_spu, "d_spu", 0)
  p_env = _check_prob(p_env, "p_env")
  label_noise = _check_prob(label_noise, "label_noise")
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
  d_inv = _check_count(d_inv, "d_inv")
  d_spu = _check_count(d_spu, "d_spu")
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
  n = _check_count(n, "n")
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


# ---------------------------------------------------------------------------------------
# Registered tasks.
# ---------------------------------------------------------------------------------------

from fedjax_inv import models  # noqa: E402
from fedjax_inv.core.data import from_client_arrays  # noqa: E402
from fedjax_inv.tasks import Task, register_task  # noqa: E402

HOSPITAL_ENV_PROBS = (0.1, 0.2)
HOSPITAL_OOD_PROB = 0.9


@register_task("synthetic_hospital", paper="Invariant FedAvg §4.1 Task 2 (eq. 16-19)",
               summary="binary y=1[sum x_inv>0] (25% label noise), spurious x_spu=flip(y,p_e); "
                       "clients p=0.1,0.2, OOD p=0.9; 50k samples each; MLP 11-10-1")
def synthetic_hospital(data_dir=None, source="auto", download=False, seed=0,
                       n_per_client=50000, env_probs: Sequence[float] | None = None,
                       num_clients=None, ood_prob=HOSPITAL_OOD_PROB, n_ood=None,
                       label_noise=0.25, d_inv=5, d_rand=5, d_spu=1, hidden=(10,)):
  """Synthetic hospital binary classification (Invariant FedAvg §4.1 Task 2).

  Features ``x = (x_inv [5], x_rand [5], x_spu [1])``, see :func:`sample_hospital_env`.
  Clients: ``env_probs`` (default p = 0.1, 0.2, the paper's two training environments),
  or ``num_clients=K`` clients with ``p_e ~ U(0, 0.2)`` drawn from the seed (the paper's
  robustness study, Fig. 3 right). Eval set 'ood': one client with ``p = ood_prob``
  (0.9). ``n_per_client`` samples per client (paper: 50,000; pass a small value for quick
  runs), ``n_ood`` OOD samples (default ``n_per_client``).

  Label noise (our reading): eq. 16-19 define ``y = 1[Σ x_inv > 0]`` without noise, but
  the paper's numbers -- FedAvg train 0.85 / test 0.11, "a classifier entirely based on
  the spurious features ... training accuracy 0.85 and test accuracy 0.10", and "due to
  random label flipping ... the maximum achievable accuracy would be 0.75" -- hold only if
  ``y`` is flipped with probability 0.25 as in ColoredMNIST (then the spurious-only
  classifier is Bayes-optimal on the training clients). So the default is
  ``label_noise=0.25``; ``label_noise=0`` gives eq. 18 literally (then ``x_inv`` alone
  separates the classes). ``x_inv, x_rand ~ N(0, I)`` (the paper's 𝒵 is unspecified).

  Model: MLP with one 10-unit hidden layer (paper). kind 'binary'.
  Defaults: full-batch clients, one local SGD step of lr 1.0 per round (E = 1), 500
  rounds, so FedAvg is gradient descent on the pooled risk (seed 0: train accuracy 0.84,
  OOD 0.14 after 500 rounds; paper: 0.85 / 0.11). The paper trains 10,000 rounds with
  Adam (E ∈ {1, 2, 5, 10, 20} in its robustness study); here clients restart their
  optimizer every round, so one Adam step would be a sign step ``lr·sign(g)`` (see
  ``colored_mnist``, which uses the same recipe).

  Raises:
    ValueError: both ``env_probs`` and ``num_clients``, bad probabilities or sizes.
  """
  del data_dir, source, download  # generated data
  if env_probs is not None and num_clients is not None:
    raise ValueError("pass env_probs or num_clients (p_e ~ U(0, 0.2)), not both "
                     f"(got env_probs={env_probs}, num_clients={num_clients}).")
  n_per_client = _check_count(n_per_client, "n_per_client")
  n_ood = n_per_client if n_ood is None else _check_count(n_ood, "n_ood")
  ood_prob = _check_prob(ood_prob, "ood_prob")
  _check_prob(label_noise, "label_noise")
  ss = np.random.SeedSequence(seed)
  s_probs, s_ood, s_envs = ss.spawn(3)
  if num_clients is not None:
    k = _check_count(num_clients, "num_clients")
    probs = np.random.default_rng(s_probs).uniform(0.0, 0.2, k).tolist()
    setting = f"{k} clients with p_e ~ U(0, 0.2)"
  else:
    probs = [_check_prob(p, "env_probs entry") for p in
             (HOSPITAL_ENV_PROBS if env_probs is None else env_probs)]
    if not probs:
      raise ValueError("env_probs is empty; pass at least one client probability.")
    setting = f"clients with p_e = {probs}"
  kw = dict(d_inv=d_inv, d_rand=d_rand, d_spu=d_spu, label_noise=label_noise)
  envs = [sample_hospital_env(n_per_client, p, np.random.default_rng(s), **kw)
          for p, s in zip(probs, s_envs.spawn(len(probs)))]
  ood = sample_hospital_env(n_ood, ood_prob, np.random.default_rng(s_ood), **kw)
  train = from_client_arrays([e["x"] for e in envs], [e["y"] for e in envs])
  eval_sets = {"ood": from_client_arrays([ood["x"]], [ood["y"]])}
  info = {
      "paper": "Invariant FedAvg §4.1 Task 2 (eq. 16-19)",
      "dataset_source": "synthetic (numpy)",
      "data_note": (f"synthetic hospital task, {setting}, OOD p = {ood_prob}; "
                    f"{n_per_client:,} samples per client, {n_ood:,} OOD; x_inv, x_rand "
                    f"~ N(0, I); label noise {label_noise}; seed {seed}"),
      "env_probs": [float(p) for p in probs], "ood_prob": ood_prob,
      "label_noise": float(label_noise), "d_inv": int(d_inv), "d_rand": int(d_rand),
      "d_spu": int(d_spu), "n_per_client": n_per_client, "n_ood": n_ood, "seed": int(seed),
  }
  model = models.mlp(int(d_inv) + int(d_rand) + int(d_spu), tuple(hidden), 1)
  return Task("synthetic_hospital", "binary", train, eval_sets, model, info,
              defaults=dict(rounds=500, eval_every=25, local_steps=1, batch_size=None,
                            client_optimizer="sgd", client_lr=1.0, weight_decay=0.0))


LINEAR_SIGMAS = ((0.1, 5.0), (1.5, 0.1), (5.0, 1.5))


@register_task("linear_regression",
               paper="Invariant FedAvg §4.1 Task 3 (eq. 20-23); IRM Example 1; "
                     "Aubin et al. 2021",
               summary="3 clients (sigma, sigma~) = (0.1,5), (1.5,0.1), (5,1.5), n=300; "
                       "tests with shuffled spurious features; MSE; MLP 10-30-1")
def linear_regression(data_dir=None, source="auto", download=False, seed=0,
                      n_per_client=300, n_test=None, sigmas=LINEAR_SIGMAS, d_inv=5,
                      d_spu=5, noise_std=1.0, hidden=(30,)):
  """Linear regression with causes and effects of the target (Invariant FedAvg §4.1
  Task 3; IRM Example 1; Aubin et al. 2021).

  Client ``e`` samples eq. 20-23 (:func:`sample_example1_env`) with ``(σ^e, σ̃^e)`` from
  ``sigmas`` (paper: (0.1, 5), (1.5, 0.1), (5, 1.5)) and ``n_per_client`` samples
  (paper: 300). ``W_yx``, ``W_xy`` are drawn once from the seed and shared by all clients
  (the invariant mechanism). Eval sets: ``'test_env{e}'`` -- a fresh sample of client
  ``e``'s distribution (``n_test``, default ``n_per_client``) with the spurious features
  shuffled between samples (paper: "a copy of the train distributions but with the
  spuriously correlated features shuffled"); ``'ood'`` -- all of them (one client each,
  metrics pooled). Metric: mean squared error (kind 'regression').

  Choices where the paper is silent: ``d_inv = d_spu = 5`` (Aubin et al.'s default),
  ``σ_n = noise_std = 1``, ``W`` entries with variance ``1/d_inv``.
  Model: MLP with one 30-unit hidden layer (paper).
  Defaults: full-batch SGD (lr 0.01), 5 local steps per round, 1,000 rounds (paper: Adam,
  6,000 rounds, IRM penalty after round 3,000). Clients start every round with a fresh
  optimizer state, so one Adam step per round is a sign step of size lr; on this task
  that stalls above the least-squares error, while the SGD recipe reaches a training MSE
  near the paper's (about 3 after 1,000 rounds with seed 0).

  Raises:
    ValueError: bad sizes or standard deviations.
  """
  del data_dir, source, download  # generated data
  n_per_client = _check_count(n_per_client, "n_per_client")
  n_test = n_per_client if n_test is None else _check_count(n_test, "n_test")
  sigmas = [tuple(float(v) for v in s) for s in sigmas]
  if not sigmas or any(len(s) != 2 or min(s) <= 0 for s in sigmas):
    raise ValueError(f"sigmas={sigmas}; pass one (sigma, sigma_spu) pair of positive "
                     "standard deviations per client.")
  if not np.isfinite(noise_std) or noise_std <= 0:
    raise ValueError(f"noise_std={noise_std!r}; it must be > 0.")
  ss = np.random.SeedSequence(seed)
  s_w, s_train, s_test = ss.spawn(3)
  w_yx, w_xy = example1_weights(d_inv, d_spu, np.random.default_rng(s_w))
  trains, tests = [], []
  for (sig, sig_spu), s_tr, s_te in zip(sigmas, s_train.spawn(len(sigmas)),
                                        s_test.spawn(len(sigmas))):
    trains.append(sample_example1_env(n_per_client, sig, sig_spu, w_yx, w_xy,
                                      np.random.default_rng(s_tr), noise_std=noise_std))
    tests.append(sample_example1_env(n_test, sig, sig_spu, w_yx, w_xy,
                                     np.random.default_rng(s_te), noise_std=noise_std,
                                     shuffle_spurious=True))
  train = from_client_arrays([e["x"] for e in trains], [e["y"] for e in trains])
  eval_sets = {f"test_env{i}": from_client_arrays([e["x"]], [e["y"]])
               for i, e in enumerate(tests)}
  eval_sets["ood"] = from_client_arrays([e["x"] for e in tests], [e["y"] for e in tests])
  info = {
      "paper": "Invariant FedAvg §4.1 Task 3 (eq. 20-23); IRM Example 1; Aubin et al. 2021",
      "dataset_source": "synthetic (numpy)",
      "data_note": (f"linear regression Example 1, {len(sigmas)} clients (sigma, "
                    f"sigma_spu) = {sigmas}, {n_per_client} samples each; tests: fresh "
                    f"samples ({n_test} each) with shuffled spurious features; d_inv="
                    f"{d_inv}, d_spu={d_spu}, noise_std={noise_std}; seed {seed}"),
      "sigmas": [list(s) for s in sigmas], "d_inv": int(d_inv), "d_spu": int(d_spu),
      "noise_std": float(noise_std), "n_per_client": n_per_client, "n_test": n_test,
      "invariant_coef": (w_yx.T @ np.ones(int(d_inv))).tolist(), "seed": int(seed),
  }
  model = models.mlp(int(d_inv) + int(d_spu), tuple(hidden), 1)
  return Task("linear_regression", "regression", train, eval_sets, model, info,
              defaults=dict(rounds=1000, eval_every=50, local_steps=5, batch_size=None,
                            client_optimizer="sgd", client_lr=0.01, weight_decay=0.0))
