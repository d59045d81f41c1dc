"""Running experiments: the configuration and its checks (``config``), plans and their
execution (``experiment``, ``executor``, ``replicas``, ``auto_strategy``), the training loop
(``simulation``), sweeps, random search and tuning (``grid``, ``sweep``, ``tuning``),
leave-one-domain-out runs (``lodo``), checkpoints, outputs, loggers and progress.

Nothing is imported with the package; import the module you need, e.g.
``from fedjax_inv.runner import simulation``.
"""
