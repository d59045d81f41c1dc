"""Federated tasks: the ``Task`` record, its registry and one module per task family.

``make_task(name, data_dir=None, source='auto', download=False, seed=0, **kw) -> Task``.
No task downloads anything unless ``download=True``; offline, image tasks fall back to the
real digits that ship inside packages and say so in ``task.info``.

Families (each registers its tasks on import; this is the one place that imports them):
``colored_mnist`` (IRM / FedILC ColoredMNIST), ``synthetic`` (Invariant FedAvg §4.1),
``rotated`` (RotatedMNIST, Rotated-CIFAR10, FedCMNIST, FedRotMNIST), ``noniid`` (FedGMA
§5.1), ``eicu`` (FedILC §5.1.3), ``domainbed`` (PACS, VLCS, OfficeHome, DomainNet),
``federated`` (FEMNIST, Shakespeare, CIFAR-100 at their real client counts), ``hf`` (any
Hugging Face hub dataset, partitioned by Flower Datasets; imported lazily on use).
Data sources and partitioners live in ``fedjax_inv/data/``.
"""
from fedjax_inv.tasks.base import (KINDS, Task, TaskEntry, _TASKS, check_task,  # noqa: F401
                                   make_task, register_task, task_registry,
                                   with_validation)
from fedjax_inv.tasks import (colored_mnist, domainbed, eicu, federated, hf,  # noqa: F401,E402
                              noniid, rotated, synthetic)

__all__ = ["KINDS", "Task", "TaskEntry", "check_task", "make_task", "register_task",
           "task_registry", "with_validation"]
