"""DomainBed image benchmarks as leave-one-domain-out federated tasks (PACS, VLCS,
OfficeHome, DomainNet; FedSR §5, FedIIR §5) and the shared domain-task builder. Loader:
``fedjax_inv.data.domainbed``.
"""
from __future__ import annotations

from typing import Sequence
import numpy as np
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks.base import Task, register_task


from fedjax_inv.data.domainbed import DATASETS, load_domainbed
from fedjax_inv.data.hf import HUB_NAMES
from fedjax_inv.data.partition import leave_one_domain_out, resolve_holdout


def build_domain_task(name: str, domains: Sequence[tuple[np.ndarray, np.ndarray]],
                      domain_names: Sequence[str], *, holdout, val_fraction: float,
                      seed: int, model, kind: str, info: dict, defaults: dict,
                      clients_per_domain: int | None = None,
                      num_clients: int | None = None) -> Task:
  """Leave-one-domain-out ``Task`` from per-domain arrays (the shared domain-task contract).

  Args:
    name: task name.
    domains: ``M`` pairs ``(x [n_d, ...] uint8 in 0..255 or float in [0, 1], y [n_d])``.
    domain_names: ``M`` names, in the same order.
    holdout: held-out (test) domain, index or name.
    val_fraction: validation fraction of each source domain, in [0, 1) (FedSR §5 /
      FedIIR §5: 0.1). With 0 the 'val' set is omitted.
    seed: seeds the train/validation splits and the client partition.
    model, kind, defaults: the ``Task`` fields.
    info: extra provenance merged into ``Task.info``.
    clients_per_domain: split each source domain's training part into this many clients.
    num_clients: total training clients, distributed over domains by FedIIR App. F.1
      Alg. 2 (exclusive with ``clients_per_domain``).

  Returns:
    ``Task`` with ``train`` (source-domain clients), ``eval_sets = {'val': one client per
    source domain, 'ood': the held-out domain}`` and ``info['domains']``,
    ``info['holdout']``, ``info['client_domains']``.

  Raises:
    ValueError: bad holdout, fraction or client counts.
  """
  from fedjax_inv.data import partition
  names = list(domain_names)
  if len(names) != len(domains) or len(names) < 2:
    raise ValueError(f"{name}: need >= 2 domains with one name each, got {len(domains)} "
                     f"domains and names {names}.")
  h = resolve_holdout(holdout, names)  # DomainBed's loose name match, then an index

  def as_float(x):
    x = np.asarray(x)
    if x.dtype == np.uint8:
      return partition.to_float_images(x)
    return x.astype(np.float32)

  # The one leave-one-domain-out split (shared with RotatedMNIST): per-domain seeded
  # train/val splits, then clients that never mix domains.
  d = leave_one_domain_out(domains, names, h, val_fraction=val_fraction, seed=seed,
                           clients_per_domain=clients_per_domain, num_clients=num_clients)
  xs = [as_float(x) for x, _ in d["train"]]
  ys = [np.asarray(y).astype(np.int32) for _, y in d["train"]]
  val_y = [np.asarray(y) for _, y in d["val"]]
  eval_sets = {}
  if d["val"]:
    eval_sets["val"] = from_client_arrays([as_float(x) for x, _ in d["val"]],
                                          [v.astype(np.int32) for v in val_y])
  hx, hy = d["ood"]
  eval_sets["ood"] = from_client_arrays([as_float(hx)], [np.asarray(hy).astype(np.int32)])
  sources = [m for m in range(len(names)) if m != h]
  full_info = dict(info)
  full_info.update(
      domains=names, holdout=names[h],
      source_domains=[names[m] for m in sources],
      client_domains=list(d["client_domain"]),
      val_fraction=val_fraction,
      split_sizes={"train": [len(y) for y in ys], "val": [len(v) for v in val_y],
                   "ood": int(len(hy))})
  return Task(name, kind, from_client_arrays(xs, ys), eval_sets, model, full_info,
              defaults=dict(defaults))


def _domainbed_task(dataset: str, *, data_dir, source, download, seed, holdout,
                    val_fraction, image_size, max_images_per_domain, clients_per_domain,
                    num_clients, arch, base_width, feature_dim, classifier_hidden,
                    small_input, pretrained) -> Task:
  from fedjax_inv.models import resnet as resnet_lib
  if arch is None:
    arch = f"resnet{DATASETS[dataset][3]}"
  depths = {"resnet18": 18, "resnet34": 34, "resnet50": 50}
  if arch not in depths:
    raise ValueError(f"arch={arch!r}; choose one of {sorted(depths)}.")
  domains, classes, note = load_domainbed(dataset, data_dir, source=source,
                                          image_size=image_size,
                                          max_images_per_domain=max_images_per_domain,
                                          seed=seed, download=download)
  names = list(DATASETS[dataset][1])
  resolve_holdout(holdout, names)  # fail early, before building the model
  if small_input is None:
    small_input = image_size < 96
  model = resnet_lib.resnet(depths[arch], len(classes), feature_dim=feature_dim,
                            base_width=base_width, small_input=small_input,
                            classifier_hidden=classifier_hidden)
  if pretrained is not None:
    model = resnet_lib.with_pretrained(model, pretrained)
  sizes = {n: int(len(y)) for n, (_, y) in zip(names, domains)}
  info = {
      "paper": "FedSR §5; FedIIR §5 / App. F.1 (DomainBed, leave-one-domain-out)",
      "dataset_source": note,
      "data_note": (f"{dataset}: {sum(sizes.values()):,} images ({sizes}), "
                    f"{len(classes)} classes, resized to {image_size}x{image_size}"
                    + (f", at most {max_images_per_domain} per domain"
                       if max_images_per_domain else "") + "; no augmentation"),
      "classes": classes,
      "image_size": int(image_size),
      "model": f"{arch} (GroupNorm), feature_dim "
               f"{model.feature_dim}, classifier "
               f"{'linear' if classifier_hidden is None else f'2-layer ({classifier_hidden})'}"
               + (f", pretrained featurizer from {pretrained}" if pretrained else ""),
  }
  defaults = dict(rounds=100, eval_every=5, local_steps=5, batch_size=32,
                  client_optimizer="momentum", client_lr=0.01, weight_decay=5e-4)
  return build_domain_task(dataset, domains, names, holdout=holdout,
                           val_fraction=val_fraction, seed=seed, model=model,
                           kind="multiclass", info=info, defaults=defaults,
                           clients_per_domain=clients_per_domain, num_clients=num_clients)


_DOC = """{title} (leave-one-domain-out; {paper}).

  Domains: {domains}. Data: ``<data_dir>/{folder}/<domain>/<class>/*`` (module docstring){hub};
  FileNotFoundError naming that layout when absent. Model: GroupNorm {arch_default}
  featurizer with the papers' linear projection to {fdim} and a linear classifier
  (``classifier_hidden=int`` for FedIIR's two-layer classifier).

  Args:
    data_dir, source, download, seed: as every task (``source`` 'auto' | 'raw'{tfds};
      ``download`` only with 'hf').
    holdout: test domain (index or name); ``val_fraction``: validation share of each
      source domain (0.1).
    image_size: pixels per side (224 in the papers; small values for CPU runs).
    max_images_per_domain: seeded subset size per domain (None = all).
    clients_per_domain / num_clients: many clients per domain (FedIIR App. F.1).
    arch: 'resnet18' | 'resnet34' | 'resnet50' (default {arch_default});
      base_width (64), feature_dim (None = 512 / 2048), classifier_hidden (None),
      small_input (None = CIFAR stem when image_size < 96).
    pretrained: optional ``.npz`` of featurizer weights (``models.resnet.load_pretrained``).

  Defaults: 100 rounds, 5 local steps of SGD with momentum 0.9, lr 0.01, weight decay
  5e-4, batch 32, evaluation every 5 rounds. Papers: FedSR §5 uses SGD (lr 0.01,
  momentum 0.9, weight decay 5e-4, batch 64, E=5 local steps, 5000 iterations); FedIIR
  §5 / App. F.3 uses 100 rounds of one local epoch of SGD, batch 32, lr {iir_lr}.

  Raises:
    ValueError: bad arguments (unknown holdout, arch, sizes) or ``download=True``
      without ``source='hf'``.
    FileNotFoundError: data missing.
  """


def _register(dataset: str, title: str, paper: str, iir_lr: str):
  dirs, domains, ncls, depth = DATASETS[dataset]

  def builder(data_dir=None, source="auto", download=False, seed=0, holdout=0,
              val_fraction=0.1, image_size=224, max_images_per_domain=None,
              clients_per_domain=None, num_clients=None, arch=None, base_width=64,
              feature_dim=None, classifier_hidden=None, small_input=None,
              pretrained=None):
    return _domainbed_task(dataset, data_dir=data_dir, source=source, download=download,
                           seed=seed, holdout=holdout, val_fraction=val_fraction,
                           image_size=image_size,
                           max_images_per_domain=max_images_per_domain,
                           clients_per_domain=clients_per_domain, num_clients=num_clients,
                           arch=arch, base_width=base_width, feature_dim=feature_dim,
                           classifier_hidden=classifier_hidden, small_input=small_input,
                           pretrained=pretrained)

  builder.__name__ = dataset
  builder.__qualname__ = dataset
  builder.__doc__ = _DOC.format(
      title=title, paper=paper, domains=", ".join(domains), folder=dirs[0],
      arch_default=f"ResNet-{depth}", fdim=512 if depth == 18 else 2048,
      tfds=(" | 'tfds'" if dataset == "domainnet" else
            f" | 'hf' (``{HUB_NAMES[dataset]}``)" if dataset in HUB_NAMES else ""),
      hub=(", or its Hugging Face hub copy with ``source='hf'``" if dataset in HUB_NAMES
           else ""),
      iir_lr=iir_lr)
  register_task(dataset, paper=paper,
                summary=(f"{len(domains)} domains ({', '.join(domains)}), {ncls} classes; "
                         f"ResNet-{depth} (GroupNorm); needs the DomainBed image folders "
                         f"in <data_dir>/{dirs[0]}/"
                         + (f" or --source hf ({HUB_NAMES[dataset]})"
                            if dataset in HUB_NAMES else "")),
                starting="the papers' settings: FedSR §5 (SGD, momentum 0.9, lr 0.01, weight "
                         "decay 5e-4, E = 5) with FedIIR App. F.3's batch 32")(builder)
  return builder


pacs = _register("pacs", "PACS", "FedSR §5 (Table 2); FedIIR §5 (Table 1, App. Table 6)",
                 "2.5e-3")
vlcs = _register("vlcs", "VLCS", "FedIIR §5 (Table 1, App. Table 5)", "1e-3")
office_home = _register("office_home", "OfficeHome",
                        "FedSR §5 (Table 3); FedIIR §5 (Table 1, App. Table 7)", "1e-3")
domainnet = _register("domainnet", "DomainNet", "FedSR §5 (Table 4)", "(not used there)")
