"""Who shows up and who lies: attacks and participation as array operations over
the client axis, inside the jitted round.

* :class:`Attack` — a fixed set of malicious pool clients, ``floor(fraction · N)`` of
  them, drawn from the run's key (so reproducible per seed), send a manipulated update:
  ``sign_flip`` (``−Δ``), ``scale`` (``λΔ``, model replacement; Bagdasaryan et al. 2020),
  ``gaussian`` (``N(0, σ²)`` in place of ``Δ``; Blanchard et al. 2017), ``alie`` (``μ −
  zσ`` coordinate-wise over the round's updates; Baruch et al. 2019, "A Little Is
  Enough"), ``ipm`` (``−ε · mean of the honest updates``; Xie et al. 2020), or train on
  flipped labels ``K−1−y`` (``label_flip``, data poisoning). The update attacks act on
  the stacked ``[C, ...]`` pseudo-gradients before aggregation (``apply_attack``), so
  every attack runs on the engine's gather path.
* :class:`Participation` — ``availability`` (each pool client is online with probability
  ``P`` when the cohort is drawn; the cohort comes from the online clients, fewer if too
  few are online), ``dropout`` (a selected client never returns with probability ``P``:
  the server aggregates the others), ``stragglers`` (a selected client is a straggler
  with probability ``F`` and runs ``Uniform{1, …, K−1}`` of its ``K`` local steps; FedProx
  §5.2 systems heterogeneity; ``straggler_mode='drop'`` discards stragglers as FedAvg
  does, ``'keep'`` aggregates their partial work as FedProx does).

An absent client (offline, dropped out, a dropped straggler) becomes an empty slot of the
cohort (pool index ``N``, weight 0, its state not written back), the mechanism of Poisson
sampling. With every setting at its default the round is the plain one, bit for bit.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from jax.scipy.special import ndtri

from fedjax_inv.core.aggregator import flatten_clients

ATTACKS = ("sign_flip", "scale", "gaussian", "label_flip", "alie", "ipm")
STRAGGLER_MODES = ("keep", "drop")


def _fraction(name: str, v, hi_open: bool = True) -> float:
  if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
      not (0.0 <= v < 1.0 if hi_open else 0.0 < v <= 1.0):
    rng = "[0, 1)" if hi_open else "(0, 1]"
    raise ValueError(f"--{name.replace('_', '-')} {v!r}: use a fraction in {rng}.")
  return float(v)


@dataclasses.dataclass(frozen=True)
class Attack:
  """An attack (module docstring). ``fraction`` of the pool in [0, 1); ``scale`` λ of
  ``scale`` (default: the cohort size, model replacement's ``n/η`` with ``η = 1``);
  ``sigma`` of ``gaussian``; ``eps`` of ``ipm`` (Xie et al.: 0.1); ``num_classes`` of
  ``label_flip`` (set from the task). Raises ValueError (``check``) for an unknown name
  or a bad value."""
  name: str
  fraction: float
  scale: float | None = None
  sigma: float = 1.0
  eps: float = 0.1
  num_classes: int = 0

  def check(self) -> "Attack":
    if self.name not in ATTACKS:
      raise ValueError(f"--attack {self.name!r}: unknown attack; choose one of {ATTACKS}.")
    _fraction("attack_fraction", self.fraction)
    for nm in ("sigma", "eps"):
      v = getattr(self, nm)
      if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise ValueError(f"attack {nm}={v!r}; it must be > 0.")
    if self.scale is not None and not (math.isfinite(self.scale) and self.scale != 0):
      raise ValueError(f"attack scale={self.scale!r}; use a finite nonzero factor.")
    return self


@dataclasses.dataclass(frozen=True)
class Participation:
  """Availability, dropout and stragglers (module docstring); the defaults change
  nothing. Raises ValueError (``check``) for a fraction outside its range or an unknown
  ``straggler_mode``."""
  availability: float = 1.0
  dropout: float = 0.0
  stragglers: float = 0.0
  straggler_mode: str = "keep"

  def check(self) -> "Participation":
    _fraction("availability", self.availability, hi_open=False)
    _fraction("dropout", self.dropout)
    _fraction("stragglers", self.stragglers)
    if self.straggler_mode not in STRAGGLER_MODES:
      raise ValueError(f"--straggler-mode {self.straggler_mode!r}; choose one of "
                       f"{STRAGGLER_MODES}.")
    return self

  @property
  def masks_slots(self) -> bool:
    """Whether some selected slots can be empty (offline, dropped, dropped stragglers)."""
    return (self.availability < 1.0 or self.dropout > 0.0
            or (self.stragglers > 0.0 and self.straggler_mode == "drop"))


def attackers(key, num_clients: int, fraction: float) -> jax.Array:
  """``[N]`` bool: the run's ``floor(fraction · N)`` malicious pool clients, the first of
  a permutation drawn from the run's key (the same in every round)."""
  m = int(math.floor(fraction * num_clients))
  perm = jax.random.permutation(jax.random.fold_in(key, 0xA77AC), num_clients)
  return jnp.zeros(num_clients, bool).at[perm[:m]].set(True)


def available_sample(key, num_clients: int, cohort: int, availability: float) -> jax.Array:
  """``[C]`` int32: ``C`` clients uniformly without replacement from the online ones
  (each online with probability ``availability``); slots beyond the online count are
  ``N`` (empty)."""
  k_on, k_pick = jax.random.split(jax.random.fold_in(key, 0xA7A1))
  online = jax.random.uniform(k_on, (num_clients,)) < availability
  u = jnp.where(online, jax.random.uniform(k_pick, (num_clients,)), 2.0)
  order = jnp.argsort(u)[:cohort]
  return jnp.where(u[order] < 2.0, order, num_clients).astype(jnp.int32)


def straggler_steps(key, steps, fraction: float):
  """``(is_straggler, steps')`` for one client from its key: a straggler (probability
  ``fraction``) runs ``Uniform{1, …, steps−1}`` of its ``steps`` (1 when ``steps == 1``);
  the others run all of them."""
  k1, k2 = jax.random.split(jax.random.fold_in(key, 0x57A6))
  slow = jax.random.uniform(k1) < fraction
  fewer = jax.random.randint(k2, (), 1, jnp.maximum(steps, 2))
  return slow, jnp.where(slow, fewer, steps).astype(jnp.int32)


def flip_labels(y, num_classes: int):
  """Label flipping: ``y → K−1−y`` (binary: ``1−y``)."""
  return (max(num_classes, 2) - 1 - y).astype(y.dtype)


def alie_z(n, f):
  """Baruch et al. 2019, §3: ``s = floor(n/2 + 1) − f``, ``z = Φ^{-1}((n − s) / n)``."""
  n = jnp.maximum(n.astype(jnp.float32), 1.0)
  s = jnp.floor(n / 2 + 1) - f.astype(jnp.float32)
  return ndtri(jnp.clip((n - s) / n, 1e-6, 1 - 1e-6))


def apply_attack(attack: Attack, messages, present, bad, key, cohort: int):
  """The malicious clients' updates replaced, on the stacked ``[C, ...]`` pseudo-gradients
  (``present`` / ``bad``: ``[C]`` bool). ALIE's mean and std, and IPM's honest mean, are
  over the present clients' honest updates (every present client computes one; the
  attackers' too, as in Baruch et al.)."""
  name = attack.name
  bad = bad & present
  if name == "label_flip":
    return messages
  x, unflatten = flatten_clients(messages)
  b = bad[:, None]
  if name == "sign_flip":
    y = jnp.where(b, -x, x)
  elif name == "scale":
    lam = float(cohort) if attack.scale is None else attack.scale
    y = jnp.where(b, lam * x, x)
  elif name == "gaussian":
    noise = attack.sigma * jax.random.normal(jax.random.fold_in(key, 0x6A55), x.shape)
    y = jnp.where(b, noise, x)
  else:
    p = present[:, None].astype(x.dtype)
    honest = (present & ~bad)[:, None].astype(x.dtype)
    if name == "alie":
      k = jnp.maximum(jnp.sum(p), 1.0)
      mu = jnp.sum(p * x, 0) / k
      sd = jnp.sqrt(jnp.sum(p * (x - mu) ** 2, 0) / k)
      z = alie_z(jnp.sum(present), jnp.sum(bad))
      y = jnp.where(b, mu - z * sd, x)
    else:  # ipm
      mean = jnp.sum(honest * x, 0) / jnp.maximum(jnp.sum(honest), 1.0)
      y = jnp.where(b, -attack.eps * mean, x)
  return unflatten(y)
