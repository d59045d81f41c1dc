"""Behaviour tests for fedjax_inv.aggregators (FedILC §3.1, AND-mask, FedGMA §4)."""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv import aggregators as agg
from fedjax_inv.aggregators import (
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
  assert agg.Aggregator._fields == ("lift", "finalize", "name")
