"""Property-based tests (hypothesis): invariants of the aggregators and the partitioners.

Aggregators are applied as the engine applies them (``core/engine.py``): ``lift`` vmapped
over a stacked client axis ``[C, ...]`` with per-client weights ``[C]``, the statistics
summed over that axis, then ``finalize`` (a sweep's traced ``tau`` passed through
``hparams``). Messages are a two-leaf pytree ``{'w': [2, 3], 'b': [2]}``. For every
generated input:

* permuting the client axis of the updates and the weights together changes nothing;
* scaling every weight by one positive constant changes nothing;
* an absent client (weight 0) has no effect on the aggregate nor on the gradient, even
  when its row holds inf/NaN; padding with absent clients has no effect;
* the weighted mean of identical updates is that update (FedAvg, McMahan et al. 2017,
  Alg. 1: ``Δ = Σ_k n_k Δ_k / Σ_k n_k``);
* the geometric mean of equal values is that value (the weighted geometric mean
  ``weightedgeo`` of FedILC §3.1, the library's source for it; any sign, and exact zeros);
* the sign-agreement masks (FedGMA, Tenison et al. 2022, §4: ``A = |Σ_k sign(Δ_k) / C|``,
  ``m̃_τ = 1 if A ≥ τ else A``; AND-mask, Parascandolo et al. 2021: ``1[A ≥ τ]``) are
  invariant to client permutation and to positive scaling of any one client's update.

Partitioners (``fedjax_inv/data/partition.py``): every example lands in exactly one client
(the client index arrays concatenate to a permutation of ``range(n)``; no duplicates),
client arrays are sorted int64, and each function's promised sizes hold (the Dirichlet
client sizes sum to ``n``, ``k`` classes per client, near-equal i.i.d. shards, ...). Only
inputs that meet each docstring's preconditions are generated.

Float32 tolerance (``RTOL``, and ``atol = RTOL · max|update|``): generated values are 0 or
of magnitude in [2^-10, 100], at most 6 clients. Reordering a float32 sum of ``C ≤ 6``
terms changes it by at most ``(C-1)·u·Σ|terms|`` (``u = 2^-24``), so the weighted mean
moves by ``≤ 5u·max|Δ| ≈ 3e-7·max|Δ|`` (``Σ w|Δ| / Σ w ≤ max|Δ|``); the geometric mean's
mean of logs (``|log|g|| ≤ 6.9``) moves by ``≤ 5u·6.9 ≈ 2e-6``, a relative error of about
``2e-6`` in each ``exp`` term, each term ``≤ max|g|``. ``RTOL = 2e-5`` leaves a margin of
about 10x over these worst cases. Where only exact operations differ (the content of an
absent row, which is replaced before any arithmetic; sign counts, which are small
integers) the results must be bitwise equal.
"""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedjax_inv.aggregation.aggregators import (
    and_mask, geometric_mean_aggregator, gma_mask, masking_aggregator,
    weighted_geometric_mean, weighted_mean)
from fedjax_inv.core.aggregator import traced_names
from fedjax_inv.data import partition as P

# Derandomized (the same examples on every run, so CI is deterministic), no example
# database written into the checkout, no per-example deadline (the first example of each
# shape pays for a jit compile).
AGG_SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None)
PART_SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None)

RTOL = 2e-5   # see the module docstring.
C = 6         # clients in the stacked client axis.
D = 8         # parameters per client: 'w' [2, 3] + 'b' [2].

AGGREGATORS = {
    "mean": weighted_mean(),
    "geometric[both]": geometric_mean_aggregator("both"),
    "geometric[negative]": geometric_mean_aggregator("negative"),
    "gma(mean)": masking_aggregator(weighted_mean(), 0.5, "gma"),
    "and_mask(mean)": masking_aggregator(weighted_mean(), 0.5, "and_mask"),
}
NAMES = list(AGGREGATORS)
MEAN_BASED = ["mean", "gma(mean)", "and_mask(mean)"]

# ---------------------------------------------------------------------------------------
# Strategies and helpers
# ---------------------------------------------------------------------------------------

_MAG = st.floats(2.0**-10, 100.0, width=32)  # bounds exact in float32
VALUES = st.one_of(st.just(0.0), _MAG, _MAG.map(lambda v: -v))
POS_WEIGHT = st.floats(0.125, 64.0, width=32)
WEIGHT = st.one_of(st.just(0.0), POS_WEIGHT)  # 0 = absent client
JUNK = st.one_of(st.sampled_from([np.nan, np.inf, -np.inf, 3e38, -3e38]), VALUES)
TAU = st.floats(0.0, 1.0)


def updates(rows=C, elements=VALUES):
  return hnp.arrays(np.float32, (rows, D), elements=elements)


def weights(rows=C, elements=WEIGHT):
  return hnp.arrays(np.float32, (rows,), elements=elements)


def _one_present(w, i, wi):
  w = w.copy()
  w[i] = wi
  return w


# Weights with at least one present client (arbitrary others, absent ones included).
SOME_PRESENT = st.builds(_one_present, weights(), st.integers(0, C - 1), POS_WEIGHT)


def _tree(flat):
  """``[..., 8]`` -> ``{'w': [..., 2, 3], 'b': [..., 2]}``."""
  return {"w": flat[..., :6].reshape(flat.shape[:-1] + (2, 3)), "b": flat[..., 6:]}


def _aggregate_impl(name, flat, w, tau):
  a = AGGREGATORS[name]
  stats = jax.vmap(a.lift)(_tree(flat), w)
  sums = jax.tree.map(lambda s: jnp.sum(s, axis=0), stats)
  if traced_names(a):
    return a.finalize(sums, hparams={"tau": tau})
  return a.finalize(sums)


@functools.partial(jax.jit, static_argnums=0)
def aggregate(name, flat, w, tau=0.5):
  """What the engine does: lift every client (vmap), sum over clients, finalize."""
  return _aggregate_impl(name, flat, w, tau)


@functools.partial(jax.jit, static_argnums=0)
def aggregate_grad(name, flat, w, tau=0.5):
  """d(sum of every leaf of the aggregate) / d(stacked updates)."""
  def f(x):
    return sum(jnp.sum(l) for l in jax.tree.leaves(_aggregate_impl(name, x, w, tau)))
  return jax.grad(f)(flat)


def assert_agg_close(got, want, scale):
  chex.assert_trees_all_close(got, want, rtol=RTOL, atol=RTOL * scale)


def _scale(x):
  return float(np.max(np.abs(x))) if x.size else 0.0


# ---------------------------------------------------------------------------------------
# Aggregators
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@AGG_SETTINGS
@given(x=updates(), w=weights(), perm=st.permutations(range(C)), tau=TAU)
def test_aggregator_client_permutation_invariance(name, x, w, perm, tau):
  """Permuting the client axis of updates and weights together leaves the aggregate."""
  perm = np.asarray(perm)
  got = aggregate(name, x[perm], w[perm], tau)
  assert_agg_close(got, aggregate(name, x, w, tau), _scale(x))


@pytest.mark.parametrize("name", NAMES)
@AGG_SETTINGS
@given(x=updates(), w=weights(), c=st.floats(2.0**-10, 2.0**10, width=32), tau=TAU)
def test_aggregator_weight_scale_invariance(name, x, w, c, tau):
  """Scaling every client weight by one positive constant leaves the aggregate."""
  got = aggregate(name, x, np.float32(c) * w, tau)
  assert_agg_close(got, aggregate(name, x, w, tau), _scale(x))


@pytest.mark.parametrize("name", NAMES)
@AGG_SETTINGS
@given(x=updates(), w=weights(elements=POS_WEIGHT), present=hnp.arrays(bool, (C,)),
       junk=updates(elements=JUNK), tau=TAU)
def test_absent_client_row_has_no_effect(name, x, w, present, junk, tau):
  """A zero-weight client's row (even inf/NaN) changes neither the aggregate nor grads."""
  w = np.where(present, w, np.float32(0.0))
  dirty = np.where(present[:, None], x, junk)
  clean = np.where(present[:, None], x, np.float32(0.0))
  # Absent rows are replaced before any arithmetic: bitwise the same statistics.
  got = aggregate(name, dirty, w, tau)
  chex.assert_trees_all_equal(got, aggregate(name, clean, w, tau))
  chex.assert_tree_all_finite(got)
  g_dirty = np.asarray(aggregate_grad(name, dirty, w, tau))
  np.testing.assert_array_equal(g_dirty, aggregate_grad(name, clean, w, tau))
  assert np.all(np.isfinite(g_dirty))
  np.testing.assert_array_equal(g_dirty[~present], 0.0)


@pytest.mark.parametrize("name", NAMES)
@AGG_SETTINGS
@given(x=updates(rows=4), w=weights(rows=4, elements=POS_WEIGHT),
       pad=updates(rows=C - 4, elements=JUNK), perm=st.permutations(range(C)), tau=TAU)
def test_padding_with_absent_clients_has_no_effect(name, x, w, pad, perm, tau):
  """Extra weight-0 clients, anywhere on the client axis, leave the aggregate unchanged."""
  perm = np.asarray(perm)
  padded_x = np.concatenate([x, pad])[perm]
  padded_w = np.concatenate([w, np.zeros(C - 4, np.float32)])[perm]
  got = aggregate(name, padded_x, padded_w, tau)
  assert_agg_close(got, aggregate(name, x, w, tau), _scale(x))


@pytest.mark.parametrize("name", MEAN_BASED)
@AGG_SETTINGS
@given(u=hnp.arrays(np.float32, (D,), elements=VALUES), w=SOME_PRESENT, tau=TAU)
def test_weighted_mean_of_identical_updates_is_the_update(name, u, w, tau):
  """FedAvg's Σ n_k Δ / Σ n_k = Δ; with identical updates every nonzero sign agrees."""
  got = aggregate(name, np.tile(u, (C, 1)), w, tau)
  # Σ_k w_k u (C products, same sign: no cancellation) / Σ_k w_k: ≤ ~2C·u relative error.
  if name == "mean":
    chex.assert_trees_all_close(got, _tree(u), rtol=RTOL, atol=0.0)
  else:
    chex.assert_trees_all_close(got.pseudo_grad, _tree(u), rtol=RTOL, atol=0.0)
    # A = 1 where u != 0 (unanimous), so the mask is 1 there for every tau in [0, 1].
    mask = np.concatenate([np.ravel(got.mask["w"]), np.ravel(got.mask["b"])])
    np.testing.assert_array_equal(mask[u != 0], 1.0)


@pytest.mark.parametrize("zeros", ["both", "negative"])
@AGG_SETTINGS
@given(u=hnp.arrays(np.float32, (D,), elements=VALUES),
       num=st.sampled_from([1, 3, C]), w=SOME_PRESENT)
def test_geometric_mean_of_equal_values_is_that_value(zeros, u, num, w):
  """wgm of E copies of g is g: sign set of size E, (|g|^E)^(1/E) = |g|; zeros give 0."""
  # ≤ E·u·|log|g|| ≈ 2.5e-6 relative error from exp(mean log|g|); exact zeros stay 0.
  got = weighted_geometric_mean(jnp.asarray(np.tile(u, (num, 1))), zeros=zeros)
  np.testing.assert_allclose(got, u, rtol=RTOL, atol=0.0)
  # The monoid form (the engine's), with any present clients.
  name = f"geometric[{zeros}]"
  got = aggregate(name, np.tile(u, (C, 1)), w)
  chex.assert_trees_all_close(got, _tree(u), rtol=RTOL, atol=0.0)


@pytest.mark.parametrize("mask_fn", [and_mask, gma_mask], ids=["and_mask", "gma_mask"])
@AGG_SETTINGS
@given(x=updates(), perm=st.permutations(range(C)), tau=TAU)
def test_sign_mask_client_permutation_invariance(mask_fn, x, perm, tau):
  """A counts signs over clients (exact small integers): permuting clients is bitwise a no-op."""
  tree = _tree(jnp.asarray(x))
  got = mask_fn(_tree(jnp.asarray(x[np.asarray(perm)])), tau)
  chex.assert_trees_all_equal(got, mask_fn(tree, tau))


@pytest.mark.parametrize("mask_fn", [and_mask, gma_mask], ids=["and_mask", "gma_mask"])
@AGG_SETTINGS
@given(x=updates(), tau=TAU,
       scales=hnp.arrays(np.float32, (C,), elements=st.floats(2.0**-10, 2.0**10, width=32)))
def test_sign_mask_positive_client_scaling_invariance(mask_fn, x, scales, tau):
  """Scaling any client's update by a positive factor keeps its signs, hence the mask."""
  # |x| in {0} ∪ [2^-10, 100], scales in [2^-10, 2^10]: products in [2^-20, 1.1e5], so
  # no underflow to 0 and no overflow; every sign is kept.
  scaled = x * scales[:, None]
  assert np.array_equal(np.sign(scaled), np.sign(x))
  got = mask_fn(_tree(jnp.asarray(scaled)), tau)
  chex.assert_trees_all_equal(got, mask_fn(_tree(jnp.asarray(x)), tau))


# ---------------------------------------------------------------------------------------
# Partitioners
# ---------------------------------------------------------------------------------------


def assert_exact_cover(parts, n):
  """Client index arrays: sorted unique int64, and together a permutation of range(n)."""
  for p in parts:
    assert p.dtype == np.int64
    assert np.all(np.diff(p) > 0), "a client's indices are sorted and unique"
  allidx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
  assert len(allidx) == n, "some index is missing or repeated"
  np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


SEED = st.integers(0, 2**32 - 1)


@st.composite
def labels(draw, max_n=150, max_classes=6):
  """``[n]`` integer class ids, arbitrary (non-contiguous) ids."""
  n = draw(st.integers(1, max_n))
  ids = draw(st.lists(st.integers(0, 50), min_size=1, max_size=max_classes, unique=True))
  return draw(hnp.arrays(np.int64, (n,), elements=st.sampled_from(ids)))


@PART_SETTINGS
@given(n=st.integers(1, 300), data=st.data(), seed=SEED)
def test_iid_partition_exact_cover(n, data, seed):
  """iid_partition: a permutation of range(n) in N shards of n // N or n // N + 1."""
  num_clients = data.draw(st.integers(1, min(n, 12)))
  parts = P.iid_partition(n, num_clients, seed)
  assert len(parts) == num_clients
  assert_exact_cover(parts, n)
  assert {len(p) for p in parts} <= {n // num_clients, n // num_clients + 1}


@PART_SETTINGS
@given(y=labels(), data=st.data(), alpha=st.floats(0.01, 100.0), seed=SEED)
def test_dirichlet_label_partition_exact_cover(y, data, alpha, seed):
  """dirichlet_label_partition: every example in exactly one client; sizes sum to n."""
  n = len(y)
  num_clients = data.draw(st.integers(1, min(n, 8)), label="num_clients")
  min_size = data.draw(st.integers(0, n // num_clients), label="min_size")
  try:
    parts = P.dirichlet_label_partition(y, num_clients, alpha, seed, min_size=min_size)
  except ValueError as e:  # documented: no draw met min_size (Flower tries 11 times).
    assert "raise alpha" in str(e)
    reject()
  assert len(parts) == num_clients
  sizes = np.array([len(p) for p in parts])
  assert sizes.sum() == n
  assert sizes.min() >= min_size
  assert_exact_cover(parts, n)


@PART_SETTINGS
@given(counts=st.lists(st.integers(1, 12), min_size=1, max_size=5), data=st.data(),
       seed=SEED)
def test_k_classes_per_client_exact_cover(counts, data, seed):
  """k_classes_per_client: disjoint, every client holds exactly k classes, exact cover when
  there are at least as many clients as classes."""
  num_classes = len(counts)
  ids = data.draw(st.lists(st.integers(0, 50), min_size=num_classes,
                           max_size=num_classes, unique=True), label="class ids")
  y = np.random.default_rng(0).permutation(np.repeat(ids, counts)).astype(np.int64)
  n = len(y)
  num_clients = data.draw(st.integers(1, min(n, 6)), label="num_clients")
  k = data.draw(st.integers(-(-num_classes // num_clients), num_classes), label="k")
  try:
    parts = P.k_classes_per_client(y, num_clients, k, seed)
  except ValueError as e:  # documented: a class with fewer examples than owners.
    assert "lower k" in str(e)
    reject()
  assert len(parts) == num_clients
  if num_clients >= num_classes:
    assert_exact_cover(parts, n)
  else:  # classes no client drew are left out; the rest are used once
    used = np.sort(np.concatenate(parts))
    np.testing.assert_array_equal(used, np.flatnonzero(np.isin(y, np.unique(y[used]))))
  for p in parts:
    assert len(np.unique(y[p])) == k


@st.composite
def domain_sizes(draw):
  return draw(st.lists(st.integers(1, 30), min_size=1, max_size=4))


@PART_SETTINGS
@given(sizes=domain_sizes(), data=st.data(), as_arrays=st.booleans(), seed=SEED)
def test_split_domains_to_clients_exact_cover(sizes, data, as_arrays, seed):
  """split_domains_to_clients: P clients, none mixing domains, covering every example."""
  m, total = len(sizes), sum(sizes)
  num_clients = data.draw(st.integers(m, total), label="num_clients")
  # Either sizes (indices local to each domain) or global index arrays (disjoint domains).
  perm = np.random.default_rng(seed).permutation(total)
  doms = np.split(perm, np.cumsum(sizes)[:-1])
  clients, owner = P.split_domains_to_clients(doms if as_arrays else sizes, num_clients,
                                              seed)
  assert len(clients) == num_clients and owner.shape == (num_clients,)
  assert owner.dtype == np.int64 and np.all(np.diff(owner) >= 0), "grouped by domain"
  assert all(len(c) > 0 for c in clients)
  np.testing.assert_array_equal(np.bincount(owner, minlength=m),
                                P.domain_client_counts(sizes, num_clients))
  if as_arrays:
    assert_exact_cover(clients, total)
    for c, o in zip(clients, owner):
      assert np.isin(c, doms[o]).all(), "a client holds only its own domain's examples"
  else:
    for d, s in enumerate(sizes):
      assert_exact_cover([c for c, o in zip(clients, owner) if o == d], s)


@PART_SETTINGS
@given(sizes=domain_sizes(), data=st.data(), seed=SEED)
def test_split_each_domain_exact_cover(sizes, data, seed):
  """split_each_domain: c near-equal clients per domain covering that domain exactly."""
  c = data.draw(st.integers(1, min(sizes)), label="clients_per_domain")
  clients, owner = P.split_each_domain(sizes, c, seed)
  assert len(clients) == len(sizes) * c
  np.testing.assert_array_equal(owner, np.repeat(np.arange(len(sizes)), c))
  for d, s in enumerate(sizes):
    mine = [p for p, o in zip(clients, owner) if o == d]
    assert_exact_cover(mine, s)
    assert {len(p) for p in mine} <= {s // c, s // c + 1}


@PART_SETTINGS
@given(n=st.integers(1, 200), val_fraction=st.floats(0.0, 0.99), seed=SEED)
def test_train_val_split_exact_cover(n, val_fraction, seed):
  """train_val_split: disjoint train/val parts covering range(n), val sized as promised."""
  try:
    tr, va = P.train_val_split(n, val_fraction, np.random.default_rng(seed))
  except ValueError as e:  # documented: too few examples to keep one in each part.
    assert "cannot give" in str(e)
    reject()
  assert_exact_cover([tr, va], n)
  assert len(tr) >= 1
  expected_val = 0 if val_fraction == 0 else max(1, int(round(val_fraction * n)))
  assert len(va) == expected_val
