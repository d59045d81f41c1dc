import atexit
import os
import shutil
import tempfile

import numpy as np
import pytest

# execution='auto' caches its measured strategy (fedjax_inv/auto_strategy.py): the suite
# (and the CLI subprocesses it starts) uses a cache of its own, never the user's.
if "FEDJAX_INV_CACHE_DIR" not in os.environ:
  os.environ["FEDJAX_INV_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="fedjax_inv_cache_")
  atexit.register(shutil.rmtree, _CACHE, True)  # ours: made just above

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
