"""The eICU mortality task of FedILC §5.1.3 (hospitals as clients). Loader:
``fedjax_inv.data.eicu``.
"""
from __future__ import annotations

from fedjax_inv import models
from fedjax_inv.core.data import from_client_arrays
from fedjax_inv.tasks.base import Task, register_task
from fedjax_inv.tasks.fedilc_settings import fedilc_task_settings


from fedjax_inv.data.eicu import NUM_DRUG_FEATURES, make_eicu


@register_task("eicu", paper="FedILC §5.1.3",
               summary="20 largest eICU hospitals (70/30 train/val), the rest OOD; "
                       "mortality from 1,399 drug indicators; MLP 1024-1024-512-1; needs "
                       "the credentialed CSV at <data_dir>/eicu/eicu_drugs.csv",
               starting="the paper's settings: FedILC §5.1.3 and its official commands")
def eicu(data_dir=None, source="auto", download=False, seed=0, path=None,
         hidden=(1024, 1024, 512), num_train_hospitals=20, val_fraction=0.3,
         feature_columns=None, expected_features=NUM_DRUG_FEATURES,
         ood_per_hospital=False):
  """eICU mortality task (FedILC §5.1.3), binary, from the CSV described in the module
  docstring (``path`` or ``<data_dir>/eicu/eicu_drugs.csv``).

  Clients: the 20 largest hospitals (70 % of each for training); ``eval_sets`` =
  ``{'val': their 30 % (one client each), 'ood': the other hospitals}``. Model: MLP with
  ``hidden`` = (1024, 1024, 512) and one logit (FedILC §5.1.3).

  Defaults (the paper's settings): Adam, lr 2e-4, weight decay 1e-3, one full-batch
  local step per round (FedSGD-style as FedILC), 301 rounds (the official commands),
  evaluation every 10 rounds. The FedILC methods (FedSGD-type) get server Adam with
  coupled L2, lr 2e-4, wd 1e-3, λ = 0.1 and Intra-Geo mini-batches of 64 through
  ``per_algorithm`` (``fedilc_settings.fedilc_task_settings``). FedILC reports OOD
  loss / AUROC / AUPRC / accuracy at the round with the lowest OOD loss over 5 seeds
  (Tables 2, 4, 6); use ``fedjax_inv.eval.metrics``.

  Raises:
    FileNotFoundError: no CSV; the message says where to put it and its schema.
    ValueError: ``download=True`` (credentialed data), ``source`` other than
      'auto'/'raw', or a malformed CSV.
  """
  if download:
    raise ValueError("eicu: download=True is impossible; eICU is credentialed "
                     "(PhysioNet). Export the CSV yourself (schema: "
                     "fedjax_inv.data.eicu module docstring).")
  if source not in ("auto", "raw"):
    raise ValueError(f"eicu: source={source!r}; only 'auto' or 'raw' (the user CSV).")
  d = make_eicu(data_dir, path=path, seed=seed, num_train_hospitals=num_train_hospitals,
                val_fraction=val_fraction, feature_columns=feature_columns,
                expected_features=expected_features, ood_per_hospital=ood_per_hospital)
  train = from_client_arrays([a for a, _ in d["train"]], [b for _, b in d["train"]])
  eval_sets = {
      "val": from_client_arrays([a for a, _ in d["val"]], [b for _, b in d["val"]]),
      "ood": from_client_arrays([a for a, _ in d["ood"]], [b for _, b in d["ood"]]),
  }
  model = models.mlp(d["info"]["num_features"], tuple(hidden), 1)
  info = dict(d["info"], model=f"MLP {d['info']['num_features']}-"
              + "-".join(map(str, hidden)) + "-1")
  return Task("eicu", "binary", train, eval_sets, model, info,
              defaults=dict(rounds=301, eval_every=10, local_steps=1, batch_size=None,
                            client_optimizer="adam", client_lr=2e-4, weight_decay=1e-3,
                            per_algorithm=fedilc_task_settings(
                                server_lr=2e-4, weight_decay=1e-3, fishr_lambda=0.1,
                                group_size=64)))
