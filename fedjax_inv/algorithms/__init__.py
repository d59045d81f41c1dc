"""Algorithm registry: ``make_algorithm(name, **hparams)``; ``registry()`` lists them.

Each module below registers its paper's algorithms on import.
"""
from fedjax_inv.algorithms.base import make_algorithm, register, registry  # noqa: F401
from fedjax_inv.algorithms import fedavg  # noqa: F401  FedAvg, FedSGD, FedProx, SCAFFOLD, FedOpt
from fedjax_inv.algorithms import invariance  # noqa: F401  Invariant FedAvg (IRMv1), FedIIR
from fedjax_inv.algorithms import fedilc  # noqa: F401  FedILC family, FedCurv
from fedjax_inv.algorithms import fedsr  # noqa: F401  FedSR, FedL2R, FedCMI
from fedjax_inv.algorithms import fedgma  # noqa: F401  FedGMA, AND-mask
