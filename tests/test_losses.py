"""fedjax_inv.core.losses against closed forms computed by hand.

The loss closed forms also run on the test oracle's own plain-jax.numpy losses
(``tests/reference.py``), which the engine-vs-reference tests compare the engine against.
(Masked rows holding inf/NaN: tests/test_masked_rows.py.)
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv.core import losses
from tests import reference as oracle

LOG2 = math.log(2.0)
# per_example_loss / mean_loss implementations checked against the same closed forms
IMPLS = pytest.mark.parametrize("impl", [losses, oracle], ids=["fedjax_inv", "oracle"])


def _sigmoid(z):
  return 1.0 / (1.0 + math.exp(-z))


# ---------------------------------------------------------------------------------------
# per_example_loss
# ---------------------------------------------------------------------------------------


@IMPLS
def test_binary_cross_entropy_closed_form(impl):
  # logit 0 is p = 1/2 for either label: log 2. logit ln 3 is p = 3/4: -log(3/4) for
  # label 1, -log(1/4) = log 4 for label 0.
  z = jnp.asarray([[0.0], [0.0], [math.log(3.0)], [math.log(3.0)], [2.0]], jnp.float32)
  y = jnp.asarray([0, 1, 1, 0, 1])
  got = impl.per_example_loss("binary", z, y)
  want = [LOG2, LOG2, -math.log(0.75), math.log(4.0), -math.log(_sigmoid(2.0))]
  assert got.shape == (5,)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
  # [n] logits are accepted as well as [n, 1]
  np.testing.assert_allclose(np.asarray(impl.per_example_loss("binary", z[:, 0], y)),
                             want, rtol=1e-6)


@IMPLS
def test_binary_cross_entropy_is_stable_for_large_logits(impl):
  z = jnp.asarray([100.0, -100.0, 100.0, -100.0], jnp.float32)
  y = jnp.asarray([1, 0, 0, 1])
  got = np.asarray(impl.per_example_loss("binary", z, y))
  # right and confident: e^-100 (float32 rounds it to ~0); wrong and confident: 100 nats
  np.testing.assert_allclose(got, [0.0, 0.0, 100.0, 100.0], atol=1e-6)


@IMPLS
def test_multiclass_cross_entropy_closed_form(impl):
  # Equal logits: softmax = 1/K, loss log K. Logits (log 1, log 2, log 7): softmax
  # (0.1, 0.2, 0.7), so the loss is -log of the labelled class's probability.
  z = jnp.asarray([[5.0, 5.0, 5.0, 5.0],
                   [0.0, math.log(2.0), math.log(7.0), -1e9],
                   [0.0, math.log(2.0), math.log(7.0), -1e9],
                   [0.0, math.log(2.0), math.log(7.0), -1e9]], jnp.float32)
  y = jnp.asarray([3, 0, 1, 2])
  got = impl.per_example_loss("multiclass", z, y)
  want = [math.log(4.0), -math.log(0.1), -math.log(0.2), -math.log(0.7)]
  assert got.shape == (4,)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)
  # shift invariance with large logits (exp(500) would overflow float32): the same
  # losses, up to the float32 spacing of numbers near 500 (~3e-5)
  np.testing.assert_allclose(np.asarray(impl.per_example_loss("multiclass", z + 500.0, y)),
                             want, atol=2e-4)


@IMPLS
def test_squared_error_closed_form(impl):
  pred = jnp.asarray([[1.5], [-2.0], [0.0]], jnp.float32)
  target = jnp.asarray([0.5, 1.0, 0.0], jnp.float32)
  got = impl.per_example_loss("regression", pred, target)
  np.testing.assert_allclose(np.asarray(got), [1.0, 9.0, 0.0], rtol=1e-7)


@pytest.mark.parametrize("fn", [losses.per_example_loss, losses.mean_loss,
                                losses.per_example_correct])
def test_unknown_kind_raises(fn):
  with pytest.raises(ValueError, match="'hinge'"):
    fn("hinge", jnp.zeros((2, 1)), jnp.zeros((2,)))


def test_check_kind():
  for kind in ("binary", "multiclass", "regression"):
    losses.check_kind(kind)
  with pytest.raises(ValueError, match="'softmax' is not one of"):
    losses.check_kind("softmax")


# ---------------------------------------------------------------------------------------
# weighted_mean and mean_loss
# ---------------------------------------------------------------------------------------


def test_mask_rows_sets_dropped_rows_to_zero_or_fill():
  x = jnp.asarray([[1.0, 2.0], [jnp.inf, jnp.nan], [3.0, -4.0]])
  keep = jnp.asarray([True, False, True])
  # default fill: exactly 0 on the dropped row, the kept rows unchanged
  np.testing.assert_array_equal(np.asarray(losses.mask_rows(x, keep)),
                                [[1.0, 2.0], [0.0, 0.0], [3.0, -4.0]])
  np.testing.assert_array_equal(np.asarray(losses.mask_rows(x, keep, fill=-1.0)),
                                [[1.0, 2.0], [-1.0, -1.0], [3.0, -4.0]])
  # the cotangent of a dropped row is exactly 0
  g = jax.grad(lambda x: jnp.sum(losses.mask_rows(x, keep) ** 2))(x)
  np.testing.assert_array_equal(np.asarray(g), [[2.0, 4.0], [0.0, 0.0], [6.0, -8.0]])


def test_weighted_mean_uses_the_weights():
  v = jnp.asarray([1.0, 2.0, 3.0, 10.0])
  w = jnp.asarray([1.0, 0.5, 2.0, 0.0])
  # (1·1 + 0.5·2 + 2·3) / 3.5 = 8 / 3.5; the 10 has weight 0
  np.testing.assert_allclose(float(losses.weighted_mean(v, w)), 8.0 / 3.5, rtol=1e-6)
  # scale-free in the weights
  np.testing.assert_allclose(float(losses.weighted_mean(v, 4.0 * w)), 8.0 / 3.5, rtol=1e-6)
  # no weights: the plain mean
  np.testing.assert_allclose(float(losses.weighted_mean(v, None)), 4.0, rtol=1e-7)
  # 0/1 weights: the mean of the kept rows
  np.testing.assert_allclose(float(losses.weighted_mean(v, jnp.asarray([1., 1., 0., 0.]))),
                             1.5, rtol=1e-7)


def test_weighted_mean_gradient_is_the_weights_over_their_sum():
  v = jnp.asarray([1.0, 2.0, 3.0, 10.0])
  w = jnp.asarray([1.0, 0.5, 2.0, 0.0])
  g = jax.grad(losses.weighted_mean)(v, w)
  np.testing.assert_allclose(np.asarray(g), np.asarray(w) / 3.5, rtol=1e-6)


def test_weighted_mean_is_exact_for_tiny_positive_weights():
  # Σw = 3e-13 (well below any floor): still Σ w v / Σ w
  v = jnp.asarray([1.0, 4.0, 100.0])
  w = jnp.asarray([1e-13, 2e-13, 0.0])
  np.testing.assert_allclose(float(losses.weighted_mean(v, w)), 3.0, rtol=1e-5)
  g = jax.grad(losses.weighted_mean)(v, w)
  np.testing.assert_allclose(np.asarray(g), [1 / 3, 2 / 3, 0.0], rtol=1e-5)


def test_weighted_mean_all_zero_weights_is_zero():
  v = jnp.asarray([1.0, 2.0, 3.0])
  w = jnp.zeros(3)
  assert float(losses.weighted_mean(v, w)) == 0.0
  g = jax.grad(losses.weighted_mean)(v, w)
  np.testing.assert_array_equal(np.asarray(g), 0.0)
  assert float(losses.mean_loss("binary", jnp.ones((3, 1)), jnp.ones(3), w)) == 0.0


@IMPLS
def test_mean_loss_with_fractional_weights(impl):
  z = jnp.asarray([[0.0], [math.log(3.0)], [math.log(3.0)]], jnp.float32)
  y = jnp.asarray([1, 1, 0])
  w = jnp.asarray([0.25, 1.0, 0.75], jnp.float32)
  per = [LOG2, -math.log(0.75), math.log(4.0)]
  want = sum(wi * li for wi, li in zip([0.25, 1.0, 0.75], per)) / 2.0
  np.testing.assert_allclose(float(impl.mean_loss("binary", z, y, w)), want, rtol=1e-6)
  # without weights: the plain mean, which differs
  np.testing.assert_allclose(float(impl.mean_loss("binary", z, y)), sum(per) / 3,
                             rtol=1e-6)
  assert abs(want - sum(per) / 3) > 1e-2


@IMPLS
def test_mean_loss_multiclass_and_regression_weighted(impl):
  z = jnp.asarray([[0.0, 0.0], [0.0, math.log(3.0)], [7.0, -7.0]], jnp.float32)
  y = jnp.asarray([0, 1, 1])
  w = jnp.asarray([2.0, 1.0, 0.0])  # the third row (a large loss) is padding
  want = (2.0 * LOG2 + 1.0 * -math.log(0.75)) / 3.0
  np.testing.assert_allclose(float(impl.mean_loss("multiclass", z, y, w)), want,
                             rtol=1e-6)
  pred = jnp.asarray([1.0, 3.0, 100.0])
  t = jnp.asarray([0.0, 1.0, 0.0])
  np.testing.assert_allclose(float(impl.mean_loss("regression", pred, t, w)),
                             (2.0 * 1.0 + 1.0 * 4.0) / 3.0, rtol=1e-6)


@IMPLS
def test_mean_loss_gradient_ignores_zero_weight_rows(impl):
  z = jnp.asarray([[0.5], [-1.0], [3.0]], jnp.float32)
  y = jnp.asarray([1.0, 0.0, 0.0])
  w = jnp.asarray([1.0, 3.0, 0.0])
  g = jax.grad(impl.mean_loss, argnums=1)("binary", z, y, w)
  # d/dz of sigmoid cross-entropy is σ(z) - y, times w / Σw
  want = [(_sigmoid(0.5) - 1.0) * 0.25, _sigmoid(-1.0) * 0.75, 0.0]
  np.testing.assert_allclose(np.asarray(g)[:, 0], want, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------
# per_example_correct
# ---------------------------------------------------------------------------------------


def test_per_example_correct_binary():
  z = jnp.asarray([[2.0], [-0.5], [0.3], [-4.0], [0.0]])
  y = jnp.asarray([1, 0, 0, 1, 0])
  got = losses.per_example_correct("binary", z, y)
  # logit > 0 predicts 1; logit 0 predicts 0
  np.testing.assert_array_equal(np.asarray(got), [1.0, 1.0, 0.0, 0.0, 1.0])
  assert got.dtype == jnp.float32


def test_per_example_correct_multiclass():
  z = jnp.asarray([[0.1, 0.7, 0.2], [3.0, -1.0, 0.0], [0.0, 0.0, 5.0], [1.0, 2.0, 0.0]])
  y = jnp.asarray([1, 0, 1, 2])
  got = losses.per_example_correct("multiclass", z, y)
  np.testing.assert_array_equal(np.asarray(got), [1.0, 1.0, 0.0, 0.0])


def test_per_example_correct_rejects_regression():
  with pytest.raises(ValueError, match="'regression'"):
    losses.per_example_correct("regression", jnp.zeros((2, 1)), jnp.zeros(2))
