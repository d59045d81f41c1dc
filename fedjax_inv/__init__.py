"""fedjax_inv: a vectorized JAX/Flax simulator for federated learning under distribution
shift (FedILC, Invariant FedAvg, FedSR, FedGMA, FedIIR and their baselines).

Quick API:
  from_client_arrays(xs, ys) -> ClientData     stack per-client numpy arrays
  Task(name, kind, train, eval_sets, model, info)
  make_task(name, ...) / make_algorithm(name, **hparams)
  run(task, algorithm, rounds=..., seed=...) -> RunResult

For algorithm authors (docs/ARCHITECTURE.md): ``Algorithm`` and ``Component`` (the record
and its hooks), ``Aggregator`` (an associative client-axis reduction), ``register`` (adds
a factory to the registry), ``build`` (the common client/server knobs), ``map_reduce``
(the engine's client-axis map-reduce), ``hparam`` (a hyperparameter a sweep may trace),
``client_stage`` / ``server_stage`` (a component's element of the client / server
chain, e.g. SCAFFOLD's gradient correction / control update), ``Objective`` (what a gradient estimator receives), ``sign_agreement`` and
``mask_step`` (a client-message reduction and a server-chain stage: FedGMA in 40 lines,
``algorithms/fedgma.py``) and ``round_parts`` (one round's phases).
"""
__version__ = "0.1.0"

from fedjax_inv import xla_cpu as _xla_cpu  # noqa: E402

_xla_cpu.apply()  # before anything starts JAX's backends (fedjax_inv/xla_cpu.py)

from fedjax_inv import models  # noqa: F401,E402
from fedjax_inv.algorithms import make_algorithm, registry as algorithm_registry  # noqa: F401,E402
from fedjax_inv.algorithms.base import build, register  # noqa: F401,E402
from fedjax_inv.core.aggregator import Aggregator, weighted_mean  # noqa: F401,E402
from fedjax_inv.core.algorithm import (Algorithm, Component, Objective, client_stage,  # noqa: F401,E402
                                       hparam, server_stage)
from fedjax_inv.core.data import ClientData, from_client_arrays  # noqa: F401,E402
from fedjax_inv.core.engine import map_reduce, round_parts  # noqa: F401,E402
from fedjax_inv.aggregators import mask_step, sign_agreement  # noqa: F401,E402
from fedjax_inv.simulation import RunResult, run  # noqa: F401,E402
from fedjax_inv.tasks import Task, make_task, register_task, task_registry  # noqa: F401,E402

__all__ = [
    "Aggregator", "Algorithm", "ClientData", "Component", "Objective", "RunResult", "Task",
    "algorithm_registry", "build", "client_stage", "from_client_arrays", "hparam",
    "make_algorithm", "make_task", "map_reduce", "mask_step", "models", "register",
    "register_task", "round_parts", "run", "server_stage", "sign_agreement",
    "task_registry", "weighted_mean",
]
