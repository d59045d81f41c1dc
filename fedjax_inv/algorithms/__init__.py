"""Algorithm registry: ``make_algorithm(name, **hparams)``; ``registry()`` lists them."""
from fedjax_inv.algorithms.base import make_algorithm, register, registry  # noqa: F401
from fedjax_inv.algorithms import fedavg  # noqa: F401  (registers the FedAvg family)
