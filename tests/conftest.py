import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest

# execution='auto' caches its measured strategy (fedjax_inv/runner/auto_strategy.py): the suite
# (and the CLI subprocesses it starts) uses a cache of its own, never the user's.
if "FEDJAX_INV_CACHE_DIR" not in os.environ:
  os.environ["FEDJAX_INV_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="fedjax_inv_cache_")
  atexit.register(shutil.rmtree, _CACHE, True)  # ours: made just above

# One persistent JAX compilation cache for the whole run (pytest-xdist's workers and the CLI
# subprocesses inherit the variable): the many tests that compile the same small round read
# it instead of compiling again. It lives only as long as the run, so every run starts from
# a cold cache, as on a fresh machine.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _JCC = tempfile.mkdtemp(prefix="fedjax_inv_jaxcc_")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
  atexit.register(shutil.rmtree, _JCC, True)  # ours: made just above

# The suite's programs are tiny, so its time goes to compiling them: XLA's LLVM backend at
# -O0 compiles them about twice as fast (measured: test_privacy + test_engine_reference,
# 187 s -> 108 s on 2 cores), and they run as fast as they need to. Only the tests run so:
# a user's runs keep XLA's default. Set the flag in XLA_FLAGS yourself to test at another
# level.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             " --xla_backend_optimization_level=0").strip()

from fedjax_inv import models  # noqa: E402
from fedjax_inv.core.data import from_client_arrays  # noqa: E402


@pytest.fixture(scope="session")
def tiny_binary():
  """5 clients of different sizes, 6 features, a linear label with client-specific shift."""
  rng = np.random.default_rng(0)
  xs, ys = [], []
  for i, n in enumerate((30, 50, 20, 40, 25)):
    x = rng.normal(size=(n, 6)).astype(np.float32) + 0.3 * i
    ys.append((x[:, 0] + 0.5 * x[:, 1] > 0.3 * i).astype(np.int32))
    xs.append(x)
  return from_client_arrays(xs, ys), models.mlp(6, (8,), 1)


# ---------------------------------------------------------------------------- tiers
# tests/slow_tests.txt lists tests measured at >= tiers.SLOW_S seconds in a full run
# (`python tests/tiers.py JUNIT_XML` rewrites it from `pytest -n 2 --junitxml=...`); they
# join the `slow` tier, so the fast tier (`-m "not slow and not multiprocess"`) stays
# within minutes. Modules whose module-scoped fixtures are expensive (a subprocess run that
# their tests share) run on one pytest-xdist worker (`--dist loadgroup`), so that fixture
# runs once.
_ROOT = os.path.dirname(os.path.abspath(__file__))
_ONE_WORKER = ("test_devices", "test_multihost", "test_lodo", "test_install",
               "test_reporting", "test_fedilc_settings")


def _measured_slow() -> set:
  path = os.path.join(_ROOT, "slow_tests.txt")
  if os.environ.get("FEDJAX_INV_IGNORE_SLOW_LIST") or not os.path.isfile(path):
    return set()
  with open(path) as f:
    return {l.strip() for l in f if l.strip() and not l.startswith("#")}


def pytest_collection_modifyitems(config, items):
  slow = _measured_slow()
  for item in items:
    if item.nodeid in slow:
      item.add_marker(pytest.mark.slow)
    mod = item.nodeid.split("::")[0].rsplit("/", 1)[-1][:-3]
    if mod in _ONE_WORKER:
      item.add_marker(pytest.mark.xdist_group(mod))
