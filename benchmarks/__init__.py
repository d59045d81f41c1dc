"""The benchmark harness (``harness.py``, behind ``fedjax-inv bench``), its modules
(``workloads``, ``loop_round``: the ``loop`` baseline, ``timing``, ``flops``, ``rss``,
``runs``, ``peers``, ``summary``, ``plots``) and its scripts.

This folder is installed as the package ``fedjax_inv.benchmarks`` (``pyproject.toml``:
``package-dir``), so ``fedjax-inv bench`` and ``from fedjax_inv.benchmarks import
harness`` work from a ``pip install`` or in Colab as well as in a checkout. The measured
results (``RESULTS.md``, ``results_*.json``) and the peers' environment (``peers/``) stay
in the repository only.
"""
