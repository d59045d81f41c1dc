"""The executor of ``fedjax-inv run`` (and of :func:`fedjax_inv.runner.lodo.run_lodo`): takes the
planner's runs (``fedjax_inv.runner.experiment.plan_experiment``: every (run label, seed,
held-out domain)) and batches whatever shares one compiled program: seeds, traced sweep
points and held-out domains of equal data shapes run as ONE ``replicas.run_replicas``
program; the rest runs one ``simulation.run`` after another, the reason printed and kept.

A run's key is ``(label, seed, holdout)``: ``label`` an algorithm or a sweep point
(``'fedprox@mu=0.1'``), ``holdout`` a domain name (leave-one-domain-out) or ``None``.
Its folder is ``<label>/seed<s>/`` (``<label>/h<domain>/seed<s>/`` with a held-out
domain), where its ``summary.json`` (written when it ends) and its checkpoint
(``--checkpoint-every``) live; a batch's checkpoint is ``<label>/batch-<hash>/``.
With ``out=None`` nothing is written (the Python API of ``run_lodo``).

Source: DomainBed (Gulrajani & Lopez-Paz 2021) for the leave-one-domain-out protocol;
``docs/ARCHITECTURE.md`` (planner / executor) for the design.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
from typing import NamedTuple, Optional

from fedjax_inv.runner import outputs


class RunKey(NamedTuple):
  """One run of a plan: a run label (an algorithm, or a sweep point such as
  ``'fedprox@mu=0.1'``), a training seed and a held-out domain (None without one). Equal to
  the plain tuple ``(label, seed, holdout)``."""
  label: str
  seed: int
  holdout: Optional[str]


@dataclasses.dataclass
class Execution:
  """What executing a plan produced besides the runs themselves; the plan
  (``experiment.Plan``) is never written.

  Attributes:
    tasks: the task of each ``(holdout, split seed)`` built so far (:func:`task_for`).
    load_seconds: seconds each of those tasks took to build, until a run's timing
      counted them (:func:`load_seconds`).
    sweep_notes: per swept algorithm, how its points ran and why.
    holdout_note: how the held-out domains ran (together or one at a time) and why.
    ran_batched: whether any group of runs ran as one batched program.
  """
  tasks: dict
  load_seconds: dict
  sweep_notes: dict = dataclasses.field(default_factory=dict)
  holdout_note: Optional[str] = None
  ran_batched: bool = False

  @classmethod
  def start(cls, pl) -> "Execution":
    """The state before the first run: the plan's first task in the cache."""
    key = (pl.task.info.get("holdout") if pl.domains else None, pl.split_seed)
    return cls(tasks={key: pl.task}, load_seconds=(
        {} if pl.task_load_seconds is None else {key: pl.task_load_seconds}))


def run_dir(out: pathlib.Path, key) -> pathlib.Path:
  """The folder of run ``key = (label, seed, holdout)``: ``out/<label>/seed<s>`` or, with
  a held-out domain, ``out/<label>/h<domain>/seed<s>`` (the domain's characters other
  than letters, digits, ``-``, ``_`` and ``.`` become ``_``)."""
  a, s, h = key
  base = out / a
  if h is not None:
    base = base / ("h" + re.sub(r"[^\w.-]", "_", str(h)))
  return base / f"seed{s}"


def batch_dir(out: pathlib.Path, folder: str, todo) -> pathlib.Path:
  """The checkpoint folder of one batched group of runs (``--replicas batched``): named
  by a hash of its run keys, so a resume with the same runs finds it."""
  import hashlib
  keys = [(str(a), int(s)) if h is None else (str(a), int(s), str(h)) for a, s, h in todo]
  tag = hashlib.sha1(repr(keys).encode()).hexdigest()[:12]
  return out / folder / f"batch-{tag}" / "checkpoint"


def load_finished(out: pathlib.Path, keys) -> dict:
  """Runs of a previous attempt that completed (their per-run summary.json exists),
  with their history from metrics.jsonl: ``{key: run dict}`` for the ``keys`` given."""
  import json
  rows = []
  if (out / "metrics.jsonl").exists():
    for line in (out / "metrics.jsonl").read_text().splitlines():
      try:
        rows.append(json.loads(line))
      except ValueError:
        pass  # a line cut by a kill
  done = {}
  for key in keys:
    f = run_dir(out, key) / "summary.json"
    if f.exists():
      a, s, h = key
      r = json.loads(f.read_text())
      r["history"] = [{k: v for k, v in e.items() if k not in ("algorithm", "seed",
                                                                 "holdout")}
                      for e in rows if (e.get("algorithm"), e.get("seed"),
                                        e.get("holdout")) == (a, s, h)]
      done[key] = r
  return done


def metrics_row(key, entry: dict) -> dict:
  """One ``metrics.jsonl`` line: the run's key (``holdout`` only with a held-out
  domain), then the evaluation entry."""
  a, s, h = key
  return {"algorithm": a, "seed": s, **({} if h is None else {"holdout": h}), **entry}


class Recorder:
  """Collects the finished runs of :func:`execute` (``runs``, ``status``), writes each
  run's ``summary.json`` as it ends (when ``out`` is a folder), removes its checkpoint
  and prints its line."""

  def __init__(self, pl, out, stream):
    self.pl, self.out, self.stream = pl, out, stream
    self.runs, self.status = [], "ok"
    self.results, self.batched = {}, {}  # key -> RunResult | DivergedError; key -> bool

  def base(self, key, algo: str, **extra) -> dict:
    """The fields every run summary starts with."""
    pl = self.pl
    a, s, h = key
    b = {"task": pl.task.name, "algorithm": a, "seed": s, "rounds": pl.rounds,
         "num_clients": pl.task.train.num_clients, "clients_per_round": pl.cohort}
    if h is not None:
      b["holdout"] = h
    point = dict(zip(pl.labels[algo], pl.plans[algo].points))[a]
    if point:
      b.update(base_algorithm=algo, sweep=point)
    return {**b, **extra}

  def __call__(self, key, res, base, ckpt, info, batched: bool = False):
    from fedjax_inv.runner.simulation import DivergedError
    pl, stream = self.pl, self.stream
    a, s, h = key
    self.results[key], self.batched[key] = res, bool(batched)
    if ckpt is not None:
      shutil.rmtree(ckpt, ignore_errors=True)  # ours; the run is over
    if isinstance(res, DivergedError):
      summary = {**base, "status": "diverged", "diverged_round": res.round,
                 "error": str(res), "hparams": pl.built[a].hparams, "data": info,
                 "history": res.history}
      self._keep(key, summary)
      self.status = "diverged"
      print(f"  {_name(key):18s}: DIVERGED at round {res.round} (train objective not "
            "finite); recorded, going on", file=stream)
      return
    summary = {**base, "status": "ok", "final": res.final, **res.report(),
               "hparams": pl.built[a].hparams, "execution": res.strategy,
               "seconds": round(res.seconds, 2), "data": info, "history": res.history}
    if h is not None:  # the leave-one-domain-out selections (eval/lodo.py)
      from fedjax_inv.eval.lodo import select_rounds
      summary["lodo_selected"] = select_rounds(res.history, validation=pl.validation)
    self._keep(key, summary)
    _print_run(key, res, summary.get("lodo_selected"), stream)

  def _keep(self, key, summary):
    self.runs.append(summary)
    if self.out is not None:
      outputs.write_json(run_dir(self.out, key) / "summary.json",
                         {k: v for k, v in summary.items() if k != "history"})


def log_config(pl, key) -> dict:
  """What ``--log`` records as a run's config: the algorithm's hyperparameters, the task,
  the seed and the held-out domain."""
  a, s, h = key
  return {**pl.built[a].hparams, "task": pl.task.name, "algorithm": a, "seed": s,
          **({} if h is None else {"holdout": h})}


def _name(key) -> str:
  a, s, h = key
  return f"{a} seed {s}" + ("" if h is None else f" holdout {h}")


def _batch_label(folder: str, todo) -> str:
  """A batch's name on progress lines: 'fedavg seeds 0,1,2' when its runs differ only
  by seed, else 'fedavg ×6 runs'."""
  if len({(a, h) for a, _, h in todo}) == 1 and todo[0][2] is None:
    return f"{todo[0][0]} seeds {','.join(str(s) for _, s, _ in todo)}"
  return f"{folder} ×{len(todo)} runs"


def _print_run(key, res, lodo_selected, stream) -> None:
  f = res.final
  acc = " ".join(f"{k}={v:.3f}" for k, v in f.items()
                 if k.endswith(("_accuracy", "_mse")) and "client" not in k)
  print(f"  {_name(key):18s}: {acc}  ({res.seconds:.1f}s, {res.strategy})", file=stream)
  for rule, e in res.selected.items():
    vals = " ".join(f"{k}={v:.3f}" for k, v in e.items()
                    if k.endswith(("_accuracy", "_mse", "_auroc", "_auprc"))
                    and "client" not in k and isinstance(v, float))
    print(f"  {'':18s}   at {rule} (round {e['round']}): {vals}", file=stream)
  if res.last_k_mean is not None:
    w = res.last_k_mean
    vals = " ".join(f"{k}={v:.3f}" for k, v in w.items()
                    if k.endswith(("_accuracy", "_mse")) and "client" not in k)
    print(f"  {'':18s}   mean of rounds {w['first_round']}-{w['last_round']}: "
          f"{vals}", file=stream)
  if lodo_selected:
    print(f"  {'':18s}   ood acc: " + "  ".join(
        f"{sel} (round {v['round']}) {v['ood_accuracy']:.3f}"
        for sel, v in lodo_selected.items()), file=stream)


def task_for(pl, ex: Execution, h, seed: int):
  """The task of a run with held-out domain ``h`` (``None``: the plan's task) and
  training seed ``seed`` (the data split is ``seed`` with ``pl.resplit``, else
  ``pl.split_seed``), built once and cached in ``ex.tasks``.

  Raises:
    RuntimeError: a task builder that reports another held-out domain than asked for.
  """
  import time
  from fedjax_inv.tasks import make_task
  split = seed if pl.resplit else pl.split_seed
  key = (h, split)
  if key not in ex.tasks:
    kw = dict(pl.task_kwargs, seed=split)
    if h is not None:
      kw["holdout"] = h
    t0 = time.perf_counter()
    ex.tasks[key] = make_task(pl.task.name, **kw)
    ex.load_seconds[key] = time.perf_counter() - t0
  task = ex.tasks[key]
  if h is not None and task.info.get("holdout") != h:
    raise RuntimeError(f"task {pl.task.name!r} built with holdout={h!r} reports holdout "
                       f"{task.info.get('holdout')!r}; its builder breaks the contract.")
  return task


def load_seconds(pl, ex: Execution, keys) -> float | None:
  """Seconds spent building the tasks of the runs ``keys`` (``(label, seed, holdout)``),
  each task's counted once: the first run that uses it gets its time, later ones 0.0.
  None when none of those tasks was built by the plan (a ``Task`` object given to the
  planner)."""
  spent = ex.load_seconds
  total, known = 0.0, False
  for k in dict.fromkeys((h, s if pl.resplit else pl.split_seed) for _, s, h in keys):
    if k in spent:
      total, known, spent[k] = total + spent[k], True, 0.0
  return total if known else None


def _varies(pl) -> bool:
  """Whether runs differ in their task (held-out domains, or a data split per seed)."""
  return pl.has_holdouts or pl.resplit


def _same_shapes(pl, ex: Execution, keys) -> str | None:
  """None when the tasks of ``keys`` have equal data shapes (one program can run them),
  else the reason they do not."""
  from fedjax_inv.runner.replicas import check_same_shapes
  try:
    check_same_shapes([task_for(pl, ex, h, s) for _, s, h in keys])
  except ValueError as e:
    return str(e)
  return None


def holdout_groups(pl, ex: Execution, stream) -> list:
  """The held-out domains that run together: every domain in one group when the runs
  are batched and every (domain, seed) task has equal shapes, else one domain at a time
  (then only one task is kept in memory when running sequentially). The reason is
  printed and kept in ``ex.holdout_note``."""
  if len(pl.holdouts) == 1:
    return [list(pl.holdouts)]
  if pl.batched:
    why = _same_shapes(pl, ex, [(None, s, h) for h in pl.holdouts for s in pl.seeds])
    if why is None:
      ex.holdout_note = "batched: the held-out domains' data have equal shapes"
      return [list(pl.holdouts)]
    ex.holdout_note = f"one held-out domain at a time ({why})"
    print(f"  --replicas batched: running one held-out domain at a time ({why})",
          file=stream)
  else:
    ex.holdout_note = f"one held-out domain at a time (--replicas {pl.replicas})"
  return [[h] for h in pl.holdouts]


def shard_of(cfg: dict):
  """``simulation.run``'s ``shard`` for ``--devices``: True for 'all' (the default), else
  the number of devices."""
  devices = cfg.get("devices")
  return True if devices in (None, "all") else int(devices)


def execute(pl, out, done, rec, progress, stream, *, ex: Optional[Execution] = None,
            loggers=(), checkpoint_root=None) -> Execution:
  """Runs every (label, seed, holdout) of the plan ``pl`` not in ``done``.

  For each group of held-out domains (:func:`holdout_groups`) and each algorithm: its
  traced sweep points × seeds × domains as one ``run_replicas`` program, or each point's
  seeds × domains as one (``pl.batched``), else one ``simulation.run`` after another;
  the choice and its reason are printed and kept in the returned state's
  ``sweep_notes``. Each finished run goes to ``rec``; checkpoints
  (``--checkpoint-every``) per run or per batch, in ``checkpoint_root`` (default ``out``)
  when there is one; ``metrics.jsonl`` (and each of ``loggers``) gets each evaluation as it
  completes.

  Returns:
    ``ex`` (default a new :meth:`Execution.start`), updated: the task cache, the notes,
    whether anything ran batched.
  """
  ex = ex if ex is not None else Execution.start(pl)
  from fedjax_inv.runner import grid, simulation
  cfg = pl.cfg
  common = dict(rounds=pl.rounds, clients_per_round=pl.cohort,
                execution=cfg.get("execution") or "auto", chunk_size=cfg.get("chunk_size"),
                eval_every=pl.eval_every, progress=progress, reporting=pl.rep,
                rounds_per_call=cfg.get("rounds_per_call") or 1,
                shard=shard_of(cfg), precision=cfg.get("precision") or "highest")
  single_only = dict(pool=cfg.get("pool") or "auto",  # batches keep the pool resident
                     host_split=bool(cfg.get("host_split")))
  # Checkpoints live in the output folder; a process other than 0 of a multi-process run
  # writes no output (out=None) but reads and writes the shared checkpoints there.
  root = checkpoint_root or out
  every = cfg.get("checkpoint_every") if root is not None else None
  logs = list(loggers)

  def row_writer(keyed):  # callback(k, entry) -> metrics.jsonl (+ --log); keyed[k] = key
    if out is None:
      return None

    def write(k, entry):
      key = keyed[k]
      outputs.append_jsonl(out / "metrics.jsonl", metrics_row(key, entry))
      for lg in logs:
        lg.log(run_dir(out, key).relative_to(out).as_posix(), log_config(pl, key), entry)
    return write

  def batch(algo, folder, structure, todo, hparams=None):
    from fedjax_inv.runner import replicas
    why = _same_shapes(pl, ex, todo) if _varies(pl) else None
    if why is not None:  # e.g. per-seed data splits of other sizes
      print(f"  {folder}: running one after another ({why})", file=stream)
      for key in todo:
        single(algo, key)
      return
    ex.ran_batched = True
    bdir = batch_dir(root, folder, todo) if every else None
    tasks = [task_for(pl, ex, h, s) for _, s, h in todo] if _varies(pl) else None
    indexed = hparams is not None or tasks is not None  # callback gets the replica index
    keyed = dict(enumerate(todo)) if indexed else {k[1]: k for k in todo}
    kw = dict(seeds=[s for _, s, _ in todo], callback=row_writer(keyed), tasks=tasks,
              checkpoint_dir=bdir, checkpoint_every=every, **common,
              label=_batch_label(folder, todo), load_seconds=load_seconds(pl, ex, todo))
    if hparams is not None:
      kw.update(seeds=hparams[0], hparams=hparams[1])
    results = replicas.run_replicas(pl.task, structure, **kw)
    for key, res in zip(todo, results):
      rec(key, res, rec.base(key, algo, replicas=f"batched x{len(todo)}"),
          run_dir(out, key) / "checkpoint" if out is not None else None,
          task_for(pl, ex, key[2], key[1]).info, batched=True)
    if bdir is not None and out is not None:
      shutil.rmtree(bdir.parent, ignore_errors=True)  # ours; the batch is over

  def single(algo, key):
    a, s, h = key
    ckpt = run_dir(root, key) / "checkpoint" if root is not None else None
    task = task_for(pl, ex, h, s)
    if not pl.batched and _varies(pl):  # one task in memory at a time
      for k in [k for k in ex.tasks if k != (h, s if pl.resplit else pl.split_seed)]:
        del ex.tasks[k]
    writer = row_writer({0: key})
    try:
      res = simulation.run(task, pl.built[a], seed=s, **common, **single_only,
                           callback=None if writer is None else lambda e: writer(0, e),
                           checkpoint_dir=ckpt if every else None, checkpoint_every=every,
                           label=_name(key), load_seconds=load_seconds(pl, ex, [key]))
    except simulation.DivergedError as e:
      res = e
    rec(key, res, rec.base(key, algo), ckpt if out is not None else None, task.info)

  for group in holdout_groups(pl, ex, stream):
    for algo in pl.algos:
      plan = pl.plans[algo]
      point_of = dict(zip(pl.labels[algo], plan.points))
      keys = [RunKey(lab, s, h) for lab in pl.labels[algo] for h in group for s in pl.seeds]
      for key in keys:
        if key in done:
          rec.runs.append(done[key])
          print(f"  {_name(key):18s}: finished earlier (resumed), kept", file=stream)
      if len(plan.points) > 1 and algo not in ex.sweep_notes:
        ex.sweep_notes[algo] = _sweep_note(plan, pl.batched, pl.replicas)
        print(f"  {algo}: {len(plan.points)} sweep points × {len(pl.seeds)} seed(s), "
              f"{ex.sweep_notes[algo]}", file=stream)
      if plan.batched and pl.batched and len(plan.points) > 1:
        todo = [k for k in keys if k not in done]
        if todo:
          batch(algo, algo, plan.structure, todo, grid.replica_hparams(
              plan, [(point_of[a], s) for a, s, _ in todo]))
        continue
      for lab in pl.labels[algo]:
        todo = [k for k in keys if k[0] == lab and k not in done]
        if pl.batched and len(todo) > 1:
          what = (f"{lab}: {len(todo)} (held-out domain, seed) runs" if _varies(pl)
                  else f"{lab:18s} seeds {[k[1] for k in todo]}:")
          print(f"  {what} batched as one program (--replicas {pl.replicas})",
                file=stream)
          batch(algo, lab, pl.built[lab], todo)
          continue
        for key in todo:
          single(algo, key)
  return ex


def _sweep_note(plan, batched: bool, replicas: str) -> str:
  """How a sweep's points run, and why (summary.json['sweep'][algorithm]['runs'])."""
  if plan.batched and batched:
    return "batched: " + ", ".join(plan.traced) + " traced"
  return "one after another: " + (
      plan.reason if not plan.batched else
      f"--replicas {replicas}" + (" (sequential on CPU; --replicas batched traces "
                                  + ", ".join(plan.traced) + ")"
                                  if replicas == "auto" else ""))
