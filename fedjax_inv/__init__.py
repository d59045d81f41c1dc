"""fedjax_inv: a vectorized JAX/Flax simulator for federated learning under distribution
shift (FedILC, Invariant FedAvg, FedSR, FedGMA, FedIIR and their baselines).

Quick API:
  from_client_arrays(xs, ys) -> ClientData     stack per-client numpy arrays
  Task(name, kind, train, eval_sets, model, info)
  make_task(name, ...) / make_algorithm(name, **hparams)
  run(task, algorithm, rounds=..., seed=...) -> RunResult
"""
__version__ = "0.1.0"

from fedjax_inv import models  # noqa: F401,E402
from fedjax_inv.algorithms import make_algorithm, registry as algorithm_registry  # noqa: F401,E402
from fedjax_inv.core.data import ClientData, from_client_arrays  # noqa: F401,E402
from fedjax_inv.core.simulation import RunResult, run  # noqa: F401,E402
from fedjax_inv.tasks import Task, make_task, task_registry  # noqa: F401,E402
