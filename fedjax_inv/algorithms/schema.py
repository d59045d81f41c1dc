"""The hyperparameter schema: every hyperparameter a registered algorithm takes, with its
kind and range, its aliases, the ``fedjax-inv run`` flag that sets it, whether one
batched program can trace it, and where it comes from.

One rule per name and one check (:func:`check`, :func:`check_values`), called where a
value enters: the planner of ``fedjax-inv run`` (flags, ``--hp``, config files, every
``--sweep`` / ``--search`` point, before any data is loaded) and
``algorithms.make_algorithm`` (Python callers). The building blocks the factories use
(``prox_component``, ``fediir_component``, ``base.client_optimizer``, ...) keep their own
guards, as any library function does for a direct caller. The
path of ``--lr`` (``docs/ARCHITECTURE.md``): ``cli`` → ``experiment.plan_experiment``
(:func:`canonical`, :func:`check_values`) → ``make_algorithm`` → the factory →
``base.build`` → ``optax.sgd``.

Defaults are the factories' (``make_algorithm(name).hparams``); search spaces are
``algorithms/hparams.py``'s; the tasks' per-algorithm values are task data.
"""
from __future__ import annotations

import dataclasses
import math

from fedjax_inv.core import algorithm as _algorithm
from fedjax_inv.core.algorithm import WEIGHTINGS

CLIENT_OPTIMIZERS = ("sgd", "momentum", "adam")
SERVER_OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "yogi")
CLIENT_OPTIMIZER_STATES = _algorithm.CLIENT_OPTIMIZER_STATES  # defined in the core


@dataclasses.dataclass(frozen=True)
class Param:
  """One hyperparameter.

  ``kind``: 'pos' (a finite number > 0), 'nonneg' (finite, >= 0; 0 switches a term off),
  'unit' (in [0, 1]), 'unit_open' (in [0, 1)), 'int' (an integer >= ``lo``),
  'opt_int' (None or an integer >= 1), 'bool', 'choice' (one of ``choices``), 'str' (a
  string whose choices its factory checks) or 'any' (Python API only, e.g. a schedule).
  ``source``: paper and section. Which names a batched sweep can trace is not a schema
  fact: it is what an algorithm reads in the round (``Algorithm.traced``, declared where
  the value is read; ``fedjax-inv hparams ALGORITHM`` lists it).
  """
  kind: str
  lo: int = 0
  choices: tuple = ()
  source: str = ""


P = Param
SCHEMA = {
    # the client and server recipe (FedAvg, McMahan et al. 2017 Alg. 1; Reddi et al. 2021)
    "client_lr": P("pos", source="FedAvg Alg. 1 client step size η"),
    "server_lr": P("pos", source="Reddi et al. 2021 Alg. 2 server step η_g"),
    "local_steps": P("int", 1, source="FedAvg Alg. 1 local steps (E epochs × B batches)"),
    "batch_size": P("opt_int", source="FedAvg Alg. 1 B (None: the whole client)"),
    "local_epochs": P("opt_int", source="FedAvg Alg. 1 E; Reddi et al. 2021 App. D "
                      "(E epochs of batch B: E*ceil(n_i/B) steps per client)"),
    "client_optimizer": P("choice", choices=CLIENT_OPTIMIZERS, source="client optimizer"),
    "weight_decay": P("nonneg", source="client L2 (server's for FedSGD-type methods)"),
    "client_weight_decay": P("nonneg", source="FedILC official code"),
    "client_optimizer_state": P("choice", choices=CLIENT_OPTIMIZER_STATES,
                                source="FedSR official code keeps client momentum"),
    # a string: FedAvg-type methods take SERVER_OPTIMIZERS, FedSGD-type ones (FedILC)
    # adamw | adam | sgd; each factory checks its own list
    "server_optimizer": P("str", source="Reddi et al. 2021; FedILC §5.1 (Adam)"),
    "server_momentum": P("unit_open", source="FedAvgM, Hsu et al. 2019"),
    "b1": P("unit_open", source="Reddi et al. 2021 β1"),
    "b2": P("unit_open", source="Reddi et al. 2021 β2"),
    "server_tau": P("pos", source="Reddi et al. 2021 τ (adaptivity)"),
    "eps": P("pos", source="Adam ε (FedILC's server Adam)"),
    "aggregator": P("str", source="mean | geometric[...] | gma | and_mask"),
    "weighting": P("choice", choices=WEIGHTINGS, source="FedAvg n_k weights or uniform"),
    "tau": P("unit", source="FedGMA §4 sign-agreement threshold τ"),
    "base": P("str", source="FedGMA: the FedAvg-type base algorithm"),
    "mask_at": P("str", source="FedGMA: where the mask is applied"),
    # FedProx, SCAFFOLD, FedCurv
    "mu": P("nonneg", source="FedProx §3 proximal coefficient μ"),
    "curv_lambda": P("nonneg", source="Shoham et al. 2019 λ"),
    # Invariant FedAvg (IRMv1)
    "penalty_weight": P("nonneg", source="Invariant FedAvg / IRMv1 λ"),
    "warmup_rounds": P("int", 0, source="IRMv1 penalty anneal, in rounds"),
    "warmup_weight": P("nonneg", source="IRMv1 weight during the warm-up"),
    "irm_mode": P("str", source="Invariant FedAvg: client or server IRM"),
    "lambda_schedule": P("any", source="optax schedule for λ (Python API)"),
    # FedIIR
    "gamma": P("nonneg", source="FedIIR eq. 9 penalty factor γ"),
    "ema": P("unit_open", source="FedIIR App. C EMA factor"),
    "ema_init": P("str", source="FedIIR: the EMA's first value"),
    # FedILC (Fishr, Inter/Intra-Geo)
    "fishr_lambda": P("nonneg", source="FedILC §3.2 Fishr λ"),
    "fishr_reduction": P("str", source="FedILC official code: sum or mean"),
    "fisher_chunk": P("int", 1, source="per-example gradients per chunk (memory)"),
    "zeros": P("str", source="FedILC geometric mean: the sign of zeros"),
    "intra_chunk": P("int", 1, source="Intra-Geo per-example gradients per chunk"),
    "intra_group_size": P("opt_int", source="FedILC official code: mini-batches of 32"),
    "intra_groups": P("opt_int", source="Intra-Geo number of groups (None: by size)"),
    "intra_shuffle": P("bool", source="Intra-Geo: shuffle before grouping"),
    "rescale": P("bool", source="FedILC: rescale the geometric mean"),
    # Ditto
    "ditto_lambda": P("nonneg", source="Ditto eq. 2 λ (pull of the personal "
                      "model to the global one)"),
    "personal_steps": P("opt_int", source="Ditto Alg. 1 s (None: local_steps)"),
    "personal_lr": P("pos", source="Ditto Alg. 1 η of the personal steps"),
    # FedSR
    "alpha_l2r": P("nonneg", source="FedSR eq. 4 α_L2R"),
    "alpha_cmi": P("nonneg", source="FedSR eq. 6 α_CMI"),
    "l2r_squared": P("bool", source="FedSR official code: squared L2 norm"),
    "probabilistic": P("bool", source="FedSR §3: probabilistic representation"),
    "mc_samples": P("int", 1, source="FedSR: samples of z at evaluation"),
    "r_mode": P("str", source="FedSR: reference distribution r(z|y)"),
    "sigma_min": P("pos", source="FedSR: lower bound of σ"),
    "z_dim": P("opt_int", source="FedSR: representation size (None: the model's)"),
}
del P

# ``--lr`` is ``client_lr`` (the only alias); the run flags that set a hyperparameter.
ALIASES = {"lr": "client_lr"}
RUN_FLAGS = {"lr": "client_lr", "server_lr": "server_lr", "local_steps": "local_steps",
             "local_epochs": "local_epochs",
             "batch_size": "batch_size", "client_optimizer": "client_optimizer",
             "aggregator": "aggregator", "tau": "tau"}


def canonical(name: str) -> str:
  """The schema name of ``name`` (``'lr'`` -> ``'client_lr'``; other names unchanged)."""
  return ALIASES.get(name, name)


def check(name: str, value, where: str | None = None, sep: str = "="):
  """Checks one value against the schema and returns it (ints stay ints).

  Args:
    name: a schema name or alias (``lr``); a name the schema does not know is returned
      unchecked (the factory refuses names it does not take).
    value: the value.
    where: how the message names it (default ``name``), e.g. ``'--hp fedprox.mu'``.
    sep: between ``where`` and the value in the message (``' '`` for a run flag).

  Raises:
    ValueError: ``"<where>=<value>: must be <what is allowed>."``
  """
  p = SCHEMA.get(canonical(name))
  where = where or name

  def _fail(where, value, what):
    raise ValueError(f"{where}{sep}{value!r}: must be {what}.")
  if p is None or p.kind == "any":
    return value
  k = p.kind
  if k in ("pos", "nonneg", "unit", "unit_open"):
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
        or not math.isfinite(value):
      _fail(where, value, "a finite number")
    if k == "pos" and value <= 0:
      _fail(where, value, "> 0")
    if k == "nonneg" and value < 0:
      _fail(where, value, ">= 0 (0 switches the term off)")
    if k == "unit" and not 0 <= value <= 1:
      _fail(where, value, "in [0, 1]")
    if k == "unit_open" and not 0 <= value < 1:
      _fail(where, value, "in [0, 1)")
  elif k in ("int", "opt_int"):
    if value is None and k == "opt_int":
      return value
    lo = p.lo if k == "int" else 1
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
        or not math.isfinite(value) or int(value) != value or value < lo:
      _fail(where, value, f"an integer >= {lo}" + (" or None" if k == "opt_int" else ""))
    return int(value)
  elif k == "bool":
    if not isinstance(value, bool):
      _fail(where, value, "true or false")
  elif k == "choice":
    if value not in p.choices:
      _fail(where, value, "one of " + ", ".join(p.choices))
  elif k == "str" and not isinstance(value, str):
    _fail(where, value, "a string")
  return value


def check_values(values: dict, where: str = "", algorithm: str | None = None) -> dict:
  """:func:`check` on every ``{name: value}``; returns them with aliases resolved.

  ``where`` prefixes each name in the message (``'--hp '`` gives ``--hp mu=-1``);
  ``algorithm`` is named after it (``(fedprox)``).

  Raises:
    ValueError: the first bad value, or a name given both as itself and as its alias.
  """
  out = {}
  for name, v in values.items():
    key = canonical(name)
    if key in out:
      raise ValueError(f"{where}{name} and {where}{key} both given; give one of them.")
    label = f"{where}{name}"
    try:
      out[key] = check(key, v, label)
    except ValueError as e:
      if algorithm is None:
        raise
      raise ValueError(str(e).replace(f"{label}={v!r}:", f"{label}={v!r} ({algorithm}):",
                                      1)) from None
  return out
