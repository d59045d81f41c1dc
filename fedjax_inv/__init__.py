"""fedjax_inv: a vectorized JAX/Flax simulator for federated learning under distribution
shift (FedILC, Invariant FedAvg, FedSR, FedGMA, FedIIR and their baselines).

Quick API:
  from_client_arrays(xs, ys) -> ClientData     stack per-client numpy arrays
  Task(name, kind, train, eval_sets, model, info)
  make_task(name, ...) / make_algorithm(name, **hparams)
  run(task, algorithm, rounds=..., seed=...) -> RunResult

For algorithm authors (docs/ALGORITHMS.md, 'Writing an algorithm'): ``Component`` (hooks
in five phases: objective, client state, pre-round, message, server stage), ``Batch``
(the client data every client-side hook gets), ``Context`` (what a client sees),
``Forward`` (a forward pass's outputs), ``weighted_mean`` / ``uniform_mean`` /
``Aggregator`` (associative client-axis reductions), ``build`` + ``register`` (an
algorithm from the common knobs, added to the registry). Also: ``Algorithm`` (the record
``build`` returns), ``hparam`` (a hyperparameter a sweep may trace), ``Objective`` (what a
gradient estimator receives),
``sign_agreement`` and ``mask_step`` (a client-message reduction and a server optimizer
stage: FedGMA in 40 lines, ``algorithms/fedgma.py``), ``map_reduce`` and ``round_parts``
(the engine's client-axis map-reduce and one round's phases).

The package, by folder: ``core`` (the engine: data, algorithm records, rounds, memory),
``algorithms`` (the registry, every algorithm, the invariance penalties), ``aggregation``
(server-side aggregators, robust rules), ``privacy`` (client-level DP, DP-SGD and their
accountants), ``data`` and ``tasks`` (sources, partitioners, registered tasks), ``models``,
``eval`` (metrics, leave-one-domain-out reporting, verdicts), ``runner`` (configuration,
plans, the training loop, sweeps and tuning, checkpoints, outputs, loggers) and ``cli``.
"""
__version__ = "0.1.0"

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import sys as _sys
import warnings as _warnings

from fedjax_inv.core import xla_cpu as _xla_cpu

# XLA reads XLA_FLAGS once, when JAX starts its backends, which may be the first array a
# user makes: the measured CPU flags are merged in here, before anything else can start
# them (fedjax_inv/core/xla_cpu.py; FEDJAX_INV_CPU_FLAGS=0 switches it off).
_xla_cpu.apply()

# The public API, imported on first use: ``import fedjax_inv.core.engine`` loads the core
# only, and ``import fedjax_inv`` stays cheap until a name below is used.
_API = {
    "Aggregator": "fedjax_inv.core.aggregator", "weighted_mean": "fedjax_inv.core.aggregator",
    "Algorithm": "fedjax_inv.core.algorithm", "Batch": "fedjax_inv.core.algorithm",
    "Component": "fedjax_inv.core.algorithm", "Context": "fedjax_inv.core.algorithm",
    "Forward": "fedjax_inv.core.algorithm", "Objective": "fedjax_inv.core.algorithm",
    "hparam": "fedjax_inv.core.algorithm",
    "ClientData": "fedjax_inv.core.data", "from_client_arrays": "fedjax_inv.core.data",
    "map_reduce": "fedjax_inv.core.engine", "round_parts": "fedjax_inv.core.engine",
    "make_algorithm": "fedjax_inv.algorithms", "algorithm_registry": "fedjax_inv.algorithms",
    "build": "fedjax_inv.algorithms.base", "register": "fedjax_inv.algorithms.base",
    "uniform_mean": "fedjax_inv.algorithms.base",
    "mask_step": "fedjax_inv.aggregation.aggregators",
    "sign_agreement": "fedjax_inv.aggregation.aggregators",
    "RunResult": "fedjax_inv.runner.simulation", "run": "fedjax_inv.runner.simulation",
    "Task": "fedjax_inv.tasks", "make_task": "fedjax_inv.tasks",
    "register_task": "fedjax_inv.tasks", "task_registry": "fedjax_inv.tasks",
}
_RENAMED = {"algorithm_registry": "registry"}
_SUBPACKAGES = ("aggregation", "algorithms", "core", "data", "eval", "models", "privacy",
                "runner", "tasks", "cli")

__all__ = sorted([*_API, "models"])


def __getattr__(name):
  if name in _API:
    value = getattr(_importlib.import_module(_API[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value
  if name in _SUBPACKAGES:
    return _importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module 'fedjax_inv' has no attribute {name!r}")


def __dir__():
  return sorted({*globals(), *_API, *_SUBPACKAGES})


# Modules that lived at the top of the package before it had the runner, aggregation and
# privacy packages. Their old import paths still work for this version, with a
# DeprecationWarning naming the new one; they go away in the next version.
MOVED_MODULES = {
    **{f"fedjax_inv.{m}": f"fedjax_inv.runner.{m}" for m in (
        "simulation", "replicas", "executor", "experiment", "lodo", "sweep", "grid", "tuning",
        "config", "auto_strategy", "checkpoint", "outputs", "loggers", "progress")},
    "fedjax_inv.xla_cpu": "fedjax_inv.core.xla_cpu",
    "fedjax_inv.aggregators": "fedjax_inv.aggregation.aggregators",
    "fedjax_inv.robust": "fedjax_inv.aggregation.robust",
    "fedjax_inv.dp_sgd": "fedjax_inv.privacy.dp_sgd",
    "fedjax_inv.penalties": "fedjax_inv.algorithms.penalties",
}


class _MovedModuleFinder(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
  """Resolves an old module path of :data:`MOVED_MODULES` to the module at its new path."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname in MOVED_MODULES:
      return _importlib_util.spec_from_loader(fullname, self)
    return None

  def create_module(self, spec):
    new = MOVED_MODULES[spec.name]
    _warnings.warn(f"{spec.name} is now {new}; import it from there (the old path goes away "
                   "in the next version).", DeprecationWarning, stacklevel=3)
    module = _importlib.import_module(new)
    self._spec = module.__spec__
    return module

  def exec_module(self, module):
    module.__spec__ = self._spec  # the import system set the old name's spec on it


if not any(isinstance(f, _MovedModuleFinder) for f in _sys.meta_path):
  _sys.meta_path.append(_MovedModuleFinder())
