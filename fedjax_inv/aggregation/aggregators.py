"""Client-axis aggregators: pure array functions and their associative (monoid) forms.

Every aggregator the engine uses is an ``Aggregator(lift, finalize)``: ``lift`` maps one
client's message and weight to a pytree of *summable* statistics; the engine adds those
statistics over clients (in any order and grouping: all at once under ``vmap``, one client
at a time under ``scan``, chunk by chunk, or across devices), and ``finalize`` turns the
sums into the aggregate. Because the only combine step is ``+``, every execution strategy
gives the same numbers up to float32 summation order (docs/ARCHITECTURE.md, 'A round is a
map-reduce over a client axis').

Absent clients (weight 0) and masked examples (mask 0) are dropped with ``where``, never
by multiplying by 0: their messages are replaced by a finite constant before any
non-linear op (sign, log) and their statistics dropped after it, so an absent client
whose update holds inf or NaN has no influence on the aggregate nor on its gradient.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedjax_inv.core.algorithm import hparam
# The protocol and the weighted mean are the engine's (core/aggregator.py); re-exported.
from fedjax_inv.core.aggregator import Aggregator, weighted_mean  # noqa: F401

PyTree = Any


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

_ZEROS_CONVENTIONS = ("both", "negative")


def _check_zeros(zeros: str) -> str:
  if zeros not in _ZEROS_CONVENTIONS:
    raise ValueError(
        f"zeros must be one of {_ZEROS_CONVENTIONS}, got {zeros!r}.")
  return zeros


def check_tau(tau):
  """The sign-agreement threshold as a float, after checking it is a number in [0, 1];
  a traced value (a jit argument) cannot be checked and is returned as it is.

  Raises:
    ValueError: a bool, a non-number, NaN or a value outside [0, 1] (names the value and
      what 0 and 1 mean).
  """
  if isinstance(tau, bool):
    raise ValueError(f"tau={tau!r}; pass a number in [0, 1].")
  try:
    t = float(tau)
  except jax.errors.ConcretizationTypeError:
    return tau  # tau is traced (e.g. a jit argument): cannot be checked here.
  except (TypeError, ValueError) as e:
    raise ValueError(f"tau={tau!r}; the sign-agreement threshold must be a number in "
                     "[0, 1].") from e
  if not 0.0 <= t <= 1.0:  # also rejects NaN
    raise ValueError(f"tau={tau!r}; the sign-agreement threshold must be in [0, 1] "
                     "(0: plain averaging, 1: only unanimous coordinates unmasked).")
  return t


def _present(x: jax.Array, present: jax.Array) -> jax.Array:
  """``x`` where ``present`` (bool, broadcast against ``x``'s leading axes) else 0."""
  present = present.reshape(present.shape + (1,) * (x.ndim - present.ndim))
  return jnp.where(present, x, jnp.zeros_like(x))


def _float_dtypes(x: jax.Array):
  """(compute dtype, output dtype) for a leaf: compute in >= float32, return x's float dtype."""
  out = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
  return jnp.promote_types(out, jnp.float32), out


def _normalize_axis(x: jax.Array, axis: int) -> int:
  if not isinstance(axis, int):
    raise ValueError(f"axis must be a Python int, got {axis!r}.")
  if x.ndim == 0:
    raise ValueError(
        "every leaf needs a client axis, got a scalar (0-d) leaf; "
        f"axis={axis} is out of range.")
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(
        f"axis={axis} is out of range for a leaf of shape {tuple(x.shape)}.")
  return axis % x.ndim


def _num_clients_check(x: jax.Array, axis: int) -> None:
  if x.shape[axis] == 0:
    raise ValueError(
        f"the client axis (axis={axis}) of a leaf of shape {tuple(x.shape)} is empty.")


# ---------------------------------------------------------------------------------------
# Weighted geometric mean (FedILC §3.1)
# ---------------------------------------------------------------------------------------


class _GeoStats(NamedTuple):
  """Per-leaf summable statistics of the weighted geometric mean (one client's share)."""
  n_pos: jax.Array      # |E+| contribution: 1 where the entry is in E+.
  n_neg: jax.Array      # |E-| contribution: 1 where the entry is in E-.
  log_pos: jax.Array    # log|g| where the entry is in E+ and nonzero, else 0.
  log_neg: jax.Array    # log|g| where the entry is in E- and nonzero, else 0.
  zero_pos: jax.Array   # 1 where the entry is an exact zero counted in E+.
  zero_neg: jax.Array   # 1 where the entry is an exact zero counted in E-.


def _geo_stats(g: jax.Array, zeros: str, dtype) -> _GeoStats:
  """Elementwise (un-summed) statistics of ``g``, in ``dtype``."""
  g = g.astype(dtype)
  is_zero = g == 0  # also true for -0.0
  if zeros == "both":  # paper: E+ = {g >= 0}, E- = {g <= 0}
    pos, neg = g >= 0, g <= 0
  else:  # "negative", FedILC public code: E+ = {g > 0}, E- = {g <= 0}
    pos, neg = g > 0, g <= 0
  # Safe log: log(1) = 0 for zeros, so no -inf ever enters a sum (and no -inf * 0).
  log_abs = jnp.log(jnp.where(is_zero, jnp.ones_like(g), jnp.abs(g)))
  zero = jnp.zeros_like(g)
  def f(b):
    return b.astype(dtype)
  return _GeoStats(
      n_pos=f(pos), n_neg=f(neg),
      log_pos=jnp.where(pos, log_abs, zero), log_neg=jnp.where(neg, log_abs, zero),
      zero_pos=f(pos & is_zero), zero_neg=f(neg & is_zero))


def _geo_finalize(s: _GeoStats, num_clients: jax.Array) -> jax.Array:
  """Weighted geometric mean from summed statistics (``num_clients`` = |E|)."""
  dtype = s.n_pos.dtype
  big = jnp.finfo(dtype).max
  e = jnp.asarray(num_clients, dtype)
  safe_e = jnp.where(e > 0, e, jnp.ones_like(e))

  def side(n, log_sum, zero_count):
    nonempty = n > 0
    safe_n = jnp.where(nonempty, n, jnp.ones_like(n))
    # mean of log|g| over the set, then exp; <= log(max|g|) so no overflow (clamped
    # anyway against a last-ulp rounding up at the very top of the float range).
    gm = jnp.minimum(jnp.exp(log_sum / safe_n), big)
    # Empty set contributes 0; a zero in the set makes the product (so the mean) 0.
    gm = jnp.where(nonempty & (zero_count == 0), gm, jnp.zeros_like(gm))
    return (n / safe_e) * gm

  return side(s.n_pos, s.log_pos, s.zero_pos) - side(s.n_neg, s.log_neg, s.zero_neg)


def weighted_geometric_mean(updates: PyTree, axis: int = 0, *, zeros: str = "both") -> PyTree:
  """FedILC's weighted geometric mean of client updates, element-wise over the client axis.

  For every coordinate, with ``G = {g_e}`` the values of the ``E`` clients,
  ``E+ = {e : g_e >= 0}`` and ``E- = {e : g_e <= 0}``::

    wgm(G) = |E+|/|E| * (prod_{E+} |g_e|)^(1/|E+|) - |E-|/|E| * (prod_{E-} |g_e|)^(1/|E-|)

  Each geometric mean is computed in log space (``exp(mean_{E±} log|g_e|)``). An empty
  sign set contributes 0. A set that contains an exact zero has product 0, so its term is
  exactly 0 (log(0) is never evaluated: no NaN/Inf for any finite input, including 0,
  tiny and huge magnitudes).

  Zero convention (``zeros``):
    * ``"both"`` (default, the paper's definition): a zero is in BOTH E+ and E- (counted
      in ``|E+|`` and ``|E-|``), so a single zero client makes both terms, hence the
      coordinate, exactly 0.
    * ``"negative"`` (FedILC's public code): a zero is counted only in E- (E+ = {g > 0}),
      so only the negative term becomes 0. The public code also adds 1e-10 inside the log,
      which makes that term ~1e-10 instead of exactly 0; that epsilon is NOT reproduced
      here (the term is exactly 0) and nonzero values are not perturbed.

  Client weights play no role in the paper's formula (every client counts once); see
  ``geometric_mean_aggregator`` for the monoid form.

  Args:
    updates: a pytree of arrays; every leaf has the client axis at ``axis``, e.g.
      ``[E, *param_shape]`` for ``axis=0``. Integer leaves are treated as float32.
    axis: position of the client axis in every leaf.
    zeros: ``"both"`` or ``"negative"`` (see above).

  Returns:
    A pytree of the same structure; each leaf has the client axis removed
    (``param_shape``) and the leaf's floating dtype (float32 for integer input).

  Raises:
    ValueError: ``zeros`` not in {"both", "negative"}; ``axis`` not an int or out of
      range for a leaf (including 0-d leaves); an empty client axis.

  Source: FedILC §3.1 (weighted geometric mean, "weightedgeo(G)").
  """
  _check_zeros(zeros)

  def leaf_fn(x):
    x = jnp.asarray(x)
    ax = _normalize_axis(x, axis)
    _num_clients_check(x, ax)
    return _wgm_leaf(x, ax, zeros)

  return jax.tree.map(leaf_fn, updates)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _wgm_leaf(x: jax.Array, axis: int, zeros: str) -> jax.Array:
  dtype, out_dtype = _float_dtypes(x)
  stats = _geo_stats(x, zeros, dtype)
  summed = _GeoStats(*(jnp.sum(s, axis=axis) for s in stats))
  return _geo_finalize(summed, jnp.asarray(x.shape[axis], dtype)).astype(out_dtype)


def outer_product_geo_stats(a: jax.Array, d: jax.Array, mask: jax.Array,
                            zeros: str = "both") -> "_GeoStats":
  """Summed geometric-mean statistics of per-example outer products, by matmuls.

  For ``g_i = a_i ⊗ d_i`` (a dense layer's per-example kernel gradient: layer input
  ``a_i`` times the gradient w.r.t. its pre-activation ``d_i``), returns the sum over the
  examples with ``mask_i > 0`` of what ``geometric_mean_aggregator(zeros).lift(g_i, 1)``
  gives per leaf — without forming the ``B`` outer products: the sign of ``g_i`` is
  ``sign(a_i) sign(d_i)``, it is zero iff a factor is, and ``log|g_i| = log|a_i| +
  log|d_i|``, so every count and sign-split log sum is a sum of products of masked factors:
  two matmuls, ``[m, 4B] × [4B, 2n]`` and ``[m, 2B] × [2B, 2n]`` (float32,
  ``Precision.HIGHEST``).

  Args:
    a: ``[B, m]``; d: ``[B, n]``; mask: ``[B]`` (> 0 = real example). A masked example
      has no influence on the statistics or their gradient, even with inf/NaN in ``a``
      or ``d`` (its rows are zeroed before the logs and matmuls).
    zeros: the exact-zero convention of ``geometric_mean_aggregator``.

  Returns:
    statistics with ``[m, n]`` leaves; pass them, summed with other clients' or not, to the
    aggregator's ``finalize`` together with the example count ``Σ (mask > 0)``.

  Raises:
    ValueError: ``zeros`` unknown; ``a``/``d``/``mask`` not ``[B, m]``/``[B, n]``/``[B]``.

  Source: FedILC §3.1 (weightedgeo) and §3.3 (Alg. 2, per-example environments); the
  outer-product structure of per-example dense-layer gradients.
  """
  _check_zeros(zeros)
  a, d, mask = jnp.asarray(a), jnp.asarray(d), jnp.asarray(mask)
  if a.ndim != 2 or d.ndim != 2 or mask.shape != (a.shape[0],) or d.shape[0] != a.shape[0]:
    raise ValueError(f"outer_product_geo_stats: a {a.shape}, d {d.shape}, mask "
                     f"{mask.shape}; expected [B, m], [B, n], [B].")
  f32 = jnp.float32
  present = mask > 0
  keep = present.astype(f32)[:, None]
  # Masked examples' rows become 0 (counted nowhere, log|.| = log 1 = 0) before any op.
  a, d = _present(a.astype(f32), present), _present(d.astype(f32), present)
  log_a = jnp.log(jnp.where(a == 0, 1.0, jnp.abs(a)))
  log_d = jnp.log(jnp.where(d == 0, 1.0, jnp.abs(d)))
  pa, na = (a > 0) * keep, (a < 0) * keep
  pd, nd = (d > 0).astype(f32), (d < 0).astype(f32)
  hi = jax.lax.Precision.HIGHEST
  cat = lambda *xs: jnp.concatenate(xs, axis=0)  # noqa: E731  (stacks along examples)
  # log sums: Σ_b [a>0]log|a|[d>0] + [a>0][d>0]log|d| + (the same for a<0, d<0) → pos;
  # the mixed-sign pairs → neg. One [m, 4B] × [4B, 2n] matmul gives both.
  lhs = cat(pa * log_a, pa, na * log_a, na)                            # [4B, m]
  rhs = jnp.concatenate([cat(pd, pd * log_d, nd, nd * log_d),
                         cat(nd, nd * log_d, pd, pd * log_d)], axis=1)  # [4B, 2n]
  logs = jnp.matmul(lhs.T, rhs, precision=hi)
  counts = jnp.matmul(cat(pa, na).T, jnp.concatenate([cat(pd, nd), cat(nd, pd)], axis=1),
                      precision=hi)                                    # [m, 2n]
  n = d.shape[1]
  log_pos, log_neg = logs[:, :n], logs[:, n:]
  strict_pos, strict_neg = counts[:, :n], counts[:, n:]   # same / opposite signs
  n_zero = jnp.sum(keep) - strict_pos - strict_neg
  if zeros == "both":
    return _GeoStats(n_pos=strict_pos + n_zero, n_neg=strict_neg + n_zero,
                     log_pos=log_pos, log_neg=log_neg, zero_pos=n_zero, zero_neg=n_zero)
  return _GeoStats(n_pos=strict_pos, n_neg=strict_neg + n_zero, log_pos=log_pos,
                   log_neg=log_neg, zero_pos=jnp.zeros_like(n_zero), zero_neg=n_zero)


def summed_geo_stats(g: jax.Array, mask: jax.Array, zeros: str = "both") -> "_GeoStats":
  """``Σ_i`` over the rows ``g[i]`` with ``mask_i > 0`` of the lifted statistics of
  ``geometric_mean_aggregator(zeros)`` (``g [B, ...]``, ``mask [B]`` → leaves ``[...]``).

  A masked row has no influence on the statistics or their gradient, even when it holds
  inf/NaN (zeroed before the log, its statistics dropped with ``where``).

  Raises:
    ValueError: ``zeros`` unknown.

  Source: FedILC §3.1.
  """
  _check_zeros(zeros)
  g = jnp.asarray(g, jnp.float32)
  present = jnp.asarray(mask) > 0
  stats = _geo_stats(_present(g, present), zeros, jnp.float32)
  return _GeoStats(*(jnp.sum(_present(s, present), axis=0) for s in stats))


def geometric_mean_aggregator(zeros: str = "both") -> Aggregator:
  """Monoid form of ``weighted_geometric_mean`` (FedILC §3.1) for the engine.

  ``lift(message, weight)`` returns, per leaf, the elementwise statistics
  ``(n_pos, n_neg, log_pos, log_neg, zero_pos, zero_neg)`` (the set-membership counts,
  ``log|g|`` summed within each sign set with zeros masked out, and the number of exact
  zeros in each set) plus a scalar client count ``|E|``; all of them add over clients.
  ``finalize`` turns the sums into exactly ``weighted_geometric_mean`` of the stacked
  messages (up to float32 summation order).

  Weights: the paper's formula is unweighted, so the value of ``weight`` is ignored,
  except that a client with ``weight == 0`` (e.g. a padded, absent client) contributes
  nothing at all (all its statistics, including its count in ``|E|``, are zeroed), to the
  value or to the gradient, even when its message holds inf or NaN.

  Shapes: any message pytree (no client axis); the aggregate has the message's structure
  and shapes. If no client is present, the aggregate is 0.

  Raises:
    ValueError: ``zeros`` not in {"both", "negative"}.

  Source: FedILC §3.1.
  """
  _check_zeros(zeros)

  def lift(message, weight):
    present = jnp.asarray(weight) > 0

    def leaf_fn(m):
      m = jnp.asarray(m)
      dtype, _ = _float_dtypes(m)
      # Double where: zeroed before the log, statistics dropped after it.
      stats = _geo_stats(_present(m, present), zeros, dtype)
      return _GeoStats(*(_present(s, present) for s in stats))

    return (jax.tree.map(leaf_fn, message), present.astype(jnp.float32))

  def finalize(stats):
    per_leaf, count = stats
    return jax.tree.map(
        lambda s: _geo_finalize(s, count), per_leaf,
        is_leaf=lambda x: isinstance(x, _GeoStats))

  return Aggregator(lift, finalize, f"geometric[{zeros}]")


# ---------------------------------------------------------------------------------------
# Sign-agreement masks (AND-mask, Parascandolo et al. 2021; FedGMA §4)
# ---------------------------------------------------------------------------------------


MASK_RULES = ("gma", "and_mask")


class MaskedPseudoGradient(NamedTuple):
  """What :func:`masking_aggregator` (``carry_mask=True``) hands to the server: FedGMA
  Alg. 1 masks the server optimizer's step, not its input.

  Attributes:
    pseudo_grad: the base aggregate ``Δ_t`` (e.g. ``Σ n_k Δ_k / Σ n_k``), params pytree.
    mask: the sign-agreement mask, same structure and shapes, values in [0, 1].
  """
  pseudo_grad: PyTree
  mask: PyTree


def agreement_mask(agreement: jax.Array, tau, rule: str = "gma",
                   rescale: bool = False) -> jax.Array:
  """Mask from the agreement score ``A`` (any shape, values in [0, 1]).

  ``rule='gma'``: ``1 if A >= τ else A`` (FedGMA §4, m̃_τ; not ``m·(1 + A)``, an
  operator-precedence bug of a public port). ``rule='and_mask'``: ``1 if A >= τ else 0``
  (AND-mask m_τ). ``rescale`` (AND-mask only, Parascandolo et al. 2021 code): divide by
  ``1e-10 + mean(mask)`` over the array (one parameter tensor).

  Raises:
    ValueError: ``rule`` unknown; ``tau`` outside [0, 1]; ``rescale`` with 'gma'.

  Source: FedGMA §4; Parascandolo et al. 2021 (AND-mask).
  """
  if rule not in MASK_RULES:
    raise ValueError(f"rule={rule!r}; choose one of {MASK_RULES}.")
  tau = check_tau(tau)
  if rescale and rule != "and_mask":
    raise ValueError("rescale=True is defined for the AND-mask only (rule='and_mask').")
  ones = jnp.ones_like(agreement)
  if rule == "gma":
    return jnp.where(agreement >= tau, ones, agreement)
  m = jnp.where(agreement >= tau, ones, jnp.zeros_like(agreement))
  if rescale:
    m = m / (1e-10 + jnp.mean(m))
  return m


def _mask_leaf(x, tau, axis: int, rule: str) -> jax.Array:
  """``agreement_mask(|mean over the client axis of sign(x)|, tau, rule)`` in x's
  floating dtype."""
  x = jnp.asarray(x)
  ax = _normalize_axis(x, axis)
  _num_clients_check(x, ax)
  return _mask_leaf_jit(x, tau, ax, rule)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _mask_leaf_jit(x, tau, axis: int, rule: str) -> jax.Array:
  dtype, out_dtype = _float_dtypes(x)
  a = jnp.abs(jnp.mean(jnp.sign(x.astype(dtype)), axis=axis))
  return agreement_mask(a, tau, rule).astype(out_dtype)


def and_mask(updates: PyTree, tau, axis: int = 0) -> PyTree:
  """AND-mask: 1.0 where the clients' update signs agree at least ``tau``, else 0.0.

  ``A = |mean_k sign(g_k)|`` over the client axis (``sign(0) = 0``, so a zero update
  counts as agreeing with neither direction); ``mask = 1.0 if A >= tau else 0.0``.
  (Parascandolo et al.'s code also rescales the masked gradient by the inverse mask
  density; that rescaling is not part of this function.)

  Args:
    updates: pytree; every leaf ``[E, *param_shape]`` with the client axis at ``axis``.
    tau: agreement threshold in [0, 1] (``tau=0``: all ones; ``tau=1``: ones only where
      all clients have the same nonzero sign).
    axis: position of the client axis in every leaf.

  Returns:
    A pytree of 0/1 masks, each leaf ``param_shape`` (client axis removed), in the leaf's
    floating dtype (float32 for integer input).

  Raises:
    ValueError: ``tau`` outside [0, 1] (checked when concrete); ``axis`` out of range;
      an empty client axis.

  Source: Parascandolo et al. 2021 ("Learning explanations that are hard to vary"),
  AND-mask; as restated in FedGMA §4 and FedILC §2.1.
  """
  check_tau(tau)
  return jax.tree.map(lambda x: _mask_leaf(x, tau, axis, "and_mask"), updates)


def gma_mask(updates: PyTree, tau, axis: int = 0) -> PyTree:
  """FedGMA's soft gradient mask: ``1 if A >= tau else A``, ``A = |mean_k sign(Δ_k)|``.

  The agreement score is taken in absolute value (agreement on *either* direction), as in
  the AND-mask; the paper's printed formula omits the ``|.|``, which would give negative
  masks that flip the update. A public port computes ``mask * (1 + A)`` through an
  operator-precedence bug; this function follows the paper's rule.

  Args:
    updates: pytree; every leaf ``[E, *param_shape]`` with the client axis at ``axis``
      (the client updates Δ_k of one round).
    tau: agreement threshold in [0, 1]; ``tau=0`` gives an all-ones mask (plain
      averaging), ``tau=1`` gives ``A`` except where all clients agree.
    axis: position of the client axis in every leaf.

  Returns:
    A pytree of masks with values in [0, 1], each leaf ``param_shape``, in the leaf's
    floating dtype (float32 for integer input).

  Raises:
    ValueError: ``tau`` outside [0, 1] (checked when concrete); ``axis`` out of range;
      an empty client axis.

  Source: FedGMA §4 (real-valued mask m̃_τ), Alg. 1.
  """
  check_tau(tau)
  return jax.tree.map(lambda x: _mask_leaf(x, tau, axis, "gma"), updates)


def sign_agreement() -> Aggregator:
  """The clients' sign agreement ``A = |Σ_k sign(Δ_k) / C|`` per coordinate, as an
  associative reduction (the one sign statistic behind FedGMA, the AND-mask and
  ``aggregator='gma'|'and_mask'``).

  ``lift(Δ_k, w_k) = (sign(Δ_k), 1)``; a client with ``w_k = 0`` is absent (no sign, no
  count, even when ``Δ_k`` holds inf or NaN), so ``C`` counts the present clients and no
  client weight enters ``A``.
  ``finalize`` returns ``A`` with the message's structure (no client axis), signs summed
  in the message's float dtype (at least float32); ``A = 0`` when no client is present.

  Source: FedGMA §4 (the agreement score); Parascandolo et al. 2021 (AND-mask).
  """
  def lift(message, weight):
    present = jnp.asarray(weight) > 0

    def sign_fn(m):
      m = jnp.asarray(m)
      dtype, _ = _float_dtypes(m)
      return _present(jnp.sign(_present(m.astype(dtype), present)), present)

    return jax.tree.map(sign_fn, message), present.astype(jnp.float32)

  def finalize(stats):
    sign_sum, count = stats
    safe = jnp.where(count > 0, count, jnp.ones_like(count))
    return jax.tree.map(lambda s: jnp.abs(s / safe.astype(s.dtype)), sign_sum)

  return Aggregator(lift, finalize, "sign_agreement")


def masking_aggregator(base: Aggregator, tau, rule: str = "gma", rescale: bool = False,
                       carry_mask: bool = True) -> Aggregator:
  """Sign-agreement masking around any base aggregator, as an associative reduction
  (``aggregator='gma'|'and_mask'``: the mask on the pseudo-gradient).

  ``lift(Δ_k, w_k) = (base.lift(Δ_k, w_k), sign_agreement().lift(Δ_k, w_k))``; the engine
  sums these over clients. ``finalize`` computes the base aggregate ``Δ_t``, ``A`` of
  :func:`sign_agreement` and the mask of :func:`agreement_mask`, and returns
  ``MaskedPseudoGradient(Δ_t, mask)`` (``carry_mask=True``) or ``mask ⊙ Δ_t``
  (``carry_mask=False``). FedGMA's mask on the server step is :func:`mask_step`.

  Shapes: messages are params pytrees without a client axis; the aggregate has their
  structure (inside ``MaskedPseudoGradient`` when carried). An absent client
  (``w_k = 0``) contributes nothing (to the mask, and whatever ``base`` does with weight
  0: nothing for the aggregators here), even when its message holds inf or NaN.

  Raises:
    ValueError: ``base`` not an ``Aggregator``; bad ``tau`` / ``rule`` / ``rescale``.

  Source: FedGMA §4 and Alg. 1; Parascandolo et al. 2021 (AND-mask).
  """
  if not isinstance(base, Aggregator):
    raise ValueError(f"base must be an Aggregator, got {type(base).__name__}.")
  agreement_mask(jnp.zeros(()), tau, rule, rescale)  # validates the arguments
  tau = check_tau(tau)
  signs = sign_agreement()

  def lift(message, weight):
    return base.lift(message, weight), signs.lift(message, weight)

  def finalize(stats, hparams=None):
    base_stats, sign_stats = stats
    agg = base.finalize(base_stats)
    t = tau if not hparams else hparams.get("tau", tau)  # a sweep replica's traced tau
    mask = jax.tree.map(lambda a, g: agreement_mask(a, t, rule, rescale).astype(g.dtype),
                        signs.finalize(sign_stats), agg)
    if carry_mask:
      return MaskedPseudoGradient(agg, mask)
    return jax.tree.map(jnp.multiply, agg, mask)

  finalize.traced = ("tau",)  # a sweep may trace tau (core.aggregator.traced_names)
  return Aggregator(lift, finalize, f"{rule}[tau={tau}]({base.name})")


def mask_step(tau, rule: str = "gma", rescale: bool = False, message: str = "sign"):
  """Server-chain stage: multiplies its input by the sign-agreement mask of this round.

  An ``optax.GradientTransformationExtraArgs`` (no state). ``update(u, state, params,
  messages=..., ctx=...)`` reads ``A = messages[message]`` (the aggregate of a
  :func:`sign_agreement` client message over the round's clients; pytree like ``u``) and
  returns ``agreement_mask(A, τ, rule, rescale) ⊙ u``; ``τ`` is a sweep replica's traced
  ``tau`` when ``ctx`` carries one (``core.algorithm.hparam``). Where it stands in the
  server chain is the algorithm: after the server optimizer it masks the step (FedGMA
  Alg. 1 line 14), before it the pseudo-gradient.

  Raises:
    ValueError: bad ``tau`` / ``rule``; ``rescale`` not a bool (at build time); KeyError
      at trace time when no client message ``message`` was aggregated.

  Source: FedGMA §4, Alg. 1; Parascandolo et al. 2021 (AND-mask, ``rescale``).
  """
  if not isinstance(rescale, bool):
    raise ValueError(f"rescale={rescale!r}; pass True or False.")
  agreement_mask(jnp.zeros(()), tau, rule, rescale)  # validates the arguments
  tau = check_tau(tau)

  def update(updates, state, params=None, *, messages, ctx, **extra):
    t = hparam(ctx, "tau", tau)
    mask = jax.tree.map(lambda a: agreement_mask(a, t, rule, rescale), messages[message])
    return jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, mask), state

  return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def gma(base: Aggregator, tau) -> Aggregator:
  """FedGMA: mask the aggregate of ``base`` with ``gma_mask`` of the client messages.

  ``lift(m, w) = (base.lift(m, w), sign(m), 1)``; ``finalize`` computes
  ``base.finalize(...) * mask`` with ``A = |Σ sign / count|`` and
  ``mask = 1 if A >= tau else A``. With ``tau = 0`` the mask is all ones, so
  ``gma(base, 0.0)`` equals ``base`` exactly. A client with ``weight == 0`` is absent: it
  contributes neither a sign nor a count (and whatever ``base`` does with weight 0), even
  when its message holds inf or NaN.

  Shapes: any message pytree (no client axis); the aggregate has the message's
  structure, and ``base.finalize`` must return that structure too.

  Raises:
    ValueError: ``tau`` outside [0, 1]; ``base`` not an ``Aggregator``.

  Source: FedGMA §4, Alg. 1 (mask applied to the aggregated pseudo-gradient Δ_t).
  """
  return masking_aggregator(base, tau, "gma", carry_mask=False)


def and_mask_aggregator(base: Aggregator, tau) -> Aggregator:
  """AND-mask the aggregate of ``base``: ``base.finalize(...) * 1[A >= tau]``.

  Same statistics as ``gma`` (``(base.lift(m, w), sign(m), 1)``), binary mask.
  A client with ``weight == 0`` contributes neither a sign nor a count (even when its
  message holds inf or NaN).

  Shapes: any message pytree (no client axis); the aggregate has the message's structure.

  Raises:
    ValueError: ``tau`` outside [0, 1]; ``base`` not an ``Aggregator``.

  Source: Parascandolo et al. 2021 (AND-mask); FedGMA §4 (binary mask m_τ on client
  updates).
  """
  return masking_aggregator(base, tau, "and_mask", carry_mask=False)


# ---------------------------------------------------------------------------------------
# Client-level DP's clipped mean (the noise and the accountant: fedjax_inv/privacy)
# ---------------------------------------------------------------------------------------

DP_CONTEXT = "dp"  # the extras key under which client_dp's stage keeps the adaptive clip


def clipped_mean(clip: float, expected_cohort: Optional[float] = None,
                 adaptive: bool = False) -> Aggregator:
  """Mean of the client updates, each clipped to L2 norm ``clip``, over a fixed
  denominator: ``(Σ_k Δ_k · min(1, C / ‖Δ_k‖)) / E``.

  ``‖·‖`` is the norm of all leaves together. A client of weight 0 (an empty slot of a
  Poisson cohort) is absent: it adds nothing, even when its ``Δ_k`` holds inf/NaN. ``E``
  is ``expected_cohort`` (Poisson sampling: ``q N``), or, when None (fixed-size sampling,
  every slot present), the number of present clients, which is then always ``C``. The
  noise of DP-FedAvg is ``fedjax_inv.privacy.client_dp.dp_component``'s. With
  ``adaptive``, ``C`` is the round's adaptive clip norm ``ctx.extras['dp']['clip']`` (the
  lift reads the client's context; ``client_dp`` sets it).
  Shapes: one client's update pytree (no client axis); the engine sums the lifted
  statistics over the client axis.

  Source: McMahan et al. 2018, Alg. 1 (``ClipFn`` flat clipping; the fixed-denominator
  estimator ``Σ Δ̃_k / (q W)`` with uniform weights).
  """
  def lift(delta, weight, ctx=None):
    present = weight > 0
    safe = jax.tree.map(lambda m: jnp.where(present, m, jnp.zeros_like(m)), delta)
    bound = ctx.extras[DP_CONTEXT]["clip"] if adaptive else clip
    scale = jnp.minimum(1.0, bound / jnp.maximum(optax.tree.norm(safe),
                                                 jnp.finfo(jnp.float32).tiny))
    clipped = jax.tree.map(lambda m: jnp.where(present, scale * m, jnp.zeros_like(m)), safe)
    return clipped, present.astype(jnp.float32)

  lift.reads_context = adaptive

  def finalize(stats):
    total, count = stats
    denominator = count if expected_cohort is None else jnp.float32(expected_cohort)
    nonempty = denominator > 0
    safe = jnp.where(nonempty, denominator, jnp.ones_like(denominator))
    return jax.tree.map(lambda t: jnp.where(nonempty, t / safe, jnp.zeros_like(t)), total)

  return Aggregator(lift, finalize, f"clipped_mean[C={clip}]")
