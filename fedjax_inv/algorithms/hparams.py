"""The hyperparameter registry, in DomainBed's style (``hparams_registry.py``): for every
registered algorithm, its defaults, its search space for random search, and (through the
tasks) the papers' values per task.

* **Defaults** have one home, the factory: :func:`defaults` is the resolved
  ``make_algorithm(name).hparams`` (every knob, base recipe included); this module keeps
  no second copy of them.
* **Search spaces** live here (:data:`SEARCH`, :func:`search_space`): each range says
  where it comes from (DomainBed's ranges for IRM, Fishr, the AND-mask; the papers' grids
  for FedProx, FedIIR, FedSR, Reddi et al.). A FedSGD-type algorithm (``Entry.fixed``)
  drops the client knobs it fixes and is searched over its server learning rate instead.
* **The papers' values per task** are the tasks' ``defaults['per_algorithm']`` blocks
  (``fedjax_inv/tasks``), printed with the rest by ``fedjax-inv hparams ALGORITHM``.

``fedjax-inv run --search N`` draws N points per algorithm (:func:`random_points`,
reproducible from ``--search-seed``) and runs them as sweep points (batched when every
drawn name is traced); every run records its resolved values in ``summary.json``.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_inv.algorithms.base import make_algorithm, registry


@dataclasses.dataclass(frozen=True)
class Range:
  """One hyperparameter's search range.

  ``kind``: 'log10' (``10 ** U(lo, hi)``), 'uniform' (``U(lo, hi)``), 'int_log2'
  (``int(2 ** U(lo, hi))``) or 'choice' (one of ``choices``, uniformly). ``source``:
  where the range comes from (paper and section, or DomainBed)."""
  kind: str
  lo: float = 0.0
  hi: float = 0.0
  choices: tuple = ()
  source: str = ""

  def sample(self, rng: np.random.Generator):
    if self.kind == "choice":
      return self.choices[int(rng.integers(len(self.choices)))]
    u = float(rng.uniform(self.lo, self.hi))
    if self.kind == "uniform":
      return _round(u)
    if self.kind == "log10":
      return _round(10.0 ** u)
    if self.kind == "int_log2":
      return int(2 ** u)
    raise ValueError(f"Range kind {self.kind!r}; use log10, uniform, int_log2 or choice.")

  def describe(self) -> str:
    if self.kind == "choice":
      return f"one of {list(self.choices)}"
    form = {"log10": "10^U({}, {})", "uniform": "U({}, {})", "int_log2": "int(2^U({}, {}))"}
    return form[self.kind].format(self.lo, self.hi)


def _round(v: float, digits: int = 3) -> float:
  """``v`` to ``digits`` significant digits (readable run labels, exact replays)."""
  if v == 0 or not math.isfinite(v):
    return v
  return float(f"{v:.{digits}g}")


# Client recipe of every FedAvg-type algorithm (DomainBed: lr 10^U(-5, -3.5) for Adam;
# SGD clients in FL take larger steps: FedAvg/FedProx grids 1e-3..1e-1). The local steps
# and batch size stay the task's (as DomainBed keeps its steps fixed): they change the
# program, so a search over them could not run batched.
CLIENT = {"client_lr": Range("log10", -3.0, -0.5, source="FedAvg / FedProx lr grids")}
SERVER = {"server_lr": Range("log10", -4.0, -2.0, source="FedILC §5.1 (3e-4, 1e-4, 2e-4)")}
REDDI = {"server_lr": Range("log10", -3.0, 0.0, source="Reddi et al. 2021 grid 1e-3..1")}
MASK = {"tau": Range("uniform", 0.5, 1.0, source="DomainBed ANDMask tau U(0.5, 1)")}
FISHR = {"fishr_lambda": Range("log10", -1.0, 4.0, source="FedILC §5.1 λ 0.1-15 and "
                                "DomainBed Fishr 10^U(1, 4)")}
SEARCH = {
    "fedprox": {"mu": Range("log10", -3.0, 0.0, source="FedProx §5 grid 0.001..1")},
    "fedadam": REDDI, "fedyogi": REDDI, "fedadagrad": REDDI,
    "fedavgm": {"server_momentum": Range("choice", choices=(0.0, 0.9, 0.97, 0.99),
                                         source="Hsu et al. 2019 grid")},
    "inv_fedavg": {"penalty_weight": Range("log10", -1.0, 5.0, source="DomainBed IRM "
                                           "lambda 10^U(-1, 5)"),
                   "warmup_rounds": Range("int_log2", 0.0, 8.0, source="DomainBed IRM "
                                          "anneal 10^U(0, 4) steps, here in rounds")},
    "fediir": {"gamma": Range("log10", -4.0, -1.0, source="FedIIR §5.4 Fig. 4 grid "
                              "1e-4..1e-1"),
               "ema": Range("uniform", 0.9, 0.99, source="DomainBed Fishr EMA U(0.9, 0.99)")},
    "fedsr": {"alpha_l2r": Range("log10", -4.0, -1.0, source="FedSR §4 (official 1e-2)"),
              "alpha_cmi": Range("log10", -4.0, -1.0, source="FedSR §4 (official 5e-4)")},
    "fedl2r": {"alpha_l2r": Range("log10", -4.0, -1.0, source="FedSR §4")},
    "fedcmi": {"alpha_cmi": Range("log10", -4.0, -1.0, source="FedSR §4")},
    "ditto": {"ditto_lambda": Range("log10", -2.0, 0.5, source="Ditto eq. 2 λ: 0.01 "
                                    "(nearly local models) to 3.2 (near the global)")},
    "fedgma": MASK, "and_mask": MASK,
    "fishr_inter_geo": FISHR, "fishr_intra_geo": FISHR, "fishr_intra_arith": FISHR,
    "fedcurv": FISHR,
    "fedcurv_shoham": {"curv_lambda": Range("log10", -2.0, 2.0, source="not in FedILC; "
                                            "Shoham et al. 2019 leave it open")},
}


def _entry(name: str):
  reg = registry()
  if name not in reg:
    raise ValueError(f"unknown algorithm {name!r}; available: {sorted(reg)}.")
  return reg[name]


def defaults(name: str) -> dict:
  """The resolved default hyperparameters of ``name`` (``make_algorithm(name).hparams``).

  Raises:
    ValueError: unknown algorithm (lists the registered ones)."""
  _entry(name)
  return dict(make_algorithm(name).hparams)


def search_space(name: str) -> dict:
  """``{hyperparameter: Range}`` searched for ``name``: the client recipe (unless the
  algorithm fixes it: FedSGD-type methods get their server learning rate instead) plus
  the algorithm's own ranges (:data:`SEARCH`).

  Raises:
    ValueError: unknown algorithm."""
  entry = _entry(name)
  fixed = set(entry.fixed)
  space = {k: r for k, r in CLIENT.items() if k not in fixed}
  if "client_lr" in fixed and name != "fedsgd":
    space.update(SERVER)
  elif name == "fedsgd":
    space.update(server_lr=Range("log10", -2.0, 0.0, source="FedSGD server step grid"))
  space.update(SEARCH.get(name, {}))
  return space


def random_points(name: str, n: int, seed: int = 0, exclude=(), space=None) -> list:
  """``n`` random points ``[{hyperparameter: value}]`` of :func:`search_space`, without
  the names in ``exclude`` (values fixed by the user). ``space``: optional ``{name:
  Range}`` that replaces or adds ranges (an experiment's task-specific range, given the
  same to every method it compares). Reproducible: the stream depends on ``seed``,
  ``name`` and the space only (DomainBed's ``hparams_seed``). Floats are rounded to 3
  significant digits.

  Raises:
    ValueError: ``n`` not a positive int; ``seed`` negative; unknown algorithm; an empty
      space (every name excluded).
  """
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise ValueError(f"search points n={n!r}; use a positive int.")
  if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
    raise ValueError(f"search seed={seed!r}; use an int >= 0.")
  space = {k: r for k, r in {**search_space(name), **(space or {})}.items()
           if k not in set(exclude)}
  if not space:
    raise ValueError(f"{name}: nothing left to search (every name of its space is in "
                     f"exclude={sorted(exclude)}); search fewer fixed names.")
  rng = np.random.default_rng([seed, *name.encode()])
  out = []
  for _ in range(100 * n):  # distinct points (a 'choice' range may repeat a draw)
    p = {k: r.sample(rng) for k, r in space.items()}
    if p not in out:
      out.append(p)
    if len(out) == n:
      return out
  raise ValueError(f"{name}: only {len(out)} distinct points in its search space "
                   f"{sorted(space)}; ask for fewer (--search {len(out)}).")
