import numpy as np
import pytest

from fedjax_inv.core.data import from_client_arrays


def test_stacks_and_pads_clients_of_different_sizes():
  xs = [np.ones((3, 2)), 2 * np.ones((5, 2))]
  ys = [np.array([0, 1, 0]), np.array([1, 1, 1, 0, 0])]
  d = from_client_arrays(xs, ys)
  assert d.x.shape == (2, 5, 2) and d.y.shape == (2, 5)
  np.testing.assert_array_equal(np.asarray(d.n), [3, 5])
  np.testing.assert_array_equal(np.asarray(d.mask()), [[1, 1, 1, 0, 0], [1] * 5])
  assert float(d.x[0, 3:].sum()) == 0.0  # zero padding
  sub = d.take(np.array([1]))
  assert sub.num_clients == 1 and int(sub.n[0]) == 5
  merged = d.merged()
  assert merged.num_clients == 1 and int(merged.n[0]) == 8


def test_regression_targets_stay_float():
  d = from_client_arrays([np.zeros((2, 1))], [np.array([0.5, 1.5])])
  assert d.y.dtype == np.float32


@pytest.mark.parametrize("xs,ys,match", [
    ([], [], "0 clients"),
    ([np.ones((2, 3))], [np.ones(2), np.ones(2)], "2 y arrays"),
    ([np.ones((0, 3))], [np.ones(0)], "0 examples"),
    ([np.ones((2, 3)), np.ones((2, 4))], [np.ones(2), np.ones(2)], "feature shape"),
    ([np.ones((2, 3))], [np.ones(3)], "3 labels"),
])
def test_bad_input_is_named(xs, ys, match):
  with pytest.raises(ValueError, match=match):
    from_client_arrays(xs, ys)


def test_n_max_too_small():
  with pytest.raises(ValueError, match="n_max=1"):
    from_client_arrays([np.ones((2, 3))], [np.ones(2)], n_max=1)
