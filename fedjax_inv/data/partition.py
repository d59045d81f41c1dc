"""Seeded partitioners of a dataset over federated clients.

Every partitioner returns ``list[np.ndarray]``: one sorted int64 index array per client,
indexing into the ``labels`` (or domain) it was given. Unless a docstring says otherwise
the arrays are disjoint and cover every index exactly once, and the same ``seed`` always
gives the same partition (``numpy.random.default_rng(seed)``; no global random state).
The label partitioners that Flower Datasets provides (i.i.d., Dirichlet, pathological
``#C=k``) are its own ``flwr_datasets.partitioner`` classes, called on an in-memory
``datasets.Dataset`` of the labels; this module keeps what the papers define and Flower
lacks (the domain splits, leave-one-domain-out).

Partitioners:

* :func:`iid_partition` -- uniform random split into near-equal parts.
* :func:`dirichlet_label_partition` -- "distribution-based label imbalance"
  ``p_c ~ Dir(α 1_N)`` per class (Hsu et al. 2019; NIID-Bench, Li et al. 2022 §4.1).
* :func:`k_classes_per_client` / :func:`quantity_label_imbalance` -- "quantity-based
  label imbalance" ``#C=k``: every client holds exactly ``k`` classes (NIID-Bench §4.1;
  the non-i.i.d. scheme FedGMA §5.2 names).
* :func:`domain_client_counts` / :func:`split_domains_to_clients` -- many clients per
  domain without mixing domains (FedIIR App. F.1, Alg. 2).
* :func:`split_each_domain` -- the same with a fixed number of clients per domain.
* :func:`train_val_split` -- the seeded 90/10 train/validation split of domain tasks.

The FedGMA §5.1 non-i.i.d. tasks built with them are in ``fedjax_inv/tasks/noniid.py``.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

# ---------------------------------------------------------------------------------------
# Pure partitioners (defined before any fedjax_inv.tasks import: other task modules may
# import them while fedjax_inv.tasks is still initialising).
# ---------------------------------------------------------------------------------------


def _labels_1d(labels) -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be a 1-D array of class ids, got shape "
                     f"{list(labels.shape)}; flatten it (labels.reshape(-1)).")
  if labels.size == 0:
    raise ValueError("labels is empty; there is nothing to partition.")
  if not np.issubdtype(labels.dtype, np.integer):
    if not np.all(np.equal(np.mod(labels, 1), 0)):
      raise ValueError(f"labels must be integer class ids, got dtype {labels.dtype} "
                       "with non-integer values.")
    labels = labels.astype(np.int64)
  return labels


def _check_num_clients(num_clients, n: int) -> int:
  if int(num_clients) != num_clients or num_clients < 1:
    raise ValueError(f"num_clients={num_clients!r}; it must be a positive integer.")
  num_clients = int(num_clients)
  if num_clients > n:
    raise ValueError(f"num_clients={num_clients} exceeds the {n} examples; every client "
                     "needs at least one example, so use at most that many clients.")
  return num_clients


# Which Flower Datasets partitioner (and settings) builds each label-skew partition name of
# the tasks; recorded in every such task's data note, so raw results say how their clients
# were made.
FLOWER_PARTITIONERS = {
    "iid": "Flower Datasets' IidPartitioner",
    "dirichlet": "Flower Datasets' DirichletPartitioner, self-balancing",
    "k_classes": "Flower Datasets' PathologicalPartitioner, first-deterministic",
    "quantity": "Flower Datasets' PathologicalPartitioner, first-deterministic",
}


def partitioner_note(partition: str) -> str:
  """``'dirichlet partition: Flower Datasets' DirichletPartitioner, self-balancing'``: the
  words a task's data note uses for its client partition (``'flwr:SPEC'``: Flower
  Datasets' ``SPEC``)."""
  if str(partition).startswith("flwr:"):
    return f"Flower Datasets' {partition[len('flwr:'):]}"
  return f"{partition} partition: {FLOWER_PARTITIONERS[partition]}"


def _sorted(parts) -> list[np.ndarray]:
  return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _flower_split(partitioner, labels: np.ndarray, seed: int, what: str
                  ) -> list[np.ndarray]:
  """Run a ``flwr_datasets.partitioner`` over ``labels`` and read back the row indices.

  The rows go into an in-memory ``datasets.Dataset`` (columns ``label``, ``row``) that is
  shuffled with ``seed`` first, as ``flwr_datasets.FederatedDataset(shuffle=True,
  seed=seed)`` does; partition ``i``'s ``row`` column is client ``i``'s indices. Flower's
  retry warnings are silenced (a failure raises instead). Nothing is written to disk.

  Raises:
    ValueError: Flower refused the arguments or gave up (``what`` names our function).
  """
  import warnings  # pylint: disable=g-import-not-at-top
  from fedjax_inv.data import hf  # pylint: disable=g-import-not-at-top
  datasets, _ = hf._import()  # pylint: disable=protected-access
  table = datasets.Dataset.from_dict({"label": labels.tolist(),
                                      "row": np.arange(len(labels)).tolist()})
  partitioner.dataset = table.shuffle(seed=int(seed))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    try:
      return _sorted(partitioner.load_partition(i)["row"]
                     for i in range(partitioner.num_partitions))
    except ValueError as e:
      raise ValueError(f"{what}: Flower Datasets refused the split: {e}") from e


def _partitioner(name: str, **kw):
  """``flwr_datasets.partitioner.<name>(**kw)``, imported on first use (telemetry off)."""
  from fedjax_inv.data import hf  # pylint: disable=g-import-not-at-top
  hf._import()  # pylint: disable=protected-access
  from flwr_datasets import partitioner as fp  # pylint: disable=g-import-not-at-top
  return getattr(fp, name)(**kw)


def iid_partition(n: int, num_clients: int, seed: int = 0) -> list[np.ndarray]:
  """Uniform random (i.i.d.) split of ``n`` examples into near-equal client shards.

  Flower Datasets' ``IidPartitioner`` over the rows shuffled with ``seed`` (as
  ``FederatedDataset`` shuffles them): contiguous shards of the permutation
  ``numpy.random.default_rng(seed).permutation(n)``, the first ``n mod N`` one example
  longer.

  Args:
    n: number of examples (indices ``0..n-1``).
    num_clients: number of clients ``N`` (``1 <= N <= n``).
    seed: seeds the permutation.

  Returns:
    ``N`` sorted int64 index arrays of sizes ``n // N`` or ``n // N + 1`` that partition
    ``range(n)``.

  Raises:
    ValueError: ``n < 1`` or ``num_clients`` not in ``1..n``.

  Source: the i.i.d. baseline of McMahan et al. 2017 §3 and FedGMA Table 2 ("i.i.d");
  ``flwr_datasets.partitioner.IidPartitioner``.
  """
  if int(n) != n or n < 1:
    raise ValueError(f"n={n!r}; it must be a positive integer number of examples.")
  num_clients = _check_num_clients(num_clients, int(n))
  return _flower_split(_partitioner("IidPartitioner", num_partitions=num_clients),
                       np.zeros(int(n), np.int64), seed, "iid_partition")


def dirichlet_label_partition(labels, num_clients: int, alpha: float, seed: int = 0,
                              min_size: int = 10) -> list[np.ndarray]:
  """Distribution-based label imbalance: class proportions over clients ~ Dir(α).

  Flower Datasets' ``DirichletPartitioner(partition_by="label", alpha=α,
  min_partition_size=min_size, self_balancing=True, seed=seed)`` over the rows shuffled
  with ``seed``: for each class, proportions ``p ~ Dir(α 1_N)``; clients that already
  hold more than ``n / N`` examples get ``p_i = 0`` (the balancing rule of the NIID-Bench
  code), ``p`` is renormalised and the class is cut at ``cumsum(p) · n_c``. The whole draw
  is repeated (at most 10 more times) until every client holds ``>= min_size`` examples.
  Large ``α`` → every client's label mix ≈ the global one; ``α → 0`` → every class sits
  on (almost) a single client.

  Args:
    labels: ``[n]`` integer class ids.
    num_clients: number of clients ``N`` (``1 <= N <= n``).
    alpha: Dirichlet concentration ``α > 0`` (unitless).
    seed: seeds the row shuffle and the draws.
    min_size: minimum examples per client (NIID-Bench uses 10); ``0`` accepts empty
      clients.

  Returns:
    ``N`` sorted int64 index arrays partitioning ``range(n)``.

  Raises:
    ValueError: bad ``labels``/``num_clients``, ``alpha <= 0``, ``min_size < 0``,
      ``min_size · N > n``, or no draw met ``min_size`` (raise ``alpha`` or lower
      ``min_size``).

  Source: Hsu et al. 2019 ("Measuring the effects of non-identical data distribution");
  NIID-Bench (Li et al. 2022, §4.1 "distribution-based label imbalance"); used for
  FedGMA §5.1's non-i.i.d. MNIST / FMNIST / CIFAR-10;
  ``flwr_datasets.partitioner.DirichletPartitioner``.
  """
  labels = _labels_1d(labels)
  n = len(labels)
  num_clients = _check_num_clients(num_clients, n)
  if not np.isfinite(alpha) or alpha <= 0:
    raise ValueError(f"alpha={alpha!r}; the Dirichlet concentration must be > 0 "
                     "(e.g. 0.5; larger is closer to i.i.d.).")
  if int(min_size) != min_size or min_size < 0:
    raise ValueError(f"min_size={min_size!r}; it must be an integer >= 0.")
  if min_size * num_clients > n:
    raise ValueError(f"min_size={min_size} x num_clients={num_clients} exceeds the {n} "
                     "examples; lower min_size or num_clients.")
  what = (f"dirichlet_label_partition(alpha={alpha}, num_clients={num_clients}, "
          f"min_size={min_size}); raise alpha, lower min_size or use fewer clients")
  with np.errstate(invalid="ignore", divide="ignore"):
    parts = _flower_split(_partitioner(
        "DirichletPartitioner", num_partitions=num_clients, partition_by="label",
        alpha=float(alpha), min_partition_size=int(min_size), self_balancing=True,
        shuffle=True, seed=int(seed)), labels, seed, what)
  covered = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
  if len(covered) != n or not np.array_equal(covered, np.arange(n)):
    raise ValueError(f"{what}: the draw did not split every example once (a Dirichlet "
                     "draw underflowed to zero mass).")
  return parts


def k_classes_per_client(labels, num_clients: int, k: int, seed: int = 0
                         ) -> list[np.ndarray]:
  """Quantity-based label imbalance ``#C=k``: each client holds exactly ``k`` classes.

  Flower Datasets' ``PathologicalPartitioner(partition_by="label",
  num_classes_per_partition=k, class_assignment_mode="first-deterministic", seed=seed)``
  over the rows shuffled with ``seed``: client ``i`` owns class ``i mod K`` (in sorted
  class order) and ``k - 1`` further distinct random classes; every class's examples are
  split into equal parts among its owners (``np.array_split``). This is NIID-Bench's
  scheme. With ``N >= K`` every class has an owner and every example is used; with
  ``N < K`` the examples of classes no client drew are left out.

  Args:
    labels: ``[n]`` integer class ids (``K`` distinct classes).
    num_clients: number of clients ``N``.
    k: classes per client, ``1 <= k <= K``, with ``N · k >= K``.
    seed: seeds the row shuffle and the class assignment.

  Returns:
    ``N`` sorted, disjoint int64 index arrays into ``labels``; client ``i`` holds
    examples of exactly ``k`` distinct classes. They cover ``range(n)`` when ``N >= K``.

  Raises:
    ValueError: bad ``labels``/``num_clients``, ``k`` outside ``1..K``, ``N · k < K``
      (some class could have no client), or a class with fewer examples than owners.

  Source: NIID-Bench (Li et al. 2022, §4.1 "quantity-based label imbalance"), as used by
  FedGMA §5.1-5.2; also McMahan et al. 2017's pathological 2-class shards;
  ``flwr_datasets.partitioner.PathologicalPartitioner``.
  """
  labels = _labels_1d(labels)
  n = len(labels)
  num_clients = _check_num_clients(num_clients, n)
  num_classes = len(np.unique(labels))
  if int(k) != k or not 1 <= k <= num_classes:
    raise ValueError(f"k={k!r}; classes per client must be an integer in 1..{num_classes} "
                     f"(the labels hold {num_classes} classes).")
  k = int(k)
  if num_clients * k < num_classes:
    raise ValueError(f"num_clients={num_clients} x k={k} < {num_classes} classes: some "
                     "class would have no client; raise k or num_clients.")
  what = (f"k_classes_per_client(k={k}, num_clients={num_clients}); lower k or "
          "num_clients")
  return _flower_split(_partitioner(
      "PathologicalPartitioner", num_partitions=num_clients, partition_by="label",
      num_classes_per_partition=k, class_assignment_mode="first-deterministic",
      shuffle=True, seed=int(seed)), labels, seed, what)


def quantity_label_imbalance(labels, num_clients: int, k: int = 2, seed: int = 0
                             ) -> list[np.ndarray]:
  """FedGMA §5.2's "quantity-based label imbalance" = NIID-Bench's ``#C=k`` split.

  Same as :func:`k_classes_per_client` (see there for shapes, errors and the scheme);
  the default ``k=2`` is our choice (FedGMA's appendix with its numbers is not in the
  paper text we follow; NIID-Bench reports ``#C ∈ {1, 2, 3}``).

  Source: FedGMA §5.2; NIID-Bench (Li et al. 2022) §4.1.
  """
  return k_classes_per_client(labels, num_clients, k, seed)


def domain_client_counts(domain_sizes: Sequence[int], num_clients: int) -> np.ndarray:
  """How many clients each domain gets (FedIIR App. F.1, Alg. 2).

  Start with one client per domain; for each extra client ``c = M+1..P`` give it to the
  domain with the largest current per-client size ``m* = argmax_m s_m / count_m`` (ties:
  the lowest domain index).

  Args:
    domain_sizes: ``[M]`` example counts ``s_m >= 1`` of the training domains.
    num_clients: ``P`` clients, ``M <= P <= Σ s_m``.

  Returns:
    int64 ``[M]`` client counts, summing to ``P``, each ``<= s_m``.

  Raises:
    ValueError: empty or non-positive sizes, ``P < M`` (a client would mix domains) or
      ``P > Σ s_m`` (a client would be empty).

  Source: FedIIR App. F.1, Alg. 2 ("Data Splitting").
  """
  sizes = np.asarray(domain_sizes)
  if sizes.ndim != 1 or sizes.size == 0 or np.any(sizes < 1):
    raise ValueError(f"domain_sizes must be a non-empty list of positive counts, got "
                     f"{np.asarray(domain_sizes).tolist()}.")
  sizes = sizes.astype(np.int64)
  m = len(sizes)
  if int(num_clients) != num_clients or num_clients < m:
    raise ValueError(f"num_clients={num_clients!r} < {m} domains; FedIIR Alg. 2 needs at "
                     "least one client per domain (no client may mix domains).")
  if num_clients > sizes.sum():
    raise ValueError(f"num_clients={num_clients} exceeds the {int(sizes.sum())} examples "
                     "of all domains; some client would be empty.")
  counts = np.ones(m, np.int64)
  for _ in range(int(num_clients) - m):
    counts[int(np.argmax(sizes / counts))] += 1
  return counts


def _domain_indices(domains) -> list[np.ndarray]:
  domains = list(domains)
  if not domains:
    raise ValueError("domains is empty; pass one size or one index array per domain.")
  if all(np.ndim(d) == 0 for d in domains):
    out = []
    for d in domains:
      if int(d) != d or d < 1:
        raise ValueError(f"domain sizes must be positive integers, got {d!r}.")
      out.append(np.arange(int(d), dtype=np.int64))
    return out
  out = []
  for i, d in enumerate(domains):
    d = np.asarray(d)
    if d.ndim != 1 or d.size == 0 or not np.issubdtype(d.dtype, np.integer):
      raise ValueError(f"domain {i}: expected a non-empty 1-D integer index array, got "
                       f"dtype {d.dtype} shape {list(d.shape)}.")
    out.append(d.astype(np.int64))
  return out


def split_domains_to_clients(domains, num_clients: int, seed: int = 0
                             ) -> tuple[list[np.ndarray], np.ndarray]:
  """Many clients per domain, no client mixing domains (FedIIR App. F.1, Alg. 2).

  :func:`domain_client_counts` decides how many clients each domain gets; each domain
  is then shuffled and split into that many near-equal parts ("the domain is randomly
  split into Σ_c 1[Ind(c)=m] sub-domains", App. F.1 footnote 4). With ``P = M`` every
  domain is one client.

  Args:
    domains: either ``M`` domain sizes (ints; client arrays then index ``0..s_m-1``
      inside their domain) or ``M`` 1-D integer index arrays (client arrays then hold
      elements of their domain's array, e.g. global indices).
    num_clients: ``P`` clients, ``M <= P <= Σ s_m``.
    seed: seeds the per-domain shuffles.

  Returns:
    ``(clients, domain_of_client)``: ``P`` sorted int64 index arrays, grouped by domain
    (all of domain 0's clients first), and int64 ``[P]`` with each client's domain.

  Raises:
    ValueError: malformed ``domains`` or a ``num_clients`` that Alg. 2 cannot serve.

  Source: FedIIR App. F.1, Alg. 2 (the paper splits the domain with the largest
  per-client share into one more equal part; it does not halve single clients).
  """
  doms = _domain_indices(domains)
  counts = domain_client_counts([len(d) for d in doms], num_clients)
  rng = np.random.default_rng(seed)
  clients, owner = [], []
  for m, (d, c) in enumerate(zip(doms, counts)):
    for part in np.array_split(rng.permutation(d), int(c)):
      clients.append(np.sort(part))
      owner.append(m)
  return clients, np.asarray(owner, np.int64)


def split_each_domain(domains, clients_per_domain: int, seed: int = 0
                      ) -> tuple[list[np.ndarray], np.ndarray]:
  """Splits every domain into exactly ``clients_per_domain`` random near-equal clients.

  Args:
    domains: as in :func:`split_domains_to_clients`.
    clients_per_domain: ``c >= 1``, at most the smallest domain's size.
    seed: seeds the per-domain shuffles.

  Returns:
    ``(clients, domain_of_client)`` as in :func:`split_domains_to_clients`, ``M · c``
    clients.

  Raises:
    ValueError: malformed ``domains``, ``c < 1`` or ``c`` above a domain's size.

  Source: FedIIR §5 / App. F.1 (the equal-domain case of Alg. 2).
  """
  doms = _domain_indices(domains)
  if int(clients_per_domain) != clients_per_domain or clients_per_domain < 1:
    raise ValueError(f"clients_per_domain={clients_per_domain!r}; it must be a positive "
                     "integer.")
  smallest = min(len(d) for d in doms)
  if clients_per_domain > smallest:
    raise ValueError(f"clients_per_domain={clients_per_domain} exceeds the smallest "
                     f"domain's {smallest} examples; some client would be empty.")
  rng = np.random.default_rng(seed)
  clients, owner = [], []
  for m, d in enumerate(doms):
    for part in np.array_split(rng.permutation(d), int(clients_per_domain)):
      clients.append(np.sort(part))
      owner.append(m)
  return clients, np.asarray(owner, np.int64)


def train_val_split(n: int, val_fraction: float, rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Random train/validation split of ``range(n)`` (DomainBed's per-domain holdout).

  Args:
    n: examples in the domain (``>= 2`` when ``0 < val_fraction < 1``).
    val_fraction: fraction in ``[0, 1)`` for validation; the validation part has
      ``max(1, round(val_fraction · n))`` examples when ``val_fraction > 0``.
    rng: a ``numpy.random.Generator`` (one permutation is drawn).

  Returns:
    ``(train_idx, val_idx)``: sorted int64 arrays, disjoint, covering ``range(n)``.

  Raises:
    ValueError: ``val_fraction`` outside ``[0, 1)`` or too few examples to keep one in
      each part.

  Source: FedIIR §5 ("90% of the available data for training and 10% for validation");
  DomainBed's training-domain validation.
  """
  if not 0.0 <= val_fraction < 1.0:
    raise ValueError(f"val_fraction={val_fraction!r}; it must be in [0, 1) (0.1 is the "
                     "FedIIR/DomainBed choice).")
  perm = rng.permutation(int(n))
  n_val = 0 if val_fraction == 0 else max(1, int(round(val_fraction * n)))
  if n_val >= n:
    raise ValueError(f"a domain of {n} examples cannot give {n_val} validation examples "
                     "and keep one for training; lower val_fraction or use more data.")
  return np.sort(perm[n_val:]).astype(np.int64), np.sort(perm[:n_val]).astype(np.int64)


def _name_key(name: str) -> str:
  return re.sub(r"[\s_\-]", "", str(name)).lower()


def resolve_holdout(holdout, names: Sequence[str]) -> int:
  """Index of the held-out domain for leave-one-domain-out (DomainBed protocol).

  Args:
    holdout: an int index ``0..M-1``, a domain name from ``names`` (matched ignoring
      case, spaces, underscores and hyphens: ``'Real_World'`` = ``'Real World'``), or an
      index as a digit string (bools rejected).
    names: the ``M`` domain names, in order.

  Returns:
    the domain index (int).

  Raises:
    ValueError: anything else (the message lists the valid indices and names).
  """
  names = [str(n) for n in names]
  if isinstance(holdout, (int, np.integer)) and not isinstance(holdout, bool):
    if 0 <= int(holdout) < len(names):
      return int(holdout)
  elif isinstance(holdout, str):
    keys = [_name_key(n) for n in names]
    if _name_key(holdout) in keys:
      return keys.index(_name_key(holdout))
    if holdout.strip().isdigit() and int(holdout) < len(names):
      return int(holdout)
  raise ValueError(f"holdout={holdout!r} is not a domain; use an index in "
                   f"0..{len(names) - 1} or a domain name from {names} (e.g. "
                   f"holdout='{names[-1]}').")


def leave_one_domain_out(domains, names, holdout, *, val_fraction: float = 0.1,
                         seed: int = 0, clients_per_domain=None, num_clients=None,
                         shared_split: bool = False) -> dict:
  """Leave-one-domain-out clients: sources → training clients + 'val', holdout → 'ood'.

  Every source domain is split into train / validation (``val_fraction``, seeded). The
  training parts become one client per source domain, ``clients_per_domain`` clients per
  domain (:func:`partition.split_each_domain`) or ``num_clients`` clients in total
  (FedIIR App. F.1, Alg. 2, :func:`partition.split_domains_to_clients`); no client mixes
  domains. The validation parts form the 'val' set (one client per source domain) and the
  whole held-out domain the 'ood' set (one client).

  Args:
    domains: ``M`` pairs ``(x [n_m, ...], y [n_m])``.
    names: ``M`` domain names.
    holdout: held-out domain (index or name, :func:`resolve_holdout`).
    val_fraction: validation fraction per source domain, in ``[0, 1)``; with 0 there is
      no 'val' set.
    seed: seeds the splits.
    clients_per_domain: clients per source domain (at most one of this and
      ``num_clients``; both None = one client per domain).
    num_clients: total training clients, split over the source domains.
    shared_split: all domains hold the same underlying examples in the same order
      (FedSR's RotatedMNIST): use one train/val split of the example indices for every
      domain, so no validation example appears (differently rotated) in training.

  Returns:
    dict: 'train' (list of ``(x, y)`` per client), 'client_domain' (names),
    'client_index' (per client, int64 indices into its domain's arrays), 'val' (list of
    ``(x, y)`` per source domain), 'val_index', 'ood' ``(x, y)``, 'holdout' (name),
    'sources' (names).

  Raises:
    ValueError: bad holdout, fewer than 2 domains, both client options, shared_split
      with unequal domains, or splits that leave a part empty.

  Source: DomainBed's leave-one-domain-out protocol with training-domain validation;
  FedIIR §5 (90/10 split, App. F.1 Alg. 2); FedSR §5.
  """
  names = list(names)
  if len(domains) != len(names) or len(names) < 2:
    raise ValueError(f"need >= 2 domains with one name each, got {len(domains)} domains "
                     f"and {len(names)} names.")
  h = resolve_holdout(holdout, names)
  if clients_per_domain is not None and num_clients is not None:
    raise ValueError("pass clients_per_domain or num_clients, not both "
                     f"(got {clients_per_domain} and {num_clients}).")
  sources = [m for m in range(len(names)) if m != h]
  ss = np.random.SeedSequence(seed).spawn(len(names) + 1)
  if shared_split:
    sizes = {len(domains[m][1]) for m in range(len(names))}
    if len(sizes) != 1:
      raise ValueError("shared_split=True needs domains of equal size.")
    shared = train_val_split(sizes.pop(), val_fraction,
                                  np.random.default_rng(ss[-1]))
  tr_idx, val, val_index = [], [], []
  for m in sources:
    x, y = domains[m]
    tr, va = shared if shared_split else train_val_split(
        len(y), val_fraction, np.random.default_rng(ss[m]))
    tr_idx.append(tr)
    if len(va):
      val.append((x[va], y[va]))
      val_index.append(va)
  if clients_per_domain is not None:
    clients, owner = split_each_domain(tr_idx, clients_per_domain, seed)
  elif num_clients is not None:
    clients, owner = split_domains_to_clients(tr_idx, num_clients, seed)
  else:
    clients, owner = [np.asarray(t) for t in tr_idx], np.arange(len(sources))
  train = []
  for idx, o in zip(clients, owner):
    x, y = domains[sources[o]]
    train.append((x[idx], y[idx]))
  return {"train": train, "client_domain": [names[sources[o]] for o in owner],
          "client_index": list(clients), "val": val, "val_index": val_index,
          "ood": domains[h], "holdout": names[h], "sources": [names[m] for m in sources]}


def subsample(n: int, size, rng: np.random.Generator, what: str) -> np.ndarray:
  """Seeded random subset of ``range(n)`` (for quick runs on part of a dataset).

  Args:
    n: population size.
    size: how many to keep (``1..n``), or None for all of them in order.
    rng: ``numpy.random.Generator`` (one draw without replacement when ``size`` is set).
    what: the caller's argument name, used in the error message.

  Returns:
    sorted int64 ``[size]`` (or ``[n]``) indices.

  Raises:
    ValueError: ``size`` is not an integer in ``1..n`` (names ``what``).
  """
  if size is None:
    return np.arange(n, dtype=np.int64)
  if int(size) != size or not 1 <= size <= n:
    raise ValueError(f"{what}={size!r}; it must be an integer in 1..{n} (the data "
                     f"holds {n}), or None for all.")
  return np.sort(rng.choice(n, int(size), replace=False)).astype(np.int64)


def to_float_images(x: np.ndarray) -> np.ndarray:
  """Task image format: uint8 ``[n, H, W]`` or ``[n, H, W, C]`` in 0..255 → float32
  channels-last ``[n, H, W, C]`` in ``[0, 1]`` (``C = 1`` added for grayscale).

  Raises:
    ValueError: an array of another rank.
  """
  x = np.asarray(x)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4:
    raise ValueError(f"images must be [n, H, W] or [n, H, W, C], got shape "
                     f"{list(x.shape)}.")
  return x.astype(np.float32) / np.float32(255.0)
