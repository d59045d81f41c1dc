"""Algorithm registry: ``make_algorithm(name, **hparams)``; ``registry()`` lists them.

Each module below registers its paper's algorithms on import.
"""
from fedjax_inv.algorithms.base import make_algorithm, register, registry  # noqa: F401
from fedjax_inv.algorithms import fedavg  # noqa: F401  FedAvg, FedSGD, FedProx, SCAFFOLD, FedOpt
from fedjax_inv.algorithms import invariance  # noqa: F401  Invariant FedAvg (IRMv1)
from fedjax_inv.algorithms import fediir  # noqa: F401  FedIIR
from fedjax_inv.algorithms import fedilc  # noqa: F401  FedILC family (FedSGD-type)
from fedjax_inv.algorithms import fedcurv  # noqa: F401  Shoham et al.'s FedCurv
from fedjax_inv.algorithms import fedsr  # noqa: F401  FedSR, FedL2R, FedCMI
from fedjax_inv.algorithms import fedgma  # noqa: F401  FedGMA, AND-mask
from fedjax_inv.algorithms import ditto  # noqa: F401  Ditto (personalization)
