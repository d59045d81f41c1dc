"""synthetic_hospital (Invariant FedAvg eq. 16-19) and linear_regression (eq. 20-23)."""
import numpy as np
import pytest

from fedjax_inv import tasks
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.runner.simulation import run
from fedjax_inv.data import synthetic


def within(p_hat, p, n, sigmas=5.0):
  return abs(p_hat - p) <= sigmas * np.sqrt(p * (1 - p) / n) + 1e-12


def client_arrays(data, i):
  n = int(data.n[i])
  return np.asarray(data.x[i, :n]), np.asarray(data.y[i, :n])


# -------------------------------------------------------------- hospital ---


def test_hospital_env_label_rule_flip_rates_and_dims():
  n = 20000
  env = synthetic.sample_hospital_env(n, 0.2, np.random.default_rng(0), label_noise=0.25)
  x, y = env["x"], env["y"]
  assert x.shape == (n, 11) and x.dtype == np.float32
  assert y.dtype == np.int32 and set(np.unique(y)) == {0, 1}
  # eq. 18 on the clean label, from the first d_inv = 5 features only.
  np.testing.assert_array_equal(env["y_clean"], (x[:, :5].sum(axis=1) > 0))
  assert within(np.mean(y != env["y_clean"]), 0.25, n)
  # eq. 19: the spurious feature is the observed label flipped with p_e.
  spu = x[:, 10]
  assert set(np.unique(spu)) == {0.0, 1.0}
  assert within(np.mean(spu != y), 0.2, n)
  # x_inv, x_rand ~ N(0, 1); x_rand is unrelated to y.
  np.testing.assert_allclose(x[:, :10].mean(axis=0), 0.0, atol=0.05)
  np.testing.assert_allclose(x[:, :10].std(axis=0), 1.0, atol=0.05)
  for j in range(5, 10):
    assert abs(np.corrcoef(x[:, j], y)[0, 1]) < 5 / np.sqrt(n)


def test_hospital_task_defaults_and_paper_statistics():
  n = 20000
  task = tasks.make_task("synthetic_hospital", n_per_client=n)
  assert task.kind == "binary"
  assert task.train.num_clients == 2 and task.train.feature_shape == (11,)
  assert set(task.eval_sets) == {"ood"} and task.eval_sets["ood"].num_clients == 1
  assert task.info["env_probs"] == [0.1, 0.2] and task.info["ood_prob"] == 0.9
  assert {"paper", "dataset_source", "data_note"} <= set(task.info)
  # The paper's statement: a classifier using only x_spu scores 0.85 on the training
  # clients and 0.10 on the OOD client (and label noise caps the invariant one at 0.75).
  accs = []
  for i, p in enumerate((0.1, 0.2)):
    x, y = client_arrays(task.train, i)
    assert within(np.mean(x[:, 10] != y), p, n)
    accs.append(np.mean(x[:, 10] == y))
    assert within(np.mean((x[:, :5].sum(1) > 0) == y), 0.75, n)
  assert abs(np.mean(accs) - 0.85) < 0.01
  x, y = client_arrays(task.eval_sets["ood"], 0)
  assert within(np.mean(x[:, 10] == y), 0.1, n)
  # The model is the paper's MLP with one 10-unit hidden layer.
  params = task.model.init(0)
  assert params["classifier"]["kernel"].shape == (10, 1)


def test_hospital_without_label_noise_is_eq18_exactly():
  task = tasks.make_task("synthetic_hospital", n_per_client=500, label_noise=0.0)
  for i in range(2):
    x, y = client_arrays(task.train, i)
    np.testing.assert_array_equal(y, (x[:, :5].sum(axis=1) > 0))


def test_hospital_robustness_setting_draws_k_clients():
  task = tasks.make_task("synthetic_hospital", n_per_client=50, num_clients=7, seed=3)
  assert task.train.num_clients == 7
  probs = np.asarray(task.info["env_probs"])
  assert probs.shape == (7,) and np.all((0 <= probs) & (probs <= 0.2))
  assert len(set(probs.tolist())) == 7
  same = tasks.make_task("synthetic_hospital", n_per_client=50, num_clients=7, seed=3)
  np.testing.assert_array_equal(np.asarray(task.train.x), np.asarray(same.train.x))
  other = tasks.make_task("synthetic_hospital", n_per_client=50, num_clients=7, seed=4)
  assert not np.array_equal(np.asarray(task.train.x), np.asarray(other.train.x))


@pytest.mark.parametrize("kw,match", [
    (dict(env_probs=(0.1,), num_clients=3), "not both"),
    (dict(env_probs=(0.1, 1.5)), "env_probs"), (dict(ood_prob=-0.1), "ood_prob"),
    (dict(n_per_client=0), "n_per_client"), (dict(label_noise=2.0), "label_noise"),
    (dict(num_clients=0), "num_clients"), (dict(env_probs=()), "empty"),
])
def test_hospital_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    tasks.make_task("synthetic_hospital", **kw)


# ------------------------------------------------------------- regression ---


def ols(x, y):
  a = np.concatenate([x, np.ones((len(x), 1))], axis=1)
  return np.linalg.lstsq(a, y, rcond=None)[0][:-1]


def test_example1_generative_equations():
  rng = np.random.default_rng(0)
  w_yx, w_xy = synthetic.example1_weights(5, 3, rng)
  assert w_yx.shape == (5, 5) and w_xy.shape == (3, 5)
  env = synthetic.sample_example1_env(40000, 2.0, 0.5, w_yx, w_xy, rng)
  x, y, yt = env["x"].astype(np.float64), env["y"].astype(np.float64), env["y_tilde"]
  x_inv, x_spu = x[:, :5], x[:, 5:]
  np.testing.assert_allclose(x_inv.std(axis=0), 2.0, rtol=0.03)           # eq. 20
  np.testing.assert_allclose(ols(x_inv, yt), w_yx.T, atol=0.03)            # eq. 21
  np.testing.assert_allclose((yt - x_inv @ w_yx.T).std(axis=0), 1.0, rtol=0.03)
  np.testing.assert_allclose(ols(yt, x_spu), w_xy.T, atol=0.03)            # eq. 22
  np.testing.assert_allclose((x_spu - yt @ w_xy.T).std(axis=0), 0.5, rtol=0.03)
  np.testing.assert_allclose(y, yt.sum(axis=1), rtol=1e-5, atol=1e-4)      # eq. 23


def test_example1_shuffle_permutes_only_the_spurious_block():
  w_yx, w_xy = synthetic.example1_weights(5, 5, np.random.default_rng(1))
  a = synthetic.sample_example1_env(100, 1.0, 1.0, w_yx, w_xy, np.random.default_rng(2))
  b = synthetic.sample_example1_env(100, 1.0, 1.0, w_yx, w_xy, np.random.default_rng(2),
                                    shuffle_spurious=True)
  np.testing.assert_array_equal(a["x"][:, :5], b["x"][:, :5])
  np.testing.assert_array_equal(a["y"], b["y"])
  assert not np.array_equal(a["x"][:, 5:], b["x"][:, 5:])
  np.testing.assert_array_equal(np.sort(a["x"][:, 5:], axis=0), np.sort(b["x"][:, 5:], axis=0))


def test_linear_regression_task():
  n = 5000
  task = tasks.make_task("linear_regression", n_per_client=n)
  assert task.kind == "regression"
  assert task.train.num_clients == 3 and task.train.feature_shape == (10,)
  assert np.asarray(task.train.y).dtype == np.float32
  assert set(task.eval_sets) == {"test_env0", "test_env1", "test_env2", "ood"}
  assert task.eval_sets["ood"].num_clients == 3
  for i in range(3):
    xo, yo = client_arrays(task.eval_sets["ood"], i)
    xt, yt = client_arrays(task.eval_sets[f"test_env{i}"], 0)
    np.testing.assert_array_equal(xo, xt)
    np.testing.assert_array_equal(yo, yt)
  coef = np.asarray(task.info["invariant_coef"])
  for i, (sigma, _) in enumerate(((0.1, 5), (1.5, 0.1), (5, 1.5))):
    x, y = client_arrays(task.train, i)
    np.testing.assert_allclose(x[:, :5].std(axis=0), sigma, rtol=0.05)
    # Regressing y on x_inv alone recovers the same (invariant) coefficient everywhere,
    # within 5 standard errors: Var(y | x_inv) = d_inv * sigma_n^2 = 5, Var(x_inv) = s^2.
    tol = 5 * np.sqrt(5 / (sigma**2 * n))
    np.testing.assert_allclose(ols(x[:, :5].astype(np.float64), y), coef, atol=tol)
    # Training data: x_spu is strongly correlated with y where sigma~ is small.
    corr_train = [abs(np.corrcoef(x[:, j], y)[0, 1]) for j in range(5, 10)]
    xt, yt = client_arrays(task.eval_sets[f"test_env{i}"], 0)
    corr_test = [abs(np.corrcoef(xt[:, j], yt)[0, 1]) for j in range(5, 10)]
    # Shuffled test copy: the spurious correlation is gone, the invariant one is kept.
    assert max(corr_test) < 5 / np.sqrt(n)
    np.testing.assert_allclose(ols(xt[:, :5].astype(np.float64), yt), coef, atol=tol)
    if i == 1:   # sigma~ = 0.1: x_spu is nearly a linear function of y~.
      assert max(corr_train) > 0.3
  params = task.model.init(0)
  assert params["classifier"]["kernel"].shape == (30, 1)


@pytest.mark.parametrize("kw,match", [
    (dict(sigmas=((0.1, -5.0),)), "sigmas"), (dict(sigmas=()), "sigmas"),
    (dict(noise_std=0.0), "noise_std"), (dict(n_per_client=0), "n_per_client"),
    (dict(n_test=-1), "n_test"),
])
def test_linear_regression_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    tasks.make_task("linear_regression", **kw)


# ---------------------------------------------------------------- end to end ---


@pytest.mark.parametrize("name,kw", [("synthetic_hospital", dict(n_per_client=200)),
                                     ("linear_regression", dict(n_per_client=100))])
def test_tasks_train_end_to_end(name, kw):
  task = tasks.make_task(name, **kw)
  d = task.defaults
  assert set(d) >= {"rounds", "eval_every", "local_steps", "batch_size",
                    "client_optimizer", "client_lr", "weight_decay"}
  alg = make_algorithm("fedavg", client_lr=0.01, local_steps=5, batch_size=None,
                       client_optimizer="adam")
  res = run(task, alg, rounds=3, eval_every=1, progress=False)
  assert len(res.history) == 3
  metric = "mse" if task.kind == "regression" else "accuracy"
  for s in ("train",) + tuple(task.eval_sets):
    assert np.isfinite(res.final[f"{s}_{metric}"])
  # Training lowers the training loss.
  assert res.history[-1]["train_loss"] < res.history[0]["train_loss"]
