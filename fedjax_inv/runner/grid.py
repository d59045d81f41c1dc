"""A hyperparameter grid: the ``--sweep`` grammar (:func:`parse_sweep`, :func:`spec_for`,
:func:`points`, :func:`label`) and whether the grid's points share one
compiled program (:func:`plan`, :class:`Plan`, :func:`replica_hparams`), read by the
planner (``experiment.plan_experiment``) and the executor (``executor.execute``).

Points run **batched** (one ``vmap``ped program, :func:`fedjax_inv.runner.replicas.run_replicas`)
when every swept name is *traceable*, a value the algorithm reads in the round
(``Algorithm.traced``): the optimizers' ``client_lr`` / ``server_lr``
(``core.algorithm.learning_rate_in_round``: the optimizer is built from the round's rate,
the built constant in an ordinary run), the coefficients its components read with
``core.algorithm.hparam`` (``Component.traced``: FedProx ``mu``, Fishr ``fishr_lambda``,
FedIIR ``gamma``) and its aggregator's (``core.aggregator.traced_names``: FedGMA's / the
AND-mask's ``tau``). The values live as float32 scalars in each replica's server state, as
``optax.inject_hyperparams`` keeps them in the optimizer state. Otherwise
(``local_steps``, ``batch_size``: they change the program) they run one after another,
with the reason.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Callable

from fedjax_inv.core.algorithm import Algorithm

from fedjax_inv.algorithms.schema import canonical  # --lr is client_lr (the schema's alias)
PLACEHOLDER = 1.0  # value a traced name is built with (each replica reads its own)


def _parse_values(name: str, text: str) -> list:
  vals = []
  for part in text.split(","):
    part = part.strip()
    if not part:
      raise ValueError(f"--sweep {name}={text!r}: an empty value; give comma-separated "
                       "values, e.g. --sweep client_lr=0.1,0.03.")
    try:
      vals.append(json.loads(part))
    except json.JSONDecodeError:
      vals.append(part)
  return vals


def parse_sweep(items) -> dict:
  """Parses sweep settings into ``{scope: {name: [values]}}``.

  Args:
    items: a list of ``"NAME=V1,V2,..."`` or ``"ALGORITHM.NAME=V1,..."`` strings (the
      ``--sweep`` flag, repeatable), or a dict ``{NAME: [values]}`` (config file).
      ``lr`` means ``client_lr``.

  Returns:
    ``{None: {name: values}}`` for unscoped names (every algorithm) plus
    ``{algorithm: {name: values}}`` for scoped ones; each value list has >= 1 distinct
    entries.

  Raises:
    ValueError: a malformed item, an empty or repeated value, a name given twice.
  """
  if isinstance(items, dict):
    items = [f"{k}=" + ",".join(json.dumps(v) if not isinstance(v, str) else v
                                for v in (vs if isinstance(vs, (list, tuple)) else [vs]))
             for k, vs in items.items()]
  if isinstance(items, str):
    items = [items]
  out: dict = {}
  for item in items or []:
    if not isinstance(item, str) or "=" not in item:
      raise ValueError(f"--sweep {item!r}: expected NAME=V1,V2 (e.g. client_lr=0.1,0.03) "
                       "or ALGORITHM.NAME=V1,V2.")
    name, text = (t.strip() for t in item.split("=", 1))
    scope = None
    if "." in name:
      scope, name = (t.strip() for t in name.rsplit(".", 1))
    name = canonical(name)
    if not name or (scope is not None and not scope):
      raise ValueError(f"--sweep {item!r}: expected NAME=V1,V2 or ALGORITHM.NAME=V1,V2.")
    vals = _parse_values(name, text)
    if len({json.dumps(v) for v in vals}) != len(vals):
      raise ValueError(f"--sweep {item!r}: a value is repeated.")
    d = out.setdefault(scope, {})
    if name in d:
      raise ValueError(f"--sweep {name}: given twice; put all values in one "
                       f"--sweep {name}=V1,V2,...")
    d[name] = vals
  return out


def spec_for(parsed: dict, algorithm: str) -> dict:
  """The ``{name: values}`` grid of ``algorithm``: unscoped names plus its scoped ones."""
  spec = dict(parsed.get(None, {}))
  for k, v in parsed.get(algorithm, {}).items():
    if k in spec:
      raise ValueError(f"--sweep {k} and --sweep {algorithm}.{k}: give one of them.")
    spec[k] = v
  return spec


def points(spec: dict) -> list:
  """The grid's points, ``[{name: value}, ...]``: the cartesian product in the order
  given (the last name varies fastest); ``[{}]`` for an empty spec."""
  names = list(spec)
  return [dict(zip(names, combo)) for combo in itertools.product(*(spec[n] for n in names))]


def _fmt(v) -> str:
  return f"{v:g}" if isinstance(v, float) else str(v)


def label(algorithm: str, point: dict) -> str:
  """``'fedprox@client_lr=0.1,mu=0.01'`` (the algorithm itself for an empty point); also
  the run's folder name."""
  if not point:
    return algorithm
  return algorithm + "@" + ",".join(f"{k}={_fmt(v)}" for k, v in point.items())


@dataclasses.dataclass
class Plan:
  """How a sweep of one algorithm runs.

  Attributes:
    algorithm: the registered name.
    points: the grid points ``[{name: value}]``.
    concrete: the algorithm built at every point (validated; its ``hparams`` are what
      each run records).
    batched: whether the points can run as one program.
    structure: the algorithm the batched program is built from (traced names at the
      placeholder), or None.
    traced: the traced names, in order.
    reason: why the points run one after another ('' when batched).
  """
  algorithm: str
  points: list
  concrete: list
  batched: bool
  structure: Algorithm | None
  traced: tuple
  reason: str


def plan(algorithm: str, make: Callable[[dict], Algorithm], pts: list) -> Plan:
  """Builds every point (so a bad value fails before anything compiles) and decides
  whether the points can run batched.

  Args:
    algorithm: registered name.
    make: ``make(point) -> Algorithm`` (the task's settings, the user's overrides, the
      point).
    pts: :func:`points` of the spec.

  Returns:
    a :class:`Plan`.

  Raises:
    ValueError: a point the algorithm refuses (names the point: ``--sweep point
      fedprox@mu=-1: ...``), or a setting every point shares that it refuses, without
      a point (the error of ``make({})``: the value came from elsewhere, not from
      ``--sweep`` / ``--search``).
  """
  concrete = []
  for p in pts:
    try:
      concrete.append(make(p))
    except ValueError as e:
      if not p:  # no point (no --sweep / --search): the value came from another flag
        raise
      try:  # does the algorithm refuse the settings without the point, too?
        make({})
      except ValueError as shared:
        raise shared from None  # the shared settings' error, not the point's
      raise ValueError(f"--sweep point {label(algorithm, p)}: {e}") from None
  names = tuple(pts[0]) if pts else ()
  if not names:
    return Plan(algorithm, pts, concrete, False, None, (), "no sweep")
  first = concrete[0]  # which names are traceable is a property of the structure
  readable = set(first.traced)
  untraced = [k for k in names if k not in readable]
  reason, structure = "", None
  if untraced:
    reason = (f"{', '.join(untraced)} {'is' if len(untraced) == 1 else 'are'} not traced "
              f"by {algorithm} (traceable: {', '.join(sorted(readable))})")
  else:
    structure = make({k: PLACEHOLDER for k in names})
    ref = {k: v for k, v in structure.hparams.items() if k not in names}
    for p, alg in zip(pts, concrete):
      other = {k: v for k, v in alg.hparams.items() if k not in names}
      changed = sorted(k for k in set(ref) | set(other) if ref.get(k) != other.get(k))
      if changed or [c.name for c in alg.components] != [c.name for c in structure.components]:
        reason = (f"point {label(algorithm, p)} also changes {changed or 'the components'}"
                  " (the program's structure)")
        break
  return Plan(algorithm, pts, concrete, not reason, None if reason else structure,
              names, reason)


def replica_hparams(pl: Plan, pairs) -> tuple:
  """``(seeds, hparams)`` per replica of a batched plan, one per ``(point, seed)`` of
  ``pairs`` (the grid's point dicts; shared by :func:`run_sweep` and ``fedjax-inv run``)."""
  return ([int(s) for _, s in pairs],
          [{k: float(p[k]) for k in pl.traced} for p, _ in pairs])
