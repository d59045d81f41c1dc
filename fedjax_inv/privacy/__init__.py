"""Differential privacy: client-level DP-FedAvg with its RDP / PLD accountants
(``client_dp``) and per-example DP-SGD (``dp_sgd``).

Before this package existed, ``fedjax_inv.privacy`` was the module now at
``fedjax_inv.privacy.client_dp``; its names still resolve here for this version, with a
DeprecationWarning.
"""
import importlib as _importlib
import warnings as _warnings


def __getattr__(name):
  if name.startswith("__"):
    raise AttributeError(name)
  module = _importlib.import_module("fedjax_inv.privacy.client_dp")
  if not hasattr(module, name):
    raise AttributeError(f"module 'fedjax_inv.privacy' has no attribute {name!r}")
  _warnings.warn(f"fedjax_inv.privacy.{name} is now fedjax_inv.privacy.client_dp.{name}; "
                 "import it from there (the old path goes away in the next version).",
                 DeprecationWarning, stacklevel=2)
  return getattr(module, name)
