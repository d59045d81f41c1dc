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
algorithm from the common knobs,
added to the registry). Also: ``Algorithm`` (the record ``build`` returns), ``hparam`` (a
hyperparameter a sweep may trace), ``Objective`` (what a gradient estimator receives),
``sign_agreement`` and ``mask_step`` (a client-message reduction and a server optimizer
stage: FedGMA in 40 lines, ``algorithms/fedgma.py``), ``map_reduce`` and ``round_parts``
(the engine's client-axis map-reduce and one round's phases).
"""
__version__ = "0.1.0"

from fedjax_inv import xla_cpu as _xla_cpu  # noqa: E402

_xla_cpu.apply()  # before anything starts JAX's backends (fedjax_inv/xla_cpu.py)

from fedjax_inv import models  # noqa: F401,E402
from fedjax_inv.algorithms import make_algorithm, registry as algorithm_registry  # noqa: F401,E402
from fedjax_inv.algorithms.base import build, register, uniform_mean  # noqa: F401,E402
from fedjax_inv.core.aggregator import Aggregator, weighted_mean  # noqa: F401,E402
from fedjax_inv.core.algorithm import (Algorithm, Batch, Component, Context,  # noqa: F401,E402
                                       Forward, Objective, hparam)
from fedjax_inv.core.data import ClientData, from_client_arrays  # noqa: F401,E402
from fedjax_inv.core.engine import map_reduce, round_parts  # noqa: F401,E402
from fedjax_inv.aggregators import mask_step, sign_agreement  # noqa: F401,E402
from fedjax_inv.simulation import RunResult, run  # noqa: F401,E402
from fedjax_inv.tasks import Task, make_task, register_task, task_registry  # noqa: F401,E402

__all__ = [
    "Aggregator", "Algorithm", "Batch", "ClientData", "Component", "Context", "Forward",
    "Objective", "RunResult", "Task", "algorithm_registry", "build", "from_client_arrays",
    "hparam", "make_algorithm", "make_task", "map_reduce", "mask_step", "models",
    "register", "register_task", "round_parts", "run", "sign_agreement",
    "task_registry", "uniform_mean", "weighted_mean",
]
