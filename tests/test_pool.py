"""fedjax_inv.models.pool.max_pool against flax's nnx.max_pool (lax.reduce_window).

Forward values must be bitwise equal; gradients equal wherever the window maximum is
unique (continuous random inputs: ties have probability 0). At ties, non-overlapping windows
route the cotangent as select_and_scatter does (to the first maximum), so their gradients
are bitwise equal too; overlapping windows split it evenly, and after a ReLU the parameter
gradients still agree (issue 30).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from fedjax_inv.models.pool import max_pool

CASES = [  # (input shape [B, *spatial, C], window, strides, padding)
    ((2, 13, 13, 3), (2, 2), (2, 2), "VALID"),      # odd size: the last row/column dropped
    ((2, 6, 7, 2), (2, 2), None, "VALID"),         # default strides: 1, as in nnx
    ((2, 7, 5, 4), (2, 2), (2, 2), "VALID"),
    ((1, 11, 11, 2), (3, 3), (2, 2), ((1, 1), (1, 1))),  # ResNet's stem pool
    ((2, 9, 8, 2), (3, 3), (1, 1), "SAME"),
    ((2, 10, 7, 3), (2, 3), (1, 2), "VALID"),        # overlapping in H, gaps in none
    ((2, 9, 9, 1), (2, 2), (3, 3), "VALID"),         # strides > window: gaps
    ((3, 12, 2), (3,), (3,), "VALID"),               # one spatial axis
    ((2, 6, 5, 4, 2), (2, 2, 2), (2, 2, 2), ((0, 1), (0, 0), (1, 0))),  # 3-D, padded
]


def _ids(c):
  return f"x{c[0]}-w{c[1]}-s{c[2]}-{c[3]}"


@pytest.mark.parametrize("shape,window,strides,padding", CASES, ids=[_ids(c) for c in CASES])
def test_forward_equals_nnx_and_gradient_without_ties(shape, window, strides, padding):
  x = jax.random.normal(jax.random.key(0), shape)
  ours = max_pool(x, window, strides, padding)
  ref = nnx.max_pool(x, window, strides=strides, padding=padding)
  assert ours.shape == ref.shape
  np.testing.assert_array_equal(np.asarray(ours), np.asarray(ref))
  ct = jax.random.normal(jax.random.key(1), ref.shape)
  g = jax.grad(lambda x: jnp.sum(max_pool(x, window, strides, padding) * ct))(x)
  g_ref = jax.grad(lambda x: jnp.sum(nnx.max_pool(x, window, strides=strides,
                                                  padding=padding) * ct))(x)
  np.testing.assert_allclose(np.asarray(g), np.asarray(g_ref), rtol=0, atol=1e-6)
  assert np.count_nonzero(np.asarray(g)) > 0


def test_ties_in_non_overlapping_windows_go_to_the_first_maximum():
  x = jnp.ones((1, 2, 2, 1))  # one window, four tied maxima
  g = jax.grad(lambda x: jnp.sum(max_pool(x, (2, 2), (2, 2))))(x)
  np.testing.assert_array_equal(np.asarray(g).ravel(), [1.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize("shape,window", [((3, 8, 8, 4), (2, 2)), ((2, 9, 7, 3), (2, 3)),
                                          ((2, 12, 3), (3,)), ((2, 4, 6, 4, 2), (2, 2, 2))])
def test_gradient_with_many_ties_equals_nnx_bitwise(shape, window):
  # Rounded, ReLU'd inputs: most windows hold tied maxima (zeros and repeated values).
  x = jax.nn.relu(jnp.round(2 * jax.random.normal(jax.random.key(4), shape)) / 2)
  ct = jax.random.normal(jax.random.key(5), max_pool(x, window, window).shape)
  g = jax.grad(lambda x: jnp.sum(max_pool(x, window, window) * ct))(x)
  g_ref = jax.grad(lambda x: jnp.sum(nnx.max_pool(x, window, strides=window) * ct))(x)
  np.testing.assert_array_equal(np.asarray(g), np.asarray(g_ref))
  x_r = x.reshape(-1)
  assert np.count_nonzero(np.asarray(x_r) == 0) > x_r.size // 4  # ties really occur


def test_overlapping_windows_split_ties_evenly():
  x = jnp.ones((1, 3, 3, 1))  # 2x2 windows, stride 1: every window all tied
  g = jax.grad(lambda x: jnp.sum(max_pool(x, (2, 2), (1, 1))))(x)
  g_ref = jax.grad(lambda x: jnp.sum(nnx.max_pool(x, (2, 2), strides=(1, 1))))(x)
  np.testing.assert_allclose(float(jnp.sum(g)), float(jnp.sum(g_ref)))  # totals agree
  np.testing.assert_allclose(np.asarray(g)[0, 1, 1, 0], 1.0)  # 4 windows x 1/4


def test_parameter_gradients_agree_after_relu_with_dead_windows():
  # conv - 2 -> ReLU -> pool with many all-zero windows (ties at 0): ReLU'(0) = 0 makes the
  # parameter gradients equal even though the pools route tied cotangents differently.
  x = jax.random.normal(jax.random.key(2), (4, 10, 10, 2))
  w = jax.random.normal(jax.random.key(3), (3, 3, 2, 5))

  def loss(w, pool):
    h = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC")) - 2.0
    return jnp.sum(jnp.sin(pool(jax.nn.relu(h))))

  ours = jax.grad(loss)(w, lambda h: max_pool(h, (2, 2), (2, 2)))
  ref = jax.grad(loss)(w, lambda h: nnx.max_pool(h, (2, 2), strides=(2, 2)))
  h = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                   dimension_numbers=("NHWC", "HWIO", "NHWC")) - 2.0
  assert float(jnp.mean(h <= 0)) > 0.5  # the case is really exercised
  np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(x=jnp.zeros((4, 4)), window_shape=(2, 2)), "needs \\[B, \\*spatial, C\\]"),
    (dict(x=jnp.zeros((1, 4, 4, 1)), window_shape=(2,)), "one window"),
    (dict(x=jnp.zeros((1, 4, 4, 1)), window_shape=(0, 2)), "must be positive"),
    (dict(x=jnp.zeros((1, 4, 4, 1)), window_shape=(2, 2), padding="FULL"), "padding='FULL'"),
    (dict(x=jnp.zeros((1, 4, 4, 1)), window_shape=(2, 2), padding=((1, 1),)), "pairs"),
    (dict(x=jnp.zeros((1, 2, 2, 1)), window_shape=(3, 3)), "larger than the padded input"),
])
def test_bad_arguments_raise(kwargs, match):
  with pytest.raises(ValueError, match=match):
    max_pool(**kwargs)
