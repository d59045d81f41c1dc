"""Bad data is refused with a clear ValueError before anything compiles (issue 11):
labels against the task kind, model input/output sizes, NaN and dtypes."""
import numpy as np
import pytest

from fedjax_inv import Task, from_client_arrays, models
from fedjax_inv.core.data import ClientData


def _arrays(labels, n=6, d=3, dtype=np.int32):
  rng = np.random.default_rng(0)
  xs = [rng.normal(size=(n, d)).astype(np.float32) for _ in labels]
  ys = [np.asarray(l, dtype) for l in labels]
  return xs, ys


def test_binary_task_refuses_labels_outside_0_1():
  # The defect: labels 0..5 with kind "binary" trained to a loss of -940.
  xs, ys = _arrays([[0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 0, 1]])
  data = from_client_arrays(xs, ys)
  with pytest.raises(ValueError, match=r"train labels span 0\.\.5.*kind 'binary'"):
    Task("t", "binary", data, {}, models.mlp(3, (4,), 1), {})


def test_multiclass_labels_checked_against_model_outputs():
  xs, ys = _arrays([[0, 1, 2, 3, 4, 5]])
  data = from_client_arrays(xs, ys)
  with pytest.raises(ValueError, match="give the model 6 outputs"):
    Task("t", "multiclass", data, {}, models.mlp(3, (4,), 4), {})
  Task("t", "multiclass", data, {}, models.mlp(3, (4,), 6), {})  # fits: no error
  neg = from_client_arrays(*_arrays([[0, -1, 2, 1, 0, 1]]))
  with pytest.raises(ValueError, match=r"span -1\.\.2"):
    Task("t", "multiclass", data, {"ood": neg}, models.mlp(3, (4,), 6), {})


def _with_label(data, client, row, value):
  y = np.array(data.y)
  y[client, row] = value
  return ClientData(x=data.x, y=y, n=data.n)


@pytest.mark.parametrize("bad", [7, -3])
def test_padding_rows_are_not_checked(bad):
  """Only real rows count: a label outside {0, 1} in a padded row (past n[i]) is
  accepted, while the same value in a real row of the same client is refused."""
  xs, ys = _arrays([[1, 1, 1, 1, 1, 1]])
  xs.append(xs[0][:2])
  ys.append(np.array([1, 0], np.int32))
  data = from_client_arrays(xs, ys)
  assert np.asarray(data.n).tolist() == [6, 2] and data.y.shape == (2, 6)
  padded = _with_label(data, 1, slice(2, None), bad)    # rows 2..5 of client 1: padding
  model = models.mlp(3, (4,), 1)
  Task("t", "binary", padded, {}, model, {})           # no error
  Task("t", "binary", data, {"ood": padded}, model, {})  # eval sets alike
  real = _with_label(data, 1, 0, bad)                    # row 0 of client 1: real
  lo, hi = min(bad, 0), max(bad, 1)
  with pytest.raises(ValueError, match=rf"train labels span {lo}\.\.{hi}"):
    Task("t", "binary", real, {}, model, {})
  with pytest.raises(ValueError, match=rf"ood labels span {lo}\.\.{hi}"):
    Task("t", "binary", data, {"ood": real}, model, {})


@pytest.mark.parametrize("kind,outputs,match", [
    ("binary", 2, "needs a model with 1 output"),
    ("multiclass", 1, ">= 2 model outputs"),
    ("segmentation", 1, "kind='segmentation'"),
])
def test_kind_and_output_size(kind, outputs, match):
  data = from_client_arrays(*_arrays([[0, 1, 0, 1, 0, 1]]))
  with pytest.raises(ValueError, match=match):
    Task("t", kind, data, {}, models.mlp(3, (4,), outputs), {})


def test_regression_needs_float_targets_and_classification_int_labels():
  ints = from_client_arrays(*_arrays([[0, 1, 0, 1, 0, 1]]))
  floats = from_client_arrays(*_arrays([[0.5, 1, 0, 1, 0, 1]], dtype=np.float32))
  with pytest.raises(ValueError, match="needs float targets"):
    Task("t", "regression", ints, {}, models.mlp(3, (4,), 1), {})
  with pytest.raises(ValueError, match="needs integer labels"):
    Task("t", "binary", floats, {}, models.mlp(3, (4,), 1), {})


def test_model_input_shape_mismatch():
  data = from_client_arrays(*_arrays([[0, 1, 0, 1, 0, 1]]))
  with pytest.raises(ValueError, match=r"does not accept inputs of shape \(3,\)"):
    Task("t", "binary", data, {}, models.mlp(5, (4,), 1), {})
  other = from_client_arrays(*_arrays([[0, 1, 0, 1, 0, 1]], d=5))
  with pytest.raises(ValueError, match="eval set 'ood' has feature shape"):
    Task("t", "binary", data, {"ood": other}, models.mlp(3, (4,), 1), {})


@pytest.mark.parametrize("where", ["x", "y"])
def test_from_client_arrays_refuses_nan(where):
  xs, ys = _arrays([[0.5, 1, 0, 1, 0, 1]], dtype=np.float32)
  (xs if where == "x" else ys)[0][2] = np.nan
  with pytest.raises(ValueError, match=f"non-finite .* in {where}"):
    from_client_arrays(xs, ys)


def test_from_client_arrays_refuses_bad_shapes_and_dtypes():
  xs, ys = _arrays([[0, 1, 0, 1, 0, 1]])
  with pytest.raises(ValueError, match="y needs \\[n_i\\]"):
    from_client_arrays(xs, [ys[0][:, None]])
  with pytest.raises(ValueError, match="dtype <U1"):
    from_client_arrays(xs, [np.array(list("abcdef"))])


@pytest.mark.parametrize("chunk", [0, -3, 2.5, True])
def test_build_round_refuses_chunk_size_below_one_instead_of_replacing_it(chunk):
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.core.engine import build_round
  alg = make_algorithm("fedavg")
  with pytest.raises(ValueError, match=f"chunk_size={chunk!r}"):
    build_round(models.mlp(3, (4,), 1), "binary", alg, 4, 4, execution="chunked",
                chunk_size=chunk)
