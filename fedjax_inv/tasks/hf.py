"""``hf``: any Hugging Face hub dataset, partitioned by Flower Datasets.

  fedjax-inv run --task hf --task-arg dataset=uoft-cs/cifar10 \\
      --task-arg partitioner=dirichlet:alpha=0.3,num_partitions=100,by=label --download
  fedjax-inv run --task hf --task-arg dataset=flwrlabs/femnist \\
      --task-arg partition_by=writer_id --task-arg y_column=character --data-dir DIR

Data: ``fedjax_inv.data.hf`` (a local copy in ``--data-dir``, the Hugging Face cache, or
the hub with ``--download``), written into packed pools (8-bit images stay uint8).
"""
from __future__ import annotations

import numpy as np

from fedjax_inv.tasks.base import Task, register_task


def _image_columns(features) -> list:
  import datasets  # pylint: disable=g-import-not-at-top
  return [k for k, f in features.items() if isinstance(f, datasets.Image)]


def _num_classes(features, y_column, *label_arrays) -> int:
  import datasets  # pylint: disable=g-import-not-at-top
  f = features.get(y_column)
  if isinstance(f, datasets.ClassLabel):
    return int(f.num_classes)
  return int(max(int(np.max(y)) for y in label_arrays if y is not None and len(y)) + 1)


@register_task("hf", paper="none (any Hugging Face hub dataset; Flower Datasets' "
                           "partitioners)",
               summary="any Hugging Face hub dataset (--task-arg dataset=NAME) over clients "
                       "by a column (partition_by=COLUMN) or a Flower Datasets partitioner "
                       "(partitioner=dirichlet:alpha=0.3,num_partitions=100,by=label); "
                       "images: CNN, else MLP",
               starting="our choice: 20 rounds of 10 clients, 10 local SGD steps of batch "
                        "32 at lr 0.05 (not tuned on any dataset)")
def hf(data_dir=None, source="auto", download=False, seed=0, dataset=None, subset=None,
       split="train", test_split="test", partition_by=None, partitioner=None,
       x_column=None, y_column="label", test_fraction=0.1, num_clients=None,
       channels=(32, 64), hidden=(128,)) -> Task:
  """A hub dataset's ``split`` over clients, evaluated on its ``test_split``.

  Clients: ``partition_by=COLUMN`` gives one client per value of the column (Flower's
  ``NaturalIdPartitioner``); ``partitioner='NAME:KEY=VALUE,...'`` any of Flower's
  partitioners (:func:`fedjax_inv.data.hf.make_partitioner`: iid, dirichlet, shard,
  pathological, natural, linear, square, exponential; ``by`` = the label column by
  default, ``seed`` = the run's); neither: ``iid:num_partitions=10``. The split is
  shuffled with the run's seed first, as ``FederatedDataset`` does.

  Columns: ``x_column`` (default the first image column, else the first other
  column), ``y_column`` (default ``label``; integer or ClassLabel). Images must share
  one size; 8-bit ones are packed as uint8.

  Sets: ``'test'``: the ``test_split`` as one client (when the dataset has it); else
  each client's ``test_fraction`` (seeded) as its own test client.

  Model: images: ``models.cnn(C, channels, K)``; other inputs (numbers, vectors):
  ``models.mlp(d, hidden, K)``, ``K`` from the label column.

  Args:
    dataset: the hub name (``flwrlabs/femnist``) or a local folder (required).
    subset: the hub dataset's configuration name, if it has several.
    num_clients: keep the first N clients.

  Raises:
    ValueError: no ``dataset``, a source other than auto/hf, a bad partitioner, a
      missing column (names the dataset's columns).
    FileNotFoundError: no copy and downloads off (``fedjax_inv.data.hf``).
  """
  from fedjax_inv import models  # pylint: disable=g-import-not-at-top
  from fedjax_inv.data import hf as hub  # pylint: disable=g-import-not-at-top
  if not dataset:
    raise ValueError("task 'hf' needs --task-arg dataset=NAME (a Hugging Face hub dataset, "
                     "e.g. uoft-cs/cifar10, or a local folder).")
  if source not in ("auto", "hf"):
    raise ValueError(f"task 'hf' reads the Hugging Face hub (--source hf or auto), not "
                     f"--source {source!r}.")
  if partition_by and partitioner:
    raise ValueError("task 'hf': give partition_by=COLUMN or partitioner=SPEC, not both.")
  spec = (f"natural:by={partition_by}" if partition_by else
          partitioner or "iid:num_partitions=10")
  part = hub.make_partitioner(spec, seed=seed, default_by=y_column)
  data = hub.open_dataset(str(dataset), {split: part}, data_dir=data_dir,
                          download=download, seed=seed, subset=subset,
                          want_splits=(test_split,))
  p = data.partitioner(split)
  feats = data.features
  if x_column is None:
    imgs = _image_columns(feats)
    others = [k for k in feats if k not in (y_column, getattr(p, "_partition_by", None))]
    x_column = (imgs or others or [None])[0]
  for col in (x_column, y_column):
    if col not in feats:
      raise ValueError(f"task 'hf': {dataset} has no column {col!r}; its columns: "
                       f"{sorted(feats)} (set x_column= / y_column=).")
  is_image = x_column in _image_columns(feats)

  def convert(d):
    c = hub.columns(d, x_column, y_column)
    x = hub.images(c[x_column]) if is_image else np.asarray(c[x_column], np.float32)
    if not is_image:
      x = x.reshape(len(x), -1)
    return x, np.asarray(c[y_column])

  n = p.num_partitions
  ids = ([p.partition_id_to_natural_id[i] for i in range(n)] if partition_by else None)
  keep = range(min(n, int(num_clients))) if num_clients else None
  test_ds = data.split(test_split) if test_split and test_split != split else None
  if test_ds is not None:
    train, = hub.write_pools(n, p.load_partition, convert,
                             lambda i, m: (np.arange(m),), ids=ids, keep=keep)
    test, = hub.write_pools(1, lambda i: test_ds, convert, lambda i, m: (np.arange(m),),
                            ids=[test_split])
  else:
    plan = hub._random_split(seed, test_fraction)  # pylint: disable=protected-access
    train, test = hub.write_pools(n, p.load_partition, convert, plan, ids=ids, keep=keep)
  if train is None:
    raise ValueError(f"task 'hf': the partitioner {spec!r} left every client empty.")
  eval_sets = {"test": test} if test is not None else {}
  k = _num_classes(feats, y_column, np.asarray(train.y),
                   None if test is None else np.asarray(test.y))
  shape = train.feature_shape
  model = (models.cnn(int(shape[-1]), tuple(channels), k) if is_image else
           models.mlp(int(np.prod(shape)), tuple(hidden), k))
  sizes = np.asarray(train.n)
  info = {**data.provenance, "paper": "none (generic hub dataset)", "partitioner": spec,
          "x_column": x_column, "y_column": y_column, "num_clients": int(len(sizes)),
          "num_partitions": int(n), "num_classes": k,
          "client_sizes": sizes.tolist() if len(sizes) <= 1000 else {
              "min": int(sizes.min()), "max": int(sizes.max()), "total": int(sizes.sum())},
          "stored_dtype": str(train.x.dtype),
          "data_note": (f"{dataset} ({split}) over {len(sizes)} clients by {spec} "
                        "(Flower Datasets)")}
  return Task("hf", "multiclass", train, eval_sets, model, info,
              defaults=dict(rounds=20, eval_every=5, clients_per_round=10, local_steps=10,
                            batch_size=32, client_optimizer="sgd", client_lr=0.05,
                            weight_decay=0.0))


__all__ = ["hf"]
