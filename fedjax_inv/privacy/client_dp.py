"""Client-level differential privacy: DP-FedAvg (McMahan et al. 2018, "Learning
Differentially Private Recurrent Language Models", Alg. 1 with the uniform-weight
estimator) as a transformation of any algorithm whose server averages client updates,
with the privacy loss tracked by ``dp-accounting`` (RDP or PLD).

One round, inside the jitted round, on the client axis:

    clip:   Δ̃_k = Δ_k · min(1, C / ‖Δ_k‖)      (‖·‖ the L2 norm over every parameter)
    sum:    S = Σ_{k present} Δ̃_k                (an associative sum, every strategy)
    noise:  S̃ = S + N(0, σ² C² I)                (on the SUM: sensitivity C)
    mean:   Δ = S̃ / E,  E = C_round              (the expected cohort size: the fixed
                                                  cohort, or q·N under Poisson sampling)

(computed as ``S / E + N(0, (σC/E)² I)``, the same distribution: the aggregator
:func:`fedjax_inv.aggregation.aggregators.clipped_mean` divides, the server stage
:func:`dp_component` adds the noise)

then the algorithm's own server stages and server optimizer on ``Δ``. The noise is drawn
from the run's key (``Context.key``, derived from the seed and the round), so a run is
reproducible and ``--resume`` stays bit-identical. Client weights are uniform (a weight
``n_k`` would make the sum's sensitivity ``C · max n_k``): ``weighting='uniform'``.

Sampling and accounting (``dp-accounting``'s events, composed over the rounds):
  * ``sampling='poisson'``: every pool client takes part in a round independently with
    probability ``q = C_round / N`` (``Algorithm.client_sampling``; the engine's cohort is
    a padded buffer, ``core.strategy.poisson_slots``): ``PoissonSampledDpEvent(q,
    GaussianDpEvent(σ))``, add-or-remove-one neighbours; RDP or PLD.
  * ``sampling='fixed'``: exactly ``C_round`` clients without replacement:
    ``SampledWithoutReplacementDpEvent(N, C_round, GaussianDpEvent(σ))``, replace-one
    neighbours; RDP only (``dp-accounting``'s PLD accountant does not support it).

What is covered: the pseudo-gradient (the client updates). Not covered: any other
message a method sends (Fishr's gradient variances and VJPs, FedIIR's classifier
gradients, SCAFFOLD's control-variate updates, FedGMA's signs, FedCurv's Fisher sums),
which the run records under ``privacy.not_covered``; and the training-loss metric (a
simulation statistic). Algorithms whose server does not average the client updates (the
geometric mean of FedILC's Inter-Geo, the aggregator-level sign masks) are refused.

Source: McMahan et al. 2018, Alg. 1 and §3 (clip, Gaussian noise on the sum, fixed
denominator); Mironov 2017 / Mironov et al. 2019 (RDP of the sampled Gaussian); Doroshenko
et al. 2022 (PLD); ``dp-accounting`` (google/differential-privacy).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_inv.aggregation.aggregators import DP_CONTEXT
from fedjax_inv.aggregation.aggregators import clipped_mean  # noqa: F401  (re-exported)
from fedjax_inv.core.aggregator import Aggregator
from fedjax_inv.core.algorithm import Component

NAME = DP_CONTEXT  # the component's name and its extras key
ACCOUNTANTS = ("rdp", "pld")
SAMPLINGS = ("fixed", "poisson")
# What a method's other messages carry (privacy.not_covered in summary.json).
MESSAGES = {"fishr": "Fishr's gradient variances (pre-round) and VJPs",
            "fediir": "FedIIR's classifier gradients (pre-round)",
            "scaffold": "SCAFFOLD's control-variate updates",
            "sign": "FedGMA's / the AND-mask's update signs",
            "fedcurv": "FedCurv's Fisher information sums"}
# The bracket of the noise search of --dp-target-epsilon.
SIGMA_MAX = 1e3


@dataclasses.dataclass(frozen=True)
class DPSettings:
  """Client-level DP of a run (module docstring).

  Attributes:
    clip: ``C`` > 0, the L2 bound of every client update (``math.inf``: no clipping,
      only with ``noise_multiplier == 0``).
    noise_multiplier: ``σ >= 0``: the noise std on the sum is ``σ C``. None with
      ``target_epsilon`` (then solved by :func:`solve_noise`).
    delta: ``δ`` in (0, 1).
    accountant: 'rdp' | 'pld'.
    sampling: 'fixed' | 'poisson'.
    target_epsilon: ``ε > 0`` to reach after the run's rounds (solves ``σ``), or None.
    adaptive_quantile: ``γ`` in (0, 1): adaptive clipping (Andrew et al. 2021) — the clip
      norm starts at ``clip`` and tracks the ``γ``-quantile of the client update norms;
      None: a fixed clip.
    clip_lr: ``η_C > 0``, the geometric step of the clip norm (Andrew et al.: 0.2).
    clip_count_stddev: ``σ_b``, the noise std of the count of unclipped clients; None:
      ``E / 20`` (Andrew et al.'s choice for E expected clients).
  """
  clip: float
  noise_multiplier: Optional[float] = None
  delta: float = 1e-5
  accountant: str = "rdp"
  sampling: str = "fixed"
  target_epsilon: Optional[float] = None
  adaptive_quantile: Optional[float] = None
  clip_lr: float = 0.2
  clip_count_stddev: Optional[float] = None

  def check(self) -> "DPSettings":
    """Raises ValueError naming the bad value (as the CLI flag) and the fix."""
    number = is_number
    if not number(self.clip) or self.clip <= 0:
      raise ValueError(f"--dp-clip {self.clip!r}: the clipping norm C must be > 0 "
                       "(e.g. 1.0; 'inf' only with --dp-noise-multiplier 0).")
    if self.noise_multiplier is not None and (not number(self.noise_multiplier)
                                              or not 0 <= self.noise_multiplier < math.inf):
      raise ValueError(f"--dp-noise-multiplier {self.noise_multiplier!r}: sigma must be a "
                       "finite number >= 0.")
    if (self.noise_multiplier is None) == (self.target_epsilon is None):
      raise ValueError("give exactly one of --dp-noise-multiplier and --dp-target-epsilon "
                       f"(got {self.noise_multiplier!r} and {self.target_epsilon!r}).")
    if self.target_epsilon is not None and (not number(self.target_epsilon)
                                            or not 0 < self.target_epsilon < math.inf):
      raise ValueError(f"--dp-target-epsilon {self.target_epsilon!r}: it must be a finite "
                       "number > 0.")
    if not number(self.delta) or not 0 < self.delta < 1:
      raise ValueError(f"--dp-delta {self.delta!r}: delta must be in (0, 1), e.g. 1e-5.")
    if self.accountant not in ACCOUNTANTS:
      raise ValueError(f"--dp-accountant {self.accountant!r}: choose one of {ACCOUNTANTS}.")
    if self.sampling not in SAMPLINGS:
      raise ValueError(f"--client-sampling {self.sampling!r}: choose one of {SAMPLINGS}.")
    if self.accountant == "pld" and self.sampling == "fixed":
      raise ValueError("--dp-accountant pld needs --client-sampling poisson: dp-accounting's "
                       "PLD accountant does not support fixed-size sampling without "
                       "replacement; use --dp-accountant rdp, or Poisson sampling.")
    if self.adaptive_quantile is not None and (not number(self.adaptive_quantile)
                                               or not 0 < self.adaptive_quantile < 1):
      raise ValueError(f"--dp-adaptive-quantile {self.adaptive_quantile!r}: the target "
                       "quantile of the update norms must be in (0, 1), e.g. 0.5.")
    if self.adaptive_quantile is not None and math.isinf(self.clip):
      raise ValueError("--dp-adaptive-quantile with --dp-clip inf: the adaptive clip norm "
                       "starts at --dp-clip; give a finite start (e.g. 0.1).")
    if not number(self.clip_lr) or self.clip_lr <= 0:
      raise ValueError(f"clip_lr={self.clip_lr!r}: the clip norm's step must be > 0.")
    if math.isinf(self.clip) and (self.noise_multiplier or 0) > 0:
      raise ValueError(f"--dp-clip inf with --dp-noise-multiplier {self.noise_multiplier}: "
                       "noise sigma*C would be infinite; give a finite clip.")
    return self


def dp_component(clip: float, noise_multiplier: float, expected_cohort: float,
                 adaptive: Optional[dict] = None) -> Component:
  """The noise of DP-FedAvg as a server stage: ``Δ ← Δ + N(0, (σ C / E)² I)`` on the
  clipped mean ``Δ = S / E`` (:func:`clipped_mean`), i.e. exactly ``(S + N(0, σ²C² I)) /
  E``: the noise is calibrated to the SUM's sensitivity ``C``, then divided by the
  expected cohort ``E`` with the sum. Drawn from ``ctx.key`` (the round's server key);
  ``σ = 0`` adds nothing.

  ``adaptive`` (Andrew et al. 2021, Alg. 1, geometric update): ``{'quantile': γ, 'lr':
  η_C, 'count_stddev': σ_b, 'update_noise': σ_Δ}``. The server state is ``{'clip': C_t}``
  (starting at ``clip``); each client also sends ``b_k = 1[‖Δ_k‖ <= C_t]``; the server
  adds ``N(0, σ_Δ² C_t²)`` to the update sum and ``N(0, σ_b²)`` to ``Σ b_k``, and sets
  ``C_{t+1} = C_t exp(−η_C (b̄ − γ))`` with ``b̄ = (Σ b_k + noise) / E``. With
  ``σ_Δ = (σ^-2 − (2σ_b)^-2)^-1/2`` the two releases together are as private as one
  Gaussian mechanism of noise multiplier ``σ`` (their Thm. 1), so the accountant charges
  ``σ``.

  Raises (at trace time): ValueError when the round gives no key (a round function not
  built by ``core.engine``).

  Source: McMahan et al. 2018, Alg. 1 (``M.noise``, std ``σ S / (q W)``); Andrew et al.
  2021, Alg. 1 and Thm. 1 (adaptive clipping).
  """
  E = float(expected_cohort)
  sigma = adaptive["update_noise"] if adaptive else float(noise_multiplier)

  def noisy(mean, state, key, bound):
    if sigma == 0:  # no noise at all (and no 0 * inf with an infinite clip)
      return mean
    if key is None:
      raise ValueError("DP noise needs the round's key (Context.key); build the round "
                       "with fedjax_inv.core.engine.build_round.")
    leaves, treedef = jax.tree.flatten(mean)
    keys = jax.random.split(key, len(leaves))
    std = sigma * bound / E
    return jax.tree.unflatten(treedef, [
        t + std * jax.random.normal(k, t.shape, t.dtype) for t, k in zip(leaves, keys)])

  if adaptive is None:
    return Component(NAME, server_stage=lambda pseudo_grad, state, ctx: (
        noisy(pseudo_grad, state, ctx.key, float(clip)), state))

  def unclipped(params, ctx):  # b_k
    delta = jax.tree.map(jnp.subtract, ctx.params, params)
    return (optax.tree.norm(delta) <= ctx.extras[NAME]["clip"]).astype(jnp.float32)

  def update(pseudo_grad, state, messages, ctx):  # the pseudo-gradient: the clipped mean
    mean = pseudo_grad
    bound = state["clip"]
    count = messages[NAME]
    if adaptive["count_stddev"] > 0 and sigma > 0:
      k_update, k_count = jax.random.split(ctx.key)
      count = count + adaptive["count_stddev"] * jax.random.normal(k_count, (), jnp.float32)
    else:
      k_update = ctx.key
    b_bar = count / E
    new = bound * jnp.exp(-adaptive["lr"] * (b_bar - adaptive["quantile"]))
    return noisy(mean, state, k_update, bound), {"clip": new.astype(jnp.float32)}

  present_sum = Aggregator(lambda m, w: jnp.where(w > 0, m, jnp.zeros_like(m)),
                           lambda total: total, "sum")
  return Component(NAME, message=unclipped, aggregator=present_sum,
                   init_server=lambda params: {"clip": jnp.float32(clip)},
                   server_stage=update)


def not_covered(algorithm) -> list:
  """What the algorithm's server receives besides the client updates (not privatized)."""
  return [MESSAGES.get(c.name, f"component {c.name!r}'s messages")
          for c in algorithm.components
          if c.name != NAME and (c.message is not None or c.pre_message is not None)]


def apply(algorithm, settings: DPSettings, num_clients: int, cohort: int):
  """``algorithm`` with client-level DP (module docstring): the clipped-mean aggregator,
  uniform client weights, the noise stage first among the server stages, and
  ``client_sampling = settings.sampling``.

  Args:
    algorithm: an ``Algorithm`` whose aggregator is the mean of the client updates.
    settings: checked :class:`DPSettings` with ``noise_multiplier`` set (solve a
      ``target_epsilon`` first: :func:`resolve`).
    num_clients: ``N``, the pool size.
    cohort: the (expected) clients per round ``C_round``.

  Returns:
    the new ``Algorithm``; its ``hparams`` record the DP settings.

  Raises:
    ValueError: an algorithm whose server does not average the client updates (names it
      and why), or DP applied twice.
  """
  if any(c.name == NAME for c in algorithm.components):
    raise ValueError(f"{algorithm.name}: DP is applied already (a component {NAME!r}).")
  if algorithm.aggregator.name != "mean":
    raise ValueError(
        f"DP cannot cover {algorithm.name!r}: its server combines the client updates with "
        f"{algorithm.aggregator.name!r}, not a mean, so a clipped sum plus Gaussian noise "
        "(DP-FedAvg) does not bound what it reveals; use an algorithm whose aggregator is "
        "the mean (e.g. fedavg, fedprox, scaffold, inv_fedavg, fediir, fedsr, "
        "fishr_intra_arith).")
  sigma = settings.noise_multiplier
  hp = dict(algorithm.hparams, weighting="uniform", aggregator="clipped_mean",
            dp_clip=settings.clip,
            dp_noise_multiplier=sigma, dp_delta=settings.delta,
            dp_accountant=settings.accountant, client_sampling=settings.sampling)
  adaptive = _adaptive(settings, cohort)
  if adaptive is not None:
    hp.update(dp_adaptive_quantile=adaptive["quantile"], dp_clip_lr=adaptive["lr"],
              dp_clip_count_stddev=adaptive["count_stddev"],
              dp_update_noise_multiplier=adaptive["update_noise"])
  return algorithm.replace(
      aggregator=clipped_mean(settings.clip,
                              cohort if settings.sampling == "poisson" else None,
                              adaptive=adaptive is not None),
      weighting="uniform",
      components=(dp_component(settings.clip, sigma, cohort, adaptive),)
      + algorithm.components,
      client_sampling=settings.sampling, hparams=hp)


def _adaptive(settings: DPSettings, cohort: int) -> Optional[dict]:
  """Adaptive clipping's constants (:func:`dp_component`), or None for a fixed clip.

  Raises:
    ValueError: ``σ_b`` too small for ``σ`` (``2 σ_b <= σ``: no ``σ_Δ`` keeps the total at
      noise multiplier ``σ``)."""
  if settings.adaptive_quantile is None:
    return None
  z = settings.noise_multiplier
  count_std = (cohort / 20.0 if settings.clip_count_stddev is None
               else float(settings.clip_count_stddev))
  if z == 0:
    update = 0.0
  elif 2.0 * count_std <= z:
    raise ValueError(f"adaptive clipping: the count noise sigma_b={count_std:g} must exceed "
                     f"half the noise multiplier (sigma/2 = {z / 2:g}); sample more clients "
                     "per round (sigma_b = E/20 by default) or lower the noise (Andrew et "
                     "al. 2021, Thm. 1).")
  else:
    update = (z ** -2 - (2.0 * count_std) ** -2) ** -0.5
  return {"quantile": float(settings.adaptive_quantile), "lr": float(settings.clip_lr),
          "count_stddev": count_std if z > 0 else 0.0, "update_noise": float(update)}


# ---------------------------------------------------------------------------------------
# Accounting (dp-accounting)
# ---------------------------------------------------------------------------------------


def _dpa():
  try:
    import dp_accounting
  except ImportError as e:  # a core dependency; only a broken install lacks it
    raise ImportError("client-level DP needs dp-accounting: pip install "
                      "'dp-accounting>=0.4'.") from e
  return dp_accounting


def dp_event(noise_multiplier: float, sampling: str, num_clients: int, cohort: int,
             rounds: int):
  """The ``dp-accounting`` event of ``rounds`` rounds (module docstring)."""
  dpa = _dpa()
  gaussian = dpa.GaussianDpEvent(noise_multiplier)
  if sampling == "poisson":
    one = dpa.PoissonSampledDpEvent(cohort / num_clients, gaussian)
  else:
    one = dpa.SampledWithoutReplacementDpEvent(num_clients, cohort, gaussian)
  return dpa.SelfComposedDpEvent(one, int(rounds))


def _accountant(name: str, sampling: str):
  dpa = _dpa()
  rel = (dpa.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling == "poisson"
         else dpa.NeighboringRelation.REPLACE_ONE)
  if name == "pld":
    from dp_accounting import pld
    return pld.PLDAccountant(neighboring_relation=rel)
  from dp_accounting import rdp
  return rdp.RdpAccountant(neighboring_relation=rel)


@functools.lru_cache(maxsize=4096)
def epsilon(noise_multiplier: float, delta: float, accountant: str, sampling: str,
            num_clients: int, cohort: int, rounds: int) -> float:
  """``ε`` at ``δ`` after ``rounds`` rounds (``math.inf`` for ``σ = 0``; 0 for 0 rounds).

  Source: ``dp-accounting``'s ``RdpAccountant`` / ``PLDAccountant``."""
  if rounds == 0:
    return 0.0
  if noise_multiplier == 0:
    return math.inf
  acc = _accountant(accountant, sampling)
  acc.compose(dp_event(noise_multiplier, sampling, num_clients, cohort, rounds))
  return quiet_epsilon(acc, delta)


def quiet_epsilon(accountant, delta: float) -> float:
  """``accountant.get_epsilon(delta)`` with absl's warnings silenced: dp-accounting's RDP
  logs one per fractional order it cannot evaluate (and leaves out); the epsilon is over
  the orders it could. Shared with ``fedjax_inv.privacy.dp_sgd``."""
  absl_log = logging.getLogger("absl")
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    return float(accountant.get_epsilon(delta))
  finally:
    absl_log.setLevel(level)


def is_number(v) -> bool:
  """A real number (not a bool, not NaN): what the DP settings' checks accept."""
  return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def solve_noise(target_epsilon: float, delta: float, accountant: str, sampling: str,
                num_clients: int, cohort: int, rounds: int, rtol: float = 1e-3) -> float:
  """The smallest ``σ`` (to relative tolerance ``rtol``) whose ``ε`` after ``rounds``
  rounds is at most ``target_epsilon``: a bisection on ``σ`` (``ε`` decreases in ``σ``),
  the search pfl-research runs (``pfl.privacy.privacy_accountant``, a binary search of
  the noise parameter against the target), here to a tighter tolerance.

  Raises:
    ValueError: the target is not reached even at ``σ = SIGMA_MAX`` (names the ε there and
      the fixes).
  """
  def eps(s):
    return epsilon(float(s), delta, accountant, sampling, num_clients, cohort, rounds)
  hi = 1.0
  while eps(hi) > target_epsilon:
    hi *= 2.0
    if hi > SIGMA_MAX:
      raise ValueError(
          f"--dp-target-epsilon {target_epsilon}: not reachable in {rounds} rounds with "
          f"{cohort} of {num_clients} clients per round (epsilon is still "
          f"{eps(SIGMA_MAX):.3g} at noise multiplier {SIGMA_MAX:g}); raise the target, or "
          "run fewer rounds or sample fewer clients per round.")
  lo = 0.0
  while hi - lo > rtol * hi:
    mid = 0.5 * (lo + hi)
    if mid > 0 and eps(mid) <= target_epsilon:
      hi = mid
    else:
      lo = mid
  return hi


def resolve(settings: DPSettings, num_clients: int, cohort: int, rounds: int) -> DPSettings:
  """``settings`` checked, with ``noise_multiplier`` solved from ``target_epsilon``."""
  settings.check()
  if settings.target_epsilon is not None:
    sigma = solve_noise(settings.target_epsilon, settings.delta, settings.accountant,
                        settings.sampling, num_clients, cohort, rounds)
    settings = dataclasses.replace(settings, noise_multiplier=sigma)
  return settings


def record(algorithm, num_clients: int, cohort: int, rounds: int) -> Optional[dict]:
  """summary.json's ``privacy`` for a run of ``algorithm`` (None without DP)."""
  hp = algorithm.hparams
  if "dp_clip" not in hp:
    return None
  sigma, delta = hp["dp_noise_multiplier"], hp["dp_delta"]
  return {"epsilon": epsilon(sigma, delta, hp["dp_accountant"], hp["client_sampling"],
                             num_clients, cohort, rounds),
          "delta": delta, "accountant": hp["dp_accountant"], "noise_multiplier": sigma,
          "clip": hp["dp_clip"], "sampling": hp["client_sampling"], "rounds": rounds,
          "clients_per_round": cohort, "num_clients": num_clients,
          "covered": "the client updates (pseudo-gradient), client level"
                     + (", and the adaptive clip's count of unclipped clients"
                        if "dp_adaptive_quantile" in hp else ""),
          "not_covered": not_covered(algorithm),
          **{k[3:]: hp[k] for k in ("dp_adaptive_quantile", "dp_clip_lr",
                                    "dp_clip_count_stddev", "dp_update_noise_multiplier")
             if k in hp}}
