"""The settings of FedILC's five methods on the tasks FedILC uses (FedILC §5.1), as a
task's ``defaults['per_algorithm']`` block. Task data: the tasks name the methods, they do
not import them (``tests/test_imports.py``); the methods are in
``fedjax_inv/algorithms/fedilc.py``.
"""
from __future__ import annotations

from fedjax_inv.core.validation import nonneg as _nonneg
from fedjax_inv.core.validation import pos_int as _pos_int, positive as _positive

FEDILC_METHODS = ("geometric", "fishr_inter_geo", "fishr_intra_geo", "fishr_intra_arith",
                  "fedcurv")
_FISHR_METHODS = FEDILC_METHODS[1:]


def fedilc_task_settings(*, server_lr: float, weight_decay: float, fishr_lambda: float,
                         group_size: int) -> dict:
  """A task's ``defaults['per_algorithm']`` block for the FedILC methods (FedILC §5.1):
  the FedSGD-type methods drop a task's client recipe, so a task gives their server
  settings here: Adam with coupled L2, ``server_lr``, ``weight_decay``, ``batch_size=None``
  (full-data client gradients); ``fishr_lambda`` (official ``'sum'`` scale) for the Fishr
  methods; ``intra_group_size = group_size`` for Intra-Geo.

  Args:
    server_lr: > 0 (3e-4 Color-MNIST, 1e-4 Rotated-CIFAR10, 2e-4 eICU).
    weight_decay: >= 0 (0.01, 1e-3, 1e-3).
    fishr_lambda: >= 0 (15.0, 1.0, 0.1).
    group_size: positive int (32, 64, 64).

  Returns:
    ``{name: {setting: value}}`` for ``FEDILC_METHODS``.

  Raises:
    ValueError: a bad value (named), from the checks the factories make
      (``core.validation``).

  Source: FedILC §5.1.1-5.1.3; official code ``main.py`` commands.
  """
  _positive("server_lr", server_lr)
  _nonneg("weight_decay", weight_decay)
  _nonneg("fishr_lambda", fishr_lambda)
  _pos_int("group_size", group_size)
  server = dict(server_optimizer="adam", server_lr=float(server_lr),
                weight_decay=float(weight_decay), batch_size=None)
  out = {name: dict(server) for name in FEDILC_METHODS}
  for name in _FISHR_METHODS:
    out[name]["fishr_lambda"] = float(fishr_lambda)
  out["fishr_intra_geo"]["intra_group_size"] = int(group_size)
  return out
