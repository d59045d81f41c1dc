"""Robust aggregation: aggregators that need every client's update at once.

The engine's aggregators are monoids (``core/aggregator.py``: summable statistics). A
coordinate-wise median, Krum or a geometric median is not: it needs the whole ``[C, ...]``
stack. These aggregators are **gathered** (``Aggregator.gather = True``): their ``lift``
is the identity ``(message, weight)``, the engine stacks the lifted values over the
client axis instead of summing them (every strategy: ``vmap`` returns them stacked, a
``chunked`` scan and a ``scan`` over clients emit them as the scan's stacked outputs), and
``finalize((messages [C, ...], weights [C]), key=...)`` reduces the stack. A client of
weight 0 (an empty Poisson slot, a dropped-out client) is absent: robust statistics are
taken over the present clients only. The stack costs ``C`` copies of the message; the
memory estimate counts it (``core/memory.py``).

Every aggregator works on the flattened update ``x_i`` (all parameters of client ``i`` in
one vector, ``[C, D]``) where the rule is defined on vectors (Krum, the geometric median,
centered clipping) and coordinate by coordinate otherwise (median, trimmed mean). Present
clients count equally (Byzantine-robust rules are unweighted) except in the geometric
median, whose weights are the clients' weights as in RFA.

Sources: Yin et al. 2018 (coordinate-wise median, trimmed mean); Blanchard et al. 2017
(Krum, Multi-Krum); Pillutla, Kakade & Harchaoui 2022 (RFA: smoothed Weiszfeld);
Karimireddy, He & Jaggi 2021 (centered clipping); Karimireddy, He & Jaggi 2022
(bucketing).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_inv.core.aggregator import Aggregator, flatten_clients as flatten

ROBUST = ("median", "trimmed_mean", "krum", "multi_krum", "geomed", "centered_clip")


def _gathered(rule, name: str, needs_key: bool = False) -> Aggregator:
  """A gathered aggregator from ``rule(x [C, D], present [C] bool, w [C], key) -> [D]``."""
  def lift(message, weight):
    return message, weight

  def finalize(stacked, key=None):
    messages, w = stacked
    x, unflatten = flatten(messages)
    present = w > 0
    out = rule(x, present, w, key)
    anyone = jnp.any(present)
    return unflatten(jnp.where(anyone, out, jnp.zeros_like(out)))
  finalize.needs_key = needs_key
  return Aggregator(lift, finalize, name, gather=True)


def _sorted_present(x, present):
  """Each coordinate's values sorted with the absent clients (``+inf``) last, and the
  number ``k`` of present clients."""
  return (jnp.sort(jnp.where(present[:, None], x, jnp.inf), axis=0),
          jnp.sum(present.astype(jnp.int32)))


def median() -> Aggregator:
  """Coordinate-wise median over the present clients (the mean of the two middle values
  for an even count, as ``numpy.median``). Yin et al. 2018, Alg. 1 (option I)."""
  def rule(x, present, w, key):
    s, k = _sorted_present(x, present)
    lo, hi = jnp.maximum((k - 1) // 2, 0), jnp.maximum(k // 2, 0)
    return 0.5 * (s[lo] + s[hi])
  return _gathered(rule, "median")


def trimmed_mean(beta: float = 0.1) -> Aggregator:
  """Coordinate-wise β-trimmed mean: per coordinate drop the ``floor(β k)`` smallest and
  largest of the ``k`` present values, average the rest (``scipy.stats.trim_mean(x, β)``).
  Yin et al. 2018, Alg. 1 (option II). Raises ValueError for β outside [0, 0.5)."""
  if isinstance(beta, bool) or not 0.0 <= float(beta) < 0.5:
    raise ValueError(f"trimmed_mean beta={beta!r}; use a fraction in [0, 0.5) trimmed "
                     "from each end (0.1 = drop the lowest and highest 10%).")
  beta = float(beta)

  def rule(x, present, w, key):
    s, k = _sorted_present(x, present)
    cut = jnp.floor(beta * k.astype(jnp.float32)).astype(jnp.int32)
    j = jnp.arange(x.shape[0])[:, None]
    keep = (j >= cut) & (j < k - cut)
    total = jnp.sum(jnp.where(keep, s, 0.0), axis=0)
    return total / jnp.maximum(k - 2 * cut, 1).astype(jnp.float32)
  return _gathered(rule, f"trimmed_mean({beta:g})")


def krum_scores(x, present, f: int):
  """``[C]`` Krum scores: for each present client the sum of squared distances to its
  ``max(k - f - 2, 1)`` nearest other present clients (``+inf`` for absent ones; 0 for a
  client alone in the round, which has no other). Blanchard et al. 2017, §4."""
  sq = jnp.sum(x * x, axis=1)
  d2 = jnp.maximum(sq[:, None] + sq[None, :] - 2.0 * x @ x.T, 0.0)
  c = x.shape[0]
  pair = present[:, None] & present[None, :] & ~jnp.eye(c, dtype=bool)
  d2 = jnp.sort(jnp.where(pair, d2, jnp.inf), axis=1)
  k = jnp.sum(present.astype(jnp.int32))
  near = jnp.minimum(jnp.maximum(k - f - 2, 1), k - 1)  # k = 1: no other client
  score = jnp.sum(jnp.where(jnp.arange(c)[None, :] < near, d2, 0.0), axis=1)
  return jnp.where(present, score, jnp.inf)


def krum(f: int = 1, m: int = 1) -> Aggregator:
  """(Multi-)Krum: the mean of the ``m`` present updates with the lowest Krum scores
  (:func:`krum_scores`; ``m = 1`` is Krum, which returns one client's update). ``f``:
  the number of Byzantine clients tolerated; the cohort must exceed ``2f + 2`` (checked
  against ``C`` by :func:`check_cohort`). Blanchard et al. 2017, §4 (Krum) and §5
  (Multi-Krum). Raises ValueError for ``f < 0`` or ``m < 1``."""
  for nm, v, lo in (("f", f, 0), ("m", m, 1)):
    if isinstance(v, bool) or int(v) != v or v < lo:
      raise ValueError(f"krum {nm}={v!r}; use an integer >= {lo}.")
  f, m = int(f), int(m)

  def rule(x, present, w, key):
    score = krum_scores(x, present, f)
    order = jnp.argsort(score)
    k = jnp.sum(present.astype(jnp.int32))
    take = jnp.minimum(m, jnp.maximum(k, 1))
    sel = jnp.zeros(x.shape[0], bool).at[order].set(jnp.arange(x.shape[0]) < take)
    sel = sel & present
    return jnp.sum(jnp.where(sel[:, None], x, 0.0), axis=0) / jnp.maximum(
        jnp.sum(sel), 1).astype(jnp.float32)
  agg = _gathered(rule, f"krum(f={f})" if m == 1 else f"multi_krum(f={f},m={m})")
  agg.finalize.krum_f = f
  return agg


def geometric_median(iters: int = 8, nu: float = 1e-6) -> Aggregator:
  """Weighted geometric median by the smoothed Weiszfeld iteration of RFA: from the
  weighted mean, ``iters`` times ``β_i = α_i / max(ν, ||z − x_i||)``, ``z = Σ β_i x_i /
  Σ β_i`` (``α`` = the clients' weights, absent clients 0). Pillutla et al. 2022, Alg. 3.
  Raises ValueError for ``iters < 1`` or ``ν <= 0``."""
  if isinstance(iters, bool) or int(iters) != iters or iters < 1:
    raise ValueError(f"geomed iters={iters!r}; use an integer >= 1 (RFA uses 3-8).")
  if not float(nu) > 0:
    raise ValueError(f"geomed nu={nu!r}; the smoothing must be > 0 (RFA: 1e-6).")

  def rule(x, present, w, key):
    x = jnp.where(present[:, None], x, 0.0)  # an absent client's update may hold inf/NaN
    a = jnp.where(present, w, 0.0).astype(jnp.float32)
    z = (a @ x) / jnp.maximum(jnp.sum(a), 1e-30)

    def step(_, z):
      d = jnp.maximum(jnp.sqrt(jnp.sum((x - z) ** 2, axis=1)), nu)
      b = a / d
      return (b @ x) / jnp.maximum(jnp.sum(b), 1e-30)
    return jax.lax.fori_loop(0, int(iters), step, z)
  return _gathered(rule, "geomed")


def centered_clip(tau: float = 1.0, iters: int = 1) -> Aggregator:
  """Centered clipping: from ``v = 0``, ``iters`` times ``v ← v + (1/k) Σ_present (x_i −
  v) min(1, τ / ||x_i − v||)``. Karimireddy, He & Jaggi 2021, eq. (CC); they start from
  the previous round's aggregate (server momentum), which this stateless aggregator does
  not keep: it starts from 0 (with ``iters > 1`` the iteration moves the center itself).
  Raises ValueError for ``τ <= 0`` or ``iters < 1``."""
  if not float(tau) > 0 or not math.isfinite(float(tau)):
    raise ValueError(f"centered_clip tau={tau!r}; the clipping radius must be > 0.")
  if isinstance(iters, bool) or int(iters) != iters or iters < 1:
    raise ValueError(f"centered_clip iters={iters!r}; use an integer >= 1.")
  tau = float(tau)

  def rule(x, present, w, key):
    k = jnp.maximum(jnp.sum(present), 1).astype(jnp.float32)

    def step(_, v):
      diff = x - v
      norm = jnp.sqrt(jnp.sum(diff * diff, axis=1))
      scale = jnp.minimum(1.0, tau / jnp.maximum(norm, 1e-30))
      return v + jnp.sum(jnp.where(present[:, None], diff * scale[:, None], 0.0), 0) / k
    return jax.lax.fori_loop(0, int(iters), step, jnp.zeros(x.shape[1], x.dtype))
  return _gathered(rule, f"centered_clip({tau:g})")


def bucketing(inner: Aggregator, s: int) -> Aggregator:
  """Bucketing around a gathered aggregator: the present clients are put in a random
  order (the round's server key), split into buckets of ``s`` consecutive clients, and
  each bucket's mean goes to ``inner`` (buckets with no present client are absent).
  Karimireddy, He & Jaggi 2022, Alg. 1. Raises ValueError for ``s < 1`` or an ``inner``
  that is not gathered."""
  if isinstance(s, bool) or int(s) != s or s < 1:
    raise ValueError(f"bucketing s={s!r}; use a bucket size >= 1 (1 = no bucketing).")
  if not getattr(inner, "gather", False):
    raise ValueError(f"bucketing wraps a robust (gathered) aggregator; {inner.name!r} is "
                     f"not one. Choose one of {ROBUST}.")
  s = int(s)

  def finalize(stacked, key=None):
    messages, w = stacked
    c = w.shape[0]
    present = w > 0
    key = jax.random.key(0) if key is None else key
    u = jax.random.uniform(jax.random.fold_in(key, 0xB0C), (c,))
    order = jnp.argsort(jnp.where(present, u, 2.0))  # present clients first, shuffled
    nb = -(-c // s)
    pad = nb * s - c

    def group(a):
      a = jnp.take(a, order, axis=0)
      a = jnp.concatenate([a, jnp.zeros((pad,) + a.shape[1:], a.dtype)])
      return a.reshape((nb, s) + a.shape[1:])
    pw = group(present.astype(jnp.float32))
    cnt = jnp.sum(pw, axis=1)

    def mean(a):
      g = group(a)
      m = pw.reshape(pw.shape + (1,) * (g.ndim - 2))
      return jnp.sum(jnp.where(m > 0, g, 0.0) * m, axis=1) / jnp.maximum(
          cnt.reshape((nb,) + (1,) * (g.ndim - 2)), 1.0)
    kw = {"key": key} if getattr(inner.finalize, "needs_key", False) else {}
    return inner.finalize((jax.tree.map(mean, messages), cnt), **kw)
  finalize.needs_key = True
  finalize.bucket = s
  finalize.inner = inner
  return Aggregator(inner.lift, finalize, f"bucketing({s})+{inner.name}", gather=True)


def check_cohort(aggregator: Aggregator, cohort: int) -> None:
  """Before any compile: Krum needs ``C > 2f + 2`` clients (Blanchard et al. 2017,
  Prop. 1). Raises ValueError naming the numbers and the fix."""
  fin, inputs, what = aggregator.finalize, int(cohort), "clients per round"
  if getattr(fin, "bucket", None):  # Krum over the buckets' means
    inputs, what = -(-inputs // fin.bucket), f"buckets (of {fin.bucket} clients)"
    fin = fin.inner.finalize
  f = getattr(fin, "krum_f", None)
  if f is not None and inputs <= 2 * f + 2:
    raise ValueError(f"aggregator {aggregator.name}: Krum tolerating f={f} needs more than "
                     f"2f+2 = {2 * f + 2} inputs, got {inputs} {what}; lower f or raise "
                     "--clients-per-round.")


_ARGS = {"median": {}, "trimmed_mean": {"beta": float}, "krum": {"f": int},
         "multi_krum": {"f": int, "m": int}, "geomed": {"iters": int, "nu": float},
         "centered_clip": {"tau": float, "iters": int}}


def parse(spec: str) -> Aggregator:
  """A robust aggregator from ``NAME`` or ``NAME:k=v,...`` (``--aggregator``): ``median``,
  ``trimmed_mean:beta=0.1``, ``krum:f=1``, ``multi_krum:f=1,m=5``,
  ``geomed:iters=8,nu=1e-6``, ``centered_clip:tau=1,iters=1``. Raises ValueError naming
  an unknown name or argument, or a bad value."""
  name, _, args = str(spec).partition(":")
  if name not in _ARGS:
    raise ValueError(f"--aggregator {spec!r}: unknown robust aggregator {name!r}; choose "
                     f"one of {ROBUST}.")
  kw = {}
  for item in filter(None, (a.strip() for a in args.split(","))):
    k, eq, v = item.partition("=")
    if not eq or k not in _ARGS[name]:
      raise ValueError(f"--aggregator {spec!r}: {name} takes {sorted(_ARGS[name]) or 'no'} "
                       f"argument(s) as NAME=VALUE, got {item!r}.")
    typ = _ARGS[name][k]
    try:
      num = float(v)
    except ValueError:
      raise ValueError(f"--aggregator {spec!r}: {k}={v!r} is not a number.") from None
    if typ is int and not num.is_integer():
      raise ValueError(f"--aggregator {spec!r}: {k}={v!r} must be an integer.")
    kw[k] = int(num) if typ is int else num
  if name == "median":
    return median()
  if name == "trimmed_mean":
    return trimmed_mean(**kw)
  if name in ("krum", "multi_krum"):
    return krum(kw.get("f", 1), kw.get("m", 1) if name == "krum" else kw.get("m", 2))
  if name == "geomed":
    return geometric_median(**kw)
  return centered_clip(**kw)


def fednova(local_steps: int) -> Aggregator:
  """FedNova's normalized averaging (Wang et al. 2020, §4, eq. 6, vanilla local SGD:
  ``a_i = τ_i``): ``d = Σ p_i Δ_i / τ_i``, pseudo-gradient ``τ_eff · d`` with ``τ_eff =
  Σ p_i τ_i`` and ``p_i = w_i / Σ w`` over the cohort. ``τ_i`` is the client's own step
  count (``ctx.local_steps``: local epochs, stragglers) or ``local_steps``. With equal
  ``τ_i`` it is the weighted mean (FedAvg). A summable aggregator: every strategy."""
  def lift(message, weight, ctx=None):
    tau = jnp.float32(local_steps) if ctx is None or ctx.local_steps is None else \
        ctx.local_steps.astype(jnp.float32)
    present = weight > 0
    scaled = jax.tree.map(lambda m: jnp.where(present, weight * m / tau, 0.0), message)
    return scaled, weight, jnp.where(present, weight * tau, 0.0)
  lift.reads_context = True

  def finalize(stats):
    d, wsum, tw = stats
    safe = jnp.where(wsum > 0, wsum, 1.0)
    tau_eff = tw / safe
    return jax.tree.map(lambda v: jnp.where(wsum > 0, v / safe * tau_eff, 0.0), d)
  return Aggregator(lift, finalize, "fednova")


def configure(algorithm, *, attack=None, participation=None, bucket: int | None = None,
              cohort: int, num_classes: int = 0, kind: str = "multiclass"):
  """``algorithm`` with an attack, participation and bucketing (``--attack`` …), checked
  before any compile.

  Args:
    attack: a ``core.adversary.Attack`` or None.
    participation: a ``core.adversary.Participation`` or None (or one at its defaults).
    bucket: bucket size ``s`` of :func:`bucketing` around the (robust) aggregator.
    cohort: clients per round (Krum's ``C > 2f + 2``; the scaling attack's default λ).
    num_classes: the task's number of classes (label flipping maps y to K-1-y).
    kind: the task's loss kind (label flipping needs a classification task).

  Raises:
    ValueError: a bad attack / participation value, Krum with too few clients,
      bucketing around a non-robust aggregator, label flipping on a regression task, an
      attack with client-level DP (whose clipped mean reads each client's context).
  """
  from fedjax_inv.core.aggregator import reads_context
  hp, agg = dict(algorithm.hparams), algorithm.aggregator
  if bucket is not None and int(bucket) != 1:
    agg = bucketing(agg, bucket)
    hp["bucketing"] = int(bucket)
  check_cohort(agg, cohort)
  if attack is not None:
    attack = attack.check()
    if attack.name == "label_flip" and kind == "regression":
      raise ValueError("--attack label_flip needs a classification task; this one is "
                       "regression.")
    if attack.name != "label_flip" and reads_context(agg):
      raise ValueError(f"--attack {attack.name} with aggregator {agg.name!r}: an update "
                       "attack rewrites the stacked updates, which this aggregator (e.g. "
                       "DP's clipped mean) lifts with each client's context; run the "
                       "attack without --dp-*.")
    import dataclasses
    attack = dataclasses.replace(attack, num_classes=int(num_classes))
    hp.update(attack=attack.name, attack_fraction=attack.fraction)
  if participation is not None:
    participation = participation.check()
    if participation == type(participation)():
      participation = None
    else:
      hp.update(availability=participation.availability, dropout=participation.dropout,
                stragglers=participation.stragglers,
                straggler_mode=participation.straggler_mode)
  return algorithm.replace(aggregator=agg, attack=attack, participation=participation,
                           hparams=hp)
