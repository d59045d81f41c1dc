"""Behaviour tests for fedjax_inv.aggregation.aggregators (FedILC §3.1, AND-mask, FedGMA §4)."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.aggregation import aggregators as agg
from fedjax_inv.aggregation.aggregators import (
    Aggregator, and_mask, and_mask_aggregator, geometric_mean_aggregator, gma, gma_mask,
    weighted_geometric_mean, weighted_mean)


# --------------------------------------------------------------------------------------
# Reference implementations (slow, float64, straight from the formulas)
# --------------------------------------------------------------------------------------


def ref_wgm_1d(values, zeros="both"):
  """FedILC §3.1 for one coordinate, via explicit sets and products."""
  values = [float(v) for v in values]
  e = len(values)
  if zeros == "both":
    pos = [v for v in values if v >= 0]
    neg = [v for v in values if v <= 0]
  else:
    pos = [v for v in values if v > 0]
    neg = [v for v in values if v <= 0]

  def term(s):
    if not s:
      return 0.0
    return len(s) / e * math.prod(abs(v) for v in s) ** (1.0 / len(s))

  return term(pos) - term(neg)


def ref_wgm(x, axis=0, zeros="both"):
  x = np.moveaxis(np.asarray(x, np.float64), axis, 0)
  flat = x.reshape(x.shape[0], -1)
  out = np.array([ref_wgm_1d(flat[:, j], zeros) for j in range(flat.shape[1])])
  return out.reshape(x.shape[1:])


def lift_and_sum(aggregator, messages, weights):
  """Lifts each client's message and sums the stats (one grouping)."""
  lift = jax.jit(aggregator.lift)
  stats = [lift(m, jnp.float32(w)) for m, w in zip(messages, weights)]
  return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *stats)


def split_messages(tree, num):
  return [jax.tree.map(lambda x: x[i], tree) for i in range(num)]


def _engine_sum(aggregator, tree, weights):
  """What the engine does: lift every client (vmap), sum over clients, finalize."""

  @jax.jit
  def run(tree, weights):
    stats = jax.vmap(aggregator.lift)(tree, weights)
    return aggregator.finalize(jax.tree.map(lambda s: jnp.sum(s, axis=0), stats))

  return run(tree, weights)


# --------------------------------------------------------------------------------------
# weighted_geometric_mean
# --------------------------------------------------------------------------------------


def test_wgm_matches_reference_on_mixed_signs():
  rng = np.random.default_rng(0)
  g = rng.normal(size=(5, 7, 3)).astype(np.float32)
  assert (g > 0).any() and (g < 0).any()
  out = weighted_geometric_mean(jnp.asarray(g))
  assert out.shape == (7, 3) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref_wgm(g), rtol=1e-5, atol=1e-6)
  # Without zeros the two conventions coincide.
  np.testing.assert_allclose(
      weighted_geometric_mean(jnp.asarray(g), zeros="negative"), ref_wgm(g),
      rtol=1e-5, atol=1e-6)


def test_wgm_small_closed_form():
  g = jnp.array([[1.0, -2.0], [4.0, -8.0], [2.0, 3.0]])
  # col 0: all positive -> geomean(1,4,2) = 2.
  # col 1: E+ = {3}, E- = {-2, -8}: 1/3 * 3 - 2/3 * 4 = -5/3.
  np.testing.assert_allclose(weighted_geometric_mean(g), [2.0, -5.0 / 3.0], rtol=1e-6)


def test_wgm_all_positive_is_geometric_mean():
  rng = np.random.default_rng(1)
  g = rng.uniform(0.1, 10.0, size=(6, 10)).astype(np.float32)
  expected = np.exp(np.mean(np.log(g.astype(np.float64)), axis=0))
  np.testing.assert_allclose(weighted_geometric_mean(jnp.asarray(g)), expected, rtol=1e-5)


def test_wgm_all_negative_is_minus_geometric_mean_of_abs():
  rng = np.random.default_rng(2)
  g = -rng.uniform(0.1, 10.0, size=(4, 10)).astype(np.float32)
  expected = -np.exp(np.mean(np.log(np.abs(g.astype(np.float64))), axis=0))
  np.testing.assert_allclose(weighted_geometric_mean(jnp.asarray(g)), expected, rtol=1e-5)


def test_wgm_zero_conventions():
  g = jnp.array([
      [0.0, 0.0, 0.0, 2.0],
      [3.0, -3.0, 0.0, 8.0],
      [-1.0, 4.0, 0.0, -4.0],
  ])
  # Paper ("both"): a zero is in E+ and E-, so both products are 0 -> coordinate is 0.
  both = np.asarray(weighted_geometric_mean(g))
  np.testing.assert_array_equal(both[:3], [0.0, 0.0, 0.0])
  # col 3 has no zero: 2/3 * sqrt(16) - 1/3 * 4 = 4/3.
  np.testing.assert_allclose(both[3], 4.0 / 3.0, rtol=1e-6)
  np.testing.assert_allclose(both, ref_wgm(g, zeros="both"), rtol=1e-6, atol=0)

  # Code ("negative"): a zero only joins E-, which then has product 0.
  neg = np.asarray(weighted_geometric_mean(g, zeros="negative"))
  # col 0: E+ = {3}: 1/3 * 3 = 1; E- = {0, -1} -> 0.  => 1
  # col 1: E+ = {4}: 1/3 * 4; E- = {0, -3} -> 0.      => 4/3
  # col 2: E+ = {} -> 0; E- = {0, 0, 0} -> 0.         => 0
  np.testing.assert_allclose(neg, [1.0, 4.0 / 3.0, 0.0, 4.0 / 3.0], rtol=1e-6)
  np.testing.assert_allclose(neg, ref_wgm(g, zeros="negative"), rtol=1e-6, atol=0)
  # Counting: in "both", |E+| includes the zero (the weight is 2/3, not 1/3).
  g2 = jnp.array([[0.0], [5.0], [-5.0]])
  assert float(weighted_geometric_mean(g2)[0]) == 0.0
  np.testing.assert_allclose(weighted_geometric_mean(g2, zeros="negative"), [5.0 / 3.0])


def test_wgm_finite_for_extreme_inputs():
  vals = np.array([0.0, 1e-30, 1e30, -1e-30, -1e30, 1.0, -1.0], np.float32)
  rng = np.random.default_rng(3)
  g = rng.choice(vals, size=(5, 200)).astype(np.float32)
  g[:, 0] = 0.0
  g[:, 1] = 1e-30
  g[:, 2] = 1e30
  g[:, 3] = [1e30, 1e-30, 1e30, 1e-30, 1e30]
  g[:, 4] = [-1e30, -1e-30, 1e30, 0.0, 1e-30]
  for zeros in ("both", "negative"):
    out = np.asarray(weighted_geometric_mean(jnp.asarray(g), zeros=zeros))
    assert np.all(np.isfinite(out)), zeros
    np.testing.assert_allclose(out, ref_wgm(g, zeros=zeros), rtol=2e-5, atol=0)
    assert out[0] == 0.0
  np.testing.assert_allclose(
      weighted_geometric_mean(jnp.asarray(g))[1:3], [1e-30, 1e30], rtol=1e-5)
  # Also finite under jit and with gradients flowing through it.
  jit_out = jax.jit(weighted_geometric_mean)(jnp.asarray(g))
  assert np.all(np.isfinite(np.asarray(jit_out)))
  grads = jax.jit(jax.grad(lambda x: jnp.sum(weighted_geometric_mean(x))))(
      jnp.asarray(g[:, :8]))
  assert np.all(np.isfinite(np.asarray(grads)))


def test_wgm_pytree_and_axis():
  rng = np.random.default_rng(4)
  tree = {"w": rng.normal(size=(4, 3, 2)).astype(np.float32),
          "b": (rng.normal(size=(4,)).astype(np.float32),)}
  out = weighted_geometric_mean(jax.tree.map(jnp.asarray, tree))
  assert jax.tree.structure(out) == jax.tree.structure(
      jax.tree.map(lambda x: x[0], tree))
  np.testing.assert_allclose(out["w"], ref_wgm(tree["w"]), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out["b"][0], ref_wgm(tree["b"][0]), rtol=1e-5, atol=1e-6)

  x = rng.normal(size=(3, 5, 2)).astype(np.float32)
  out1 = weighted_geometric_mean(jnp.asarray(x), axis=1)
  assert out1.shape == (3, 2)
  np.testing.assert_allclose(out1, ref_wgm(x, axis=1), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      weighted_geometric_mean(jnp.asarray(x), axis=-2), out1, rtol=0, atol=0)


def test_wgm_errors():
  with pytest.raises(ValueError, match="zeros"):
    weighted_geometric_mean(jnp.ones((2, 3)), zeros="positive")
  with pytest.raises(ValueError, match="zeros"):
    geometric_mean_aggregator(zeros="code")
  with pytest.raises(ValueError, match="axis"):
    weighted_geometric_mean(jnp.ones((2, 3)), axis=2)
  with pytest.raises(ValueError, match="axis"):
    weighted_geometric_mean({"a": jnp.ones((2, 3)), "b": jnp.float32(1.0)})
  with pytest.raises(ValueError, match="empty"):
    weighted_geometric_mean(jnp.ones((0, 3)))


@pytest.mark.parametrize("zeros", ["both", "negative"])
def test_geometric_mean_aggregator_matches_array_function(zeros):
  rng = np.random.default_rng(5)
  num = 6
  tree = {"w": rng.normal(size=(num, 4, 3)).astype(np.float32),
          "b": rng.normal(size=(num, 3)).astype(np.float32)}
  tree["w"][2, 0, 0] = 0.0  # an exact zero in one client
  tree["w"][:, 1, 1] = np.abs(tree["w"][:, 1, 1])  # all positive coordinate
  tree = jax.tree.map(jnp.asarray, tree)
  expected = weighted_geometric_mean(tree, zeros=zeros)
  a = geometric_mean_aggregator(zeros)
  assert isinstance(a, Aggregator)
  msgs = split_messages(tree, num)
  weights = rng.uniform(1.0, 50.0, size=num)  # ignored (all positive)

  # Grouping 1: all at once (vmap lift + sum over the client axis, as the engine does).
  all_at_once = _engine_sum(a, tree, jnp.asarray(weights, jnp.float32))
  # Grouping 2: two chunks, each summed, then added (in reverse client order).
  chunk1 = lift_and_sum(a, msgs[:2][::-1], weights[:2])
  chunk2 = lift_and_sum(a, msgs[2:][::-1], weights[2:])
  chunked = jax.jit(a.finalize)(jax.tree.map(jnp.add, chunk2, chunk1))

  for got in (all_at_once, chunked):
    chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-6)
  assert float(chunked["w"][0, 0]) == 0.0 if zeros == "both" else True


def test_geometric_mean_aggregator_zero_weight_client_is_absent():
  rng = np.random.default_rng(6)
  g = jnp.asarray(rng.normal(size=(4, 5)).astype(np.float32))
  a = geometric_mean_aggregator()
  padded = jnp.concatenate([g, jnp.zeros((2, 5)), 7.0 * jnp.ones((1, 5))])
  w = jnp.array([1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0])
  got = _engine_sum(a, padded, w)
  np.testing.assert_allclose(got, weighted_geometric_mean(g), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------
# AND-mask and FedGMA mask
# --------------------------------------------------------------------------------------

# 4 clients, 5 coordinates: agreements A = |mean sign| = 1, 0.5, 0, 1, 0.25 (a zero entry
# has sign 0).
UPDATES = jnp.array([
    [1.0, 2.0, 1.0, -1.0, 0.0],
    [2.0, 1.0, -1.0, -2.0, 1.0],
    [3.0, 5.0, 1.0, -3.0, 0.0],
    [0.5, -1.0, -1.0, -0.1, 0.0],
])
AGREEMENT = np.array([1.0, 0.5, 0.0, 1.0, 0.25])


def test_and_mask_closed_form():
  np.testing.assert_array_equal(and_mask(UPDATES, 0.5), [1, 1, 0, 1, 0])
  np.testing.assert_array_equal(and_mask(UPDATES, 0.6), [1, 0, 0, 1, 0])
  np.testing.assert_array_equal(and_mask(UPDATES, 0.0), np.ones(5))  # tau = 0: all pass
  np.testing.assert_array_equal(and_mask(UPDATES, 1.0), [1, 0, 0, 1, 0])  # unanimity
  np.testing.assert_array_equal(and_mask(UPDATES.T, 1.0, axis=1), [1, 0, 0, 1, 0])


def test_gma_mask_closed_form():
  # Paper rule: 1 if A >= tau else A.
  np.testing.assert_allclose(gma_mask(UPDATES, 0.5), [1.0, 1.0, 0.0, 1.0, 0.25])
  np.testing.assert_allclose(gma_mask(UPDATES, 0.6), [1.0, 0.5, 0.0, 1.0, 0.25])
  np.testing.assert_array_equal(gma_mask(UPDATES, 0.0), np.ones(5))
  np.testing.assert_allclose(gma_mask(UPDATES, 1.0), [1.0, 0.5, 0.0, 1.0, 0.25])
  # ... and not the public port's mask * (1 + A).
  buggy = np.asarray(and_mask(UPDATES, 0.5)) * (1.0 + AGREEMENT)
  assert not np.allclose(gma_mask(UPDATES, 0.5), buggy)
  np.testing.assert_allclose(gma_mask(UPDATES, 0.5), np.where(AGREEMENT >= 0.5, 1.0, AGREEMENT))


def test_masks_on_pytrees_and_errors():
  tree = {"a": UPDATES, "b": [UPDATES[:, :2]]}
  out = gma_mask(tree, 0.6)
  np.testing.assert_allclose(out["b"][0], [1.0, 0.5])
  for bad in (-0.1, 1.5, float("nan")):
    with pytest.raises(ValueError, match="tau"):
      and_mask(UPDATES, bad)
    with pytest.raises(ValueError, match="tau"):
      gma_mask(UPDATES, bad)
    with pytest.raises(ValueError, match="tau"):
      gma(weighted_mean(), bad)
    with pytest.raises(ValueError, match="tau"):
      and_mask_aggregator(weighted_mean(), bad)
  with pytest.raises(ValueError, match="tau"):
    gma_mask(UPDATES, jnp.array([0.1, 0.2]))
  # tau may be traced under jit.
  np.testing.assert_allclose(jax.jit(gma_mask)(UPDATES, 0.6), [1.0, 0.5, 0.0, 1.0, 0.25])




def test_gma_with_tau_zero_equals_base_exactly():
  rng = np.random.default_rng(7)
  tree = {"w": jnp.asarray(rng.normal(size=(5, 3, 4)).astype(np.float32)),
          "b": jnp.asarray(rng.normal(size=(5, 4)).astype(np.float32))}
  w = jnp.asarray(rng.uniform(1.0, 10.0, size=5).astype(np.float32))
  base = weighted_mean()
  got = _engine_sum(gma(base, 0.0), tree, w)
  expected = _engine_sum(base, tree, w)
  chex.assert_trees_all_equal(got, expected)


@pytest.mark.parametrize("tau", [0.3, 0.6, 1.0])
def test_masked_aggregators_equal_mask_times_weighted_mean(tau):
  rng = np.random.default_rng(8)
  num = 5
  tree = {"w": rng.normal(size=(num, 3, 4)).astype(np.float32),
          "b": rng.normal(size=(num, 4)).astype(np.float32)}
  tree["w"][:, 0, 0] = np.abs(tree["w"][:, 0, 0])  # a unanimous coordinate
  tree = jax.tree.map(jnp.asarray, tree)
  w = rng.uniform(1.0, 10.0, size=num).astype(np.float32)
  mean = jax.tree.map(lambda x: jnp.tensordot(w, x, axes=1) / w.sum(), tree)

  for wrapper, mask_fn in ((gma, gma_mask), (and_mask_aggregator, and_mask)):
    expected = jax.tree.map(jnp.multiply, mask_fn(tree, tau), mean)
    a = wrapper(weighted_mean(), tau)
    assert isinstance(a, Aggregator)
    got = _engine_sum(a, tree, jnp.asarray(w))
    chex.assert_trees_all_close(got, expected, rtol=1e-5, atol=1e-6)
    # Chunked grouping gives the same result.
    msgs = split_messages(tree, num)
    s = jax.tree.map(jnp.add, lift_and_sum(a, msgs[:3], w[:3]), lift_and_sum(a, msgs[3:], w[3:]))
    chex.assert_trees_all_close(jax.jit(a.finalize)(s), expected, rtol=1e-5, atol=1e-6)


def test_masked_aggregator_zero_weight_client_is_absent():
  w = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
  padded = jnp.concatenate([UPDATES, -5.0 * jnp.ones((2, 5))])
  got = _engine_sum(gma(weighted_mean(), 0.6), padded, w)
  expected = np.asarray(gma_mask(UPDATES, 0.6)) * np.asarray(jnp.mean(UPDATES, axis=0))
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_weighted_mean_unchanged():
  # The engine's contract for the pre-existing aggregator.
  a = weighted_mean()
  assert a.name == "mean"
  got = _engine_sum(a, UPDATES, jnp.array([1.0, 2.0, 3.0, 4.0]))
  np.testing.assert_allclose(
      got, np.average(np.asarray(UPDATES), axis=0, weights=[1, 2, 3, 4]), rtol=1e-6)
  # issue 26 added the gather flag (robust aggregators); a summable one keeps it False
  assert agg.Aggregator._fields == ("lift", "finalize", "name", "gather")
  assert a.gather is False


# ---------------------------------------------------------------------------------------
# dtypes, negative axes and the top of the float range (mutation testing, tests/README.md)
# ---------------------------------------------------------------------------------------


def test_weighted_geometric_mean_keeps_the_leafs_float_dtype():
  """float16 in → float16 out (computed in float32); integer in → float32 out."""
  x = jnp.asarray([[1.0, 4.0], [4.0, 1.0]], jnp.float16)
  out = weighted_geometric_mean(x)
  assert out.dtype == jnp.float16
  np.testing.assert_allclose(np.asarray(out, np.float32), [2.0, 2.0], rtol=1e-3)
  out = weighted_geometric_mean(jnp.asarray([[1, 4], [4, 1]], jnp.int32))
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), [2.0, 2.0], rtol=1e-6)


def test_client_axis_may_be_given_as_minus_ndim():
  """``axis=-x.ndim`` is the first axis (in range), for the geometric mean and the masks."""
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))
  chex.assert_trees_all_close(weighted_geometric_mean(x, axis=-2),
                              weighted_geometric_mean(x, axis=0), rtol=0, atol=0)
  chex.assert_trees_all_close(gma_mask(x, 0.5, axis=-2), gma_mask(x, 0.5, axis=0),
                              rtol=0, atol=0)
  with pytest.raises(ValueError, match="axis=-3 is out of range"):
    weighted_geometric_mean(x, axis=-3)


def test_geometric_mean_at_the_top_of_the_float_range_is_finite():
  """Every client at float32's max: exp(mean log) must not round up to inf (clamped)."""
  big = float(np.finfo(np.float32).max)
  out = weighted_geometric_mean(jnp.full((3, 2), big, jnp.float32))
  assert np.all(np.isfinite(np.asarray(out))), out
  np.testing.assert_allclose(np.asarray(out), big, rtol=1e-6)
  out = weighted_geometric_mean(jnp.full((3, 2), -big, jnp.float32))
  np.testing.assert_allclose(np.asarray(out), -big, rtol=1e-6)


def test_traced_names_lists_what_a_sweep_may_trace():
  """``core.aggregator.traced_names``: the masking aggregator's finalize reads ``tau``
  (sweep.py batches a tau sweep through it); the weighted mean traces nothing."""
  from fedjax_inv.aggregation.aggregators import masking_aggregator
  from fedjax_inv.core.aggregator import traced_names
  assert traced_names(masking_aggregator(weighted_mean(), 0.5)) == ("tau",)
  assert traced_names(weighted_mean()) == ()


def test_outer_product_geo_stats_rejects_a_wrong_rank_on_either_side():
  from fedjax_inv.aggregation.aggregators import outer_product_geo_stats
  a2, d2, m = jnp.ones((4, 3)), jnp.ones((4, 2)), jnp.ones(4)
  for a, d in ((jnp.ones((4, 3, 1)), d2), (a2, jnp.ones((4, 2, 1))), (jnp.ones(4), d2)):
    with pytest.raises(ValueError, match=r"expected \[B, m\], \[B, n\], \[B\]"):
      outer_product_geo_stats(a, d, m)


def test_outer_product_geo_stats_computes_in_float32_for_half_inputs():
  """float16 factors are promoted before the logs and matmuls: the statistics equal the
  float32 computation on the same (float16-representable) values."""
  from fedjax_inv.aggregation.aggregators import outer_product_geo_stats
  rng = np.random.default_rng(3)
  a = jnp.asarray(rng.normal(size=(16, 5)), jnp.float16)
  d = jnp.asarray(rng.normal(size=(16, 4)) * 1e-2, jnp.float16)
  m = jnp.asarray((rng.random(16) > 0.2).astype(np.float32))
  half = outer_product_geo_stats(a, d, m)
  full = outer_product_geo_stats(a.astype(jnp.float32), d.astype(jnp.float32), m)
  for h in half:
    assert h.dtype == jnp.float32
  chex.assert_trees_all_close(half, full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("zeros", ["both", "negative"])
def test_outer_product_geo_stats_with_exact_zeros_equals_the_per_example_path(zeros):
  """Per-example products a_i ⊗ d_i with exact zeros (and -0.0) in both factors: the
  closed form's counts and log sums equal ``summed_geo_stats`` of the explicit products,
  for both zero conventions (the sign sets and the zero counts are where they differ)."""
  from fedjax_inv.aggregation.aggregators import outer_product_geo_stats, summed_geo_stats
  rng = np.random.default_rng(7)
  a = rng.normal(size=(12, 4)).astype(np.float32)
  d = rng.normal(size=(12, 3)).astype(np.float32)
  a[rng.random(a.shape) < 0.3] = 0.0
  d[rng.random(d.shape) < 0.3] = -0.0
  a[0, :], d[1, :] = 0.0, 0.0  # whole rows of zeros too
  mask = jnp.asarray((rng.random(12) > 0.25).astype(np.float32))
  closed = outer_product_geo_stats(jnp.asarray(a), jnp.asarray(d), mask, zeros=zeros)
  explicit = summed_geo_stats(jnp.asarray(a[:, :, None] * d[:, None, :]), mask, zeros=zeros)
  chex.assert_trees_all_close(closed, explicit, rtol=2e-6, atol=2e-5)
  assert float(jnp.sum(explicit.zero_neg)) > 0  # the zero entries are really exercised


def test_and_mask_rescale_divides_by_epsilon_plus_the_mean():
  """Parascandolo et al.'s rescale: m / (1e-10 + mean(m)); with 1 of 10^6 entries kept
  the 1e-10 is 1e-4 of the mean, so the constant itself is checked."""
  from fedjax_inv.aggregation.aggregators import agreement_mask
  a = jnp.zeros(10**6).at[3].set(1.0)
  m = agreement_mask(a, 0.5, "and_mask", rescale=True)
  np.testing.assert_allclose(float(m[3]), 1.0 / (1e-10 + 1e-6), rtol=1e-6)
  assert float(jnp.max(jnp.abs(m.at[3].set(0.0)))) == 0.0


def test_aggregator_names_and_defaults():
  """Names recorded in results, and the defaults of the masking constructors: rule 'gma'
  (a disagreeing coordinate keeps its agreement A, not 0) and no rescale."""
  from fedjax_inv.aggregation.aggregators import mask_step, masking_aggregator, sign_agreement
  from fedjax_inv.core.algorithm import HPARAMS, Context

  def context(extras):
    return Context(params=None, round=jnp.int32(0), extras=extras, client={},
                   num_clients=jnp.float32(3), cohort=jnp.float32(3))

  assert geometric_mean_aggregator("both").name == "geometric[both]"
  assert geometric_mean_aggregator("negative").name == "geometric[negative]"
  assert sign_agreement().name == "sign_agreement"
  assert masking_aggregator(weighted_mean(), 0.5).name == "gma[tau=0.5](mean)"
  # three clients, signs (+, +, -) on the coordinate: A = |mean sign| = 1/3 < τ = 0.5
  upd = jnp.asarray([[1.0], [2.0], [-3.0]])
  masking = masking_aggregator(weighted_mean(), 0.5)
  stats = jax.tree.map(lambda *s: sum(s), *[masking.lift(u, jnp.float32(1.0)) for u in upd])
  out = masking.finalize(stats)
  np.testing.assert_allclose(np.asarray(out.mask), [1 / 3], rtol=1e-6)  # gma, not 0
  # a sweep replica's traced tau (hparams) replaces the built one: τ = 0 keeps everything
  np.testing.assert_allclose(np.asarray(masking.finalize(stats, {"tau": 0.0}).mask), [1.0])
  step = mask_step(0.5)
  ctx = context({})
  u = jnp.asarray([6.0])
  out, _ = step.update(u, step.init(u), messages={"sign": jnp.asarray([1 / 3])}, ctx=ctx)
  np.testing.assert_allclose(np.asarray(out), [2.0], rtol=1e-6)  # 6 · A: gma, no rescale
  ctx = context({HPARAMS: {"tau": 0.0}})
  out, _ = step.update(u, step.init(u), messages={"sign": jnp.asarray([1 / 3])}, ctx=ctx)
  np.testing.assert_allclose(np.asarray(out), [6.0])
