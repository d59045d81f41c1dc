"""Experiments as specs: a list of runs, each run by the one executor.

An experiment folder holds a spec (``spec.yaml``), its raw results, a table generator and
a README; it holds no loop over seeds or methods and no resume logic. This module reads
the spec, expands it into runs, and runs each (run, seed) through the same planner and
executor as ``fedjax-inv run`` (``experiment.plan_experiment`` then
``executor.execute``), writing one raw record per (run, seed). A record already on disk
with the same key is kept: re-running a spec resumes it. ``fedjax-inv tune`` writes its
records through :func:`run_record` too.

A spec (YAML; every key but ``groups`` optional)::

  description: Robust aggregation under attack
  base:                      # fedjax-inv run keys shared by every run
    task: mnist_noniid
    rounds: 40
    task_arg: [num_clients=20, model=mlp]
  seeds: [0, 1, 2]           # the training seeds of every run
  data_seed: each            # each seed's data from that seed, or an int: one split
  record: "results/raw/{group}/{name}-seed{seed}.json"  # relative to the spec's folder
  x-aggregators: &aggs       # keys starting 'x-' are ignored: a place for YAML anchors
    mean: {aggregator: mean}
    krum: {aggregator: "krum:f=4"}
  groups:
    - group: attacks
      name: "{aggregator}-{attack}-{fraction}"   # formatted with the option labels
      axes:                  # the runs: the product of every axis's options
        aggregator: *aggs
        attack: {sign_flip: {attack: sign_flip}}
        fraction: {"0.2": {attack_fraction: 0.2}}

A run's configuration is ``base``, then its group's ``config``, then each chosen option
in axis order. A record holds the run's key, the algorithm's hyperparameters, where the
data came from (:func:`data_record`), the final and per-evaluation metrics, the paper
protocol's selections, its seconds and execution strategy, and the provenance of the
code that made it.

Source: the experiment layout is this project's (``docs/ARCHITECTURE.md``, "Experiments
as specs"); DomainBed (Gulrajani & Lopez-Paz 2021, §4) for one record per (run, seed).
"""
from __future__ import annotations

import dataclasses
import io
import itertools
import json
import pathlib
import string
import sys
from typing import Any, Optional

import numpy as np

from fedjax_inv.runner import executor, outputs

DEFAULT_RECORD = "results/{group}/{name}/seed{seed}.json"
SPEC_KEYS = ("description", "base", "seeds", "data_seed", "record", "groups")
# fedjax-inv run keys a spec run may not set: the spec's own seeds, record paths and resume
# take their place.
NOT_IN_A_RUN = {"seed": "the spec's 'seeds' list", "seeds": "the spec's 'seeds' list",
                "out": "the spec's 'record' path", "resume": "re-running the spec",
                "overwrite": "removing the record file", "dry_run": "--dry-run",
                "checkpoint_every": "re-running the spec (a record is written when its "
                                    "run ends)",
                "sweep": "an axis of the group, one option per value",
                "search": "fedjax-inv tune (the same executor, with a validation split)"}
GROUP_KEYS = ("group", "name", "config", "axes")


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run of a spec: its group, its name, the option label chosen on each axis and
  its full ``fedjax-inv run`` configuration (``base``, then the group's ``config``, then
  each option's keys)."""
  group: str
  name: str
  labels: tuple
  config: tuple  # sorted (key, value) items: hashable and immutable

  @property
  def label(self) -> str:
    """``group/name`` (``name`` alone for a run without a group)."""
    return f"{self.group}/{self.name}" if self.group else self.name

  @property
  def cfg(self) -> dict:
    """The run's configuration as a fresh dict."""
    return json.loads(json.dumps(dict(self.config)))


@dataclasses.dataclass(frozen=True)
class Spec:
  """A loaded spec (:func:`load_spec`): its file, description, seeds, data seed rule
  (``'each'`` or one split seed), record path template and runs."""
  path: Optional[pathlib.Path]
  description: str
  seeds: tuple
  data_seed: Any
  record: str
  runs: tuple

  def record_path(self, out: pathlib.Path, run: RunSpec, seed: int) -> pathlib.Path:
    """Where the record of ``(run, seed)`` goes: ``record`` formatted, under ``out``
    (``fedjax-inv experiment``'s default: the spec's own folder)."""
    return pathlib.Path(out) / self.record.format(group=run.group, name=run.name,
                                                  seed=int(seed))

  def select(self, where: Optional[dict] = None) -> list:
    """The runs whose option on every axis named in ``where`` (``{axis: [labels]}``)
    is one of the labels given; ``{'group': [...]}`` selects groups.

    Raises:
      ValueError: an axis or label that no run has, naming the ones there are.
    """
    where = {k: [str(v) for v in vs] for k, vs in (where or {}).items()}
    axes: dict = {"group": {r.group for r in self.runs}}
    for r in self.runs:
      for k, v in r.labels:
        axes.setdefault(k, set()).add(v)
    for k, vs in where.items():
      if k not in axes:
        raise ValueError(f"--where {k}=...: no axis {k!r} in this spec; its axes are "
                         f"{', '.join(sorted(axes))}.")
      bad = sorted(set(vs) - axes[k])
      if bad:
        raise ValueError(f"--where {k}={','.join(bad)}: not an option of axis {k!r}; it "
                         f"has {', '.join(sorted(axes[k]))}.")
    keep = []
    for r in self.runs:
      have = {"group": r.group, **dict(r.labels)}
      if all(k in have and have[k] in vs for k, vs in where.items()):
        keep.append(r)
    return keep


def _fail(where: str, what: str) -> ValueError:
  return ValueError(f"spec {where}: {what}")


def parse_spec(doc: dict, path: Optional[pathlib.Path] = None) -> Spec:
  """A :class:`Spec` from a spec document (the parsed YAML; module docstring).

  Raises:
    ValueError: an unknown key, a group without ``name`` or ``axes``, an axis without
      options, two runs of one name, seeds that are not distinct integers >= 0, or a
      ``record`` template with a field other than ``{group}``, ``{name}``, ``{seed}`` or
      without ``{seed}``; the message names the key and the fix.
  """
  if not isinstance(doc, dict):
    raise _fail(str(path or ""), "the file must hold a mapping with a 'groups' list.")
  unknown = sorted(k for k in set(doc) - set(SPEC_KEYS) if not str(k).startswith("x-"))
  if unknown:
    raise _fail(str(unknown), f"unknown key(s); a spec has {', '.join(SPEC_KEYS)} (and "
                "'x-NAME' keys, ignored, to hold YAML anchors).")
  seeds = doc.get("seeds", [0])
  if (not isinstance(seeds, list) or not seeds or len(set(seeds)) != len(seeds)
      or not all(isinstance(s, int) and s >= 0 for s in seeds)):
    raise _fail(f"seeds {seeds!r}", "give a list of distinct integers >= 0, e.g. [0, 1, 2].")
  data_seed = doc.get("data_seed", "each")
  if data_seed != "each" and not (isinstance(data_seed, int) and data_seed >= 0):
    raise _fail(f"data_seed {data_seed!r}", "use 'each' (each seed's data from that seed) "
                "or one integer >= 0 (one split for every seed).")
  record = str(doc.get("record", DEFAULT_RECORD))
  fields = sorted({f for _, f, _, _ in string.Formatter().parse(record) if f is not None})
  if set(fields) - {"group", "name", "seed"} or "seed" not in fields:
    raise _fail(f"record {record!r}", "a record path may use {group}, {name} and {seed} "
                "only, and must use {seed}; put axis labels in the group's 'name' "
                "template, e.g. record: 'results/{name}-seed{seed}.json'.")
  base = dict(doc.get("base") or {})
  groups = doc.get("groups")
  if not isinstance(groups, list) or not groups:
    raise _fail("groups", "give a list of groups, each with 'group', 'name' and 'axes'.")
  runs, names = [], set()
  for i, g in enumerate(groups):
    where = f"groups[{i}]"
    if not isinstance(g, dict) or "name" not in g:
      raise _fail(where, "each group needs a 'name' template, e.g. '{aggregator}-{attack}'.")
    unknown = sorted(set(g) - set(GROUP_KEYS))
    if unknown:
      raise _fail(f"{where} {unknown}", f"unknown key(s); a group has "
                  f"{', '.join(GROUP_KEYS)}.")
    axes = g.get("axes") or {}
    for axis, options in axes.items():
      if not isinstance(options, dict) or not options:
        raise _fail(f"{where}.axes.{axis}", "give a mapping of option label -> run keys "
                    "(an empty mapping {} for an option that changes nothing).")
      for lab, opt in options.items():
        if opt is not None and not isinstance(opt, dict):
          raise _fail(f"{where}.axes.{axis}.{lab}", f"{opt!r} is not a mapping of run "
                      "keys; write e.g. {lr: 0.1} ({} for an option that changes nothing).")
    combos = itertools.product(*[[(axis, str(lab), opt or {}) for lab, opt in opts.items()]
                                 for axis, opts in axes.items()])
    for combo in combos:
      labels = tuple((axis, lab) for axis, lab, _ in combo)
      cfg = {**base, **(g.get("config") or {})}
      for _, _, opt in combo:
        cfg.update(opt)
      try:
        name = str(g["name"]).format(**dict(labels))
      except KeyError as e:
        raise _fail(f"{where}.name {g['name']!r}", f"{e} is not an axis of the group "
                    f"({', '.join(axes) or 'none'}).") from None
      group = str(g.get("group", ""))
      if (group, name) in names:
        raise _fail(f"{where}", f"two runs are named {group}/{name}; put every axis in "
                    "the name template.")
      names.add((group, name))
      runs.append(RunSpec(group, name, labels, tuple(sorted(
          (k, json.loads(json.dumps(v))) for k, v in cfg.items()))))
  return Spec(path, str(doc.get("description", "")), tuple(seeds), data_seed,
              record, tuple(runs))


def load_spec(path) -> Spec:
  """Reads and parses a YAML or JSON spec file (:func:`parse_spec`); never executes it.

  Raises:
    ValueError: a missing or malformed file (naming it), or what :func:`parse_spec`
      refuses.
  """
  p = pathlib.Path(path)
  if not p.is_file():
    raise ValueError(f"spec {str(p)!r}: no such file; give the path of a spec.yaml (e.g. "
                     "experiments/robustness/spec.yaml).")
  import yaml
  try:
    doc = yaml.safe_load(p.read_text())
  except yaml.YAMLError as e:
    raise ValueError(f"spec {str(p)!r} is not valid YAML: {e}") from None
  return parse_spec(doc, p)


def data_record(task) -> dict:
  """Where a run's data came from and how much of it there was, for its raw record:
  ``{'source', 'note', 'train_clients', 'train_examples', 'eval_sets': {name:
  {'clients', 'examples'}}}`` (examples: real rows, padding excluded)."""
  def size(data) -> dict:
    return {"clients": int(data.num_clients), "examples": int(np.asarray(data.n).sum())}
  info = task.info or {}
  train = size(task.train)
  return {"source": info.get("dataset_source", "generated by the task"),
          "note": info.get("data_note", info.get("split_note", "")),
          "train_clients": train["clients"], "train_examples": train["examples"],
          "eval_sets": {k: size(v) for k, v in task.eval_sets.items()}}


class _Records(executor.Recorder):
  """The executor's ``Recorder`` (nothing written) that also keeps each run's
  :func:`data_record`, from the executor's task cache as the run ends."""

  def __init__(self, pl, ex, stream):
    super().__init__(pl, None, stream)
    self.ex, self.data = ex, {}

  def __call__(self, key, res, base, ckpt, info, batched=False):
    self.data[key] = data_record(executor.task_for(self.pl, self.ex, key[2], key[1]))
    super().__call__(key, res, base, ckpt, info, batched)


def run_seeds(cfg: dict, seeds, *, task=None, overrides=None, data_seed=None,
              stream=None):
  """The runs of ``cfg``'s single algorithm for every training seed in ``seeds``, through
  the planner and the executor of ``fedjax-inv run`` (which batches them as one program
  where ``--replicas`` allows: by default on a GPU or TPU, not on a CPU), nothing written.

  Args:
    cfg: ``fedjax-inv run`` keys (``fedjax_inv.runner.config.RUN_KEYS``); its ``seed``
      and ``seeds`` are set here.
    seeds: the training seeds (model init, client sampling, minibatches, attackers).
    task: a built ``Task`` to run instead of ``cfg['task']`` (e.g. with a validation
      split), or None.
    overrides: algorithm hyperparameters (``{name: value}``), as ``fedjax-inv run``'s.
    data_seed: the seed of the task's data; None = each training seed's own (the data of
      seed s is built from s).
    stream: where the executor's lines go (default: dropped).

  Returns:
    ``({seed: (result, data)}, plan)``: per seed the ``simulation.RunResult`` (or the
    ``simulation.DivergedError`` of a run whose objective became non-finite) and its
    :func:`data_record`; and the executed ``experiment.Plan``.

  Raises:
    ValueError: what ``fedjax-inv run`` refuses (before any compile); ``cfg`` naming
      more than one algorithm or more than one held-out domain.
  """
  from fedjax_inv.runner import experiment
  seeds = [int(s) for s in seeds]
  cfg = {**cfg, "seed": seeds[0], "seeds": len(seeds)}
  if "," in str(cfg.get("algorithm", "")):
    raise ValueError(f"algorithm={cfg['algorithm']!r}: a spec run trains one algorithm; "
                     "make the algorithm an axis of the group instead.")
  held = str(cfg.get("holdout", ""))
  if held == "all" or "," in held:
    raise ValueError(f"holdout={held!r}: a spec run holds out one domain; make the "
                     "held-out domain an axis of the group instead.")
  each = data_seed is None and task is None
  tkw = None if each or task is not None else {"seed": int(data_seed)}
  pl = experiment.plan_experiment(cfg, overrides, task=task, task_kwargs=tkw, seeds=seeds,
                                  resplit=each)
  stream = stream if stream is not None else io.StringIO()
  ex = executor.Execution.start(pl)
  rec = _Records(pl, ex, stream)
  executor.execute(pl, None, {}, rec, False, stream, ex=ex)
  (label,), (held,) = pl.names, pl.holdouts  # one algorithm, at most one held-out domain
  return {s: (rec.results[(label, s, held)], rec.data[(label, s, held)])
          for s in seeds}, pl


def run_one(cfg: dict, seed: int, *, task=None, overrides=None, data_seed=None,
            stream=None):
  """:func:`run_seeds` for one seed: ``(result, plan)``."""
  out, pl = run_seeds(cfg, [seed], task=task, overrides=overrides, data_seed=data_seed,
                      stream=stream)
  return out[int(seed)][0], pl


def record(key: dict, res, pl, *, data: Optional[dict] = None,
           label: Optional[str] = None) -> dict:
  """The raw record of one finished run: its ``key``, algorithm (``label`` or the
  registry name), hyperparameters, data (``data``, default :func:`data_record` of the
  plan's task), status, final metrics, history (one entry per evaluation), seconds,
  execution strategy, the paper protocol's selections and the code's provenance."""
  from fedjax_inv.runner import experiment, simulation
  name = pl.algos[0]
  rec = {"key": json.loads(json.dumps(key, default=str)), "algorithm": label or name,
         "registry_name": name, "hparams": pl.built[pl.names[0]].hparams,
         "data": data if data is not None else data_record(pl.task)}
  if isinstance(res, simulation.DivergedError):
    rec.update(status="diverged", diverged_round=res.round, final=None, history=res.history)
  else:
    rec.update(status="ok", final=res.final, history=res.history,
               seconds=round(res.seconds, 2), execution=res.strategy, **res.report())
  rec["provenance"] = experiment.provenance()
  return rec


def kept_record(path, key: dict) -> Optional[dict]:
  """The record at ``path`` when it holds ``key`` (a resumed spec), else None (absent, or
  a record of another key: the run's configuration changed, it runs again).

  Raises:
    ValueError: ``path`` holds something that is not a run record; it is never
      overwritten.
  """
  path = pathlib.Path(path)
  if not path.exists():
    return None
  try:
    old = json.loads(path.read_text())
  except (OSError, ValueError):
    old = None
  if not isinstance(old, dict) or "key" not in old:
    raise ValueError(f"{path} exists and is not a run record (no 'key'); refusing to "
                     "overwrite it. Move it away, or give the spec another --out.")
  return old if old["key"] == json.loads(json.dumps(key, default=str)) else None


def run_record(path, key: dict, cfg: dict, seed: int, *, task=None, overrides=None,
               data_seed=None, label: Optional[str] = None) -> dict:
  """The record of one run at ``path``: read back when the file holds the same ``key``
  (:func:`kept_record`), else run (:func:`run_one`) and written atomically.

  Raises:
    ValueError: from :func:`kept_record` and :func:`run_one`.
  """
  old = kept_record(path, key)
  if old is not None:
    return old
  out, pl = run_seeds(cfg, [seed], task=task, overrides=overrides, data_seed=data_seed)
  res, data = out[int(seed)]
  rec = record(key, res, pl, data=data, label=label)
  outputs.write_json(pathlib.Path(path), rec)
  return rec


def check_runs(runs) -> None:
  """Checks every run's configuration as ``fedjax-inv run`` does before loading data
  (keys, kinds, ranges, registered names), so that a typo in run 300 fails before run 1.

  Raises:
    ValueError: the run's group/name, then ``fedjax-inv run``'s message.
  """
  from fedjax_inv.runner import config
  for r in runs:
    try:
      cfg = r.cfg
      unknown = sorted(set(cfg) - set(config.RUN_KEYS))
      if unknown:
        raise ValueError(f"unknown key(s) {unknown}; a run has the keys of fedjax-inv run "
                         "(fedjax-inv run --help).")
      for k in sorted(set(cfg) & set(NOT_IN_A_RUN)):
        raise ValueError(f"{k!r} is not a key of a spec run; use {NOT_IN_A_RUN[k]} "
                         "instead.")
      held = str(cfg.get("holdout", ""))
      if held == "all" or "," in held:
        raise ValueError(f"holdout={held!r}: a spec run holds out one domain; make the "
                         "held-out domain an axis of the group, one option per domain, "
                         "e.g. holdout: {'0': {holdout: '0'}, '15': {holdout: '15'}}.")
      config.check_names(config.check_run_config(cfg))
    except ValueError as e:
      raise ValueError(f"spec run {r.label}: {e}") from None


def run_key(spec: Spec, run: RunSpec, seed: int) -> dict:
  """A record's key: the run's group, name, configuration, seed and data seed."""
  return {"group": run.group, "name": run.name, "config": dict(run.config),
          "seed": int(seed), "data_seed": spec.data_seed}


def kept_records(spec: Spec, out, where: Optional[dict] = None) -> list:
  """``[(run, seed, record)]`` of the selected runs (:meth:`Spec.select`) whose record is
  in ``out`` for the spec's current settings (:func:`kept_record`; a record of a changed
  configuration does not count), run by run, seeds in order: what a table generator
  reads.

  Raises:
    ValueError: a bad ``where``, or a record path holding something that is not a record.
  """
  out = pathlib.Path(out)
  found = []
  for run in spec.select(where):
    for s in spec.seeds:
      rec = kept_record(spec.record_path(out, run, s), run_key(spec, run, s))
      if rec is not None:
        found.append((run, s, rec))
  return found


def machines(records) -> str:
  """Where ``records`` ran, for a table's label: the backends their provenance names
  ('CPU', 'GPU', ...; 'UNKNOWN MACHINE' for a record without one), sorted and joined by
  ', '; '' for no records."""
  return ", ".join(sorted({str(((r.get("provenance") or {}).get("device") or {}).get(
      "backend", "unknown machine")).upper() for r in records}))


def execute_spec(spec: Spec, out, *, where: Optional[dict] = None, seeds=None,
                 stream=None) -> list:
  """Runs every selected (run, seed) of ``spec`` whose record is not in ``out`` yet
  (resume: a record with the same key is kept) and returns the records, run by run
  (seeds in order). A run's missing seeds are one plan, so the executor batches them
  where ``--replicas`` allows (a GPU or TPU by default; one after another on a CPU).

  Args:
    spec: a :class:`Spec`.
    out: the folder the record paths (``spec.record``) are relative to.
    where: ``{axis: [option labels]}`` to run a part (:meth:`Spec.select`).
    seeds: a subset of the spec's seeds (default: all of them).
    stream: where a line per run goes (default stdout).

  Raises:
    ValueError: a seed that is not the spec's, or a bad ``where``; before anything runs.
  """
  stream = stream or sys.stdout
  runs = spec.select(where)
  seeds = list(spec.seeds if seeds is None else seeds)
  bad = sorted(set(seeds) - set(spec.seeds))
  if bad:
    raise ValueError(f"--seeds {','.join(map(str, bad))}: not seeds of this spec "
                     f"({', '.join(map(str, spec.seeds))}).")
  check_runs(runs)
  out = pathlib.Path(out)
  data_seed = None if spec.data_seed == "each" else spec.data_seed
  records, n, total = [], 0, len(runs) * len(seeds)
  for run in runs:
    paths = {s: spec.record_path(out, run, s) for s in seeds}
    keys = {s: run_key(spec, run, s) for s in seeds}
    have = {s: kept_record(paths[s], keys[s]) for s in seeds}
    todo = [s for s in seeds if have[s] is None]
    ran = {}
    if todo:  # the run's missing seeds as one plan: the executor batches them if it can
      done, pl = run_seeds(run.cfg, todo, data_seed=data_seed)
      for s in todo:
        res, data = done[s]
        ran[s] = record(keys[s], res, pl, data=data)
        outputs.write_json(paths[s], ran[s])
    for s in seeds:
      rec = have[s] if have[s] is not None else ran[s]
      records.append(rec)
      n += 1
      print(f"[{n}/{total}] {run.label} seed {s}: {outputs.final_line(rec.get('final'))}"
            + (" (kept)" if s not in ran else f" ({rec.get('seconds', 0):.0f}s)"),
            file=stream, flush=True)
  return records


def parse_where(items) -> dict:
  """``{axis: [labels]}`` from ``AXIS=L1,L2`` items (``--where``).

  Raises:
    ValueError: an item without ``=``, naming it and the form to use.
  """
  where: dict = {}
  for item in items or []:
    axis, eq, labels = str(item).partition("=")
    if not eq or not axis.strip() or not labels.strip():
      raise ValueError(f"--where {item!r}: use AXIS=LABEL[,LABEL...], e.g. --where "
                       "fraction=0.1 or --where group=stragglers.")
    where.setdefault(axis.strip(), []).extend(v.strip() for v in labels.split(","))
  return where
