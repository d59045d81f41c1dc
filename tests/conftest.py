import numpy as np
import pytest

from fedjax_inv import models
from fedjax_inv.core.data import from_client_arrays


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
