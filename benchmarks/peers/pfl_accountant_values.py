"""epsilon and noise values of pfl-research's accountants, for tests/test_privacy.py.

Run in the pfl-research environment (benchmarks/peers/setup_pfl.sh):
  benchmarks/peers/.venv-pfl/bin/python benchmarks/peers/pfl_accountant_values.py \
      > tests/data/pfl_accountant_values.json
For each (q, sigma, T, delta): pfl's RDPPrivacyAccountant and PLDPrivacyAccountant
(Poisson-sampled Gaussian, add-or-remove-one) epsilon, and the noise multiplier each
finds for a target epsilon (its binary search).
"""
import importlib.metadata
import json
import sys

from pfl.privacy.privacy_accountant import PLDPrivacyAccountant, RDPPrivacyAccountant

GRID = [(0.01, 1.0, 100, 1e-5), (0.01, 0.8, 1000, 1e-5), (0.1, 2.0, 50, 1e-6),
        (0.001, 1.2, 5000, 1e-5), (0.05, 1.5, 200, 1e-5)]
TARGETS = [(0.01, 100, 1e-5, 2.0), (0.01, 1000, 1e-5, 8.0), (0.1, 50, 1e-6, 4.0)]

rows = {"pfl": importlib.metadata.version("pfl"),
        "dp_accounting": importlib.metadata.version("dp-accounting"),
        "epsilon": [], "noise": []}
ACCOUNTANTS = (("rdp", RDPPrivacyAccountant), ("pld", PLDPrivacyAccountant))


def run(row: dict, attr: str, **given) -> dict:
  """``row`` with each accountant's ``attr`` (epsilon, or the noise it searched for)."""
  for name, cls in ACCOUNTANTS:
    acc = cls(num_compositions=row["rounds"], sampling_probability=row["q"],
              mechanism="gaussian", delta=row["delta"], **given)
    row[name] = getattr(acc, attr)
  return row


for q, sigma, t, delta in GRID:
  rows["epsilon"].append(run({"q": q, "sigma": sigma, "rounds": t, "delta": delta},
                             "epsilon", noise_parameter=sigma))
for q, t, delta, eps in TARGETS:
  rows["noise"].append(run({"q": q, "rounds": t, "delta": delta, "target_epsilon": eps},
                           "noise_parameter", epsilon=eps))
json.dump(rows, sys.stdout, indent=1)
print()
