"""``fedjax-inv``: run federated experiments, list tasks/algorithms, benchmark.

  fedjax-inv run                       # the default comparison (see DEFAULT_RUN)
  fedjax-inv run --task rotated_mnist  # fedavg, 1 seed, on another task
  fedjax-inv run --algorithm fedprox --rounds 100 --hp mu=0.1
  fedjax-inv run --config exp.yaml     # JSON or YAML, keys = flag names; flags override
  fedjax-inv list
  fedjax-inv hparams fedprox --task colored_mnist   # defaults, task values, search space
  fedjax-inv tune --task colored_mnist --algorithm fedavg,inv_fedavg --trials 8 \
      --rounds 600 --out runs/tuned                  # equal budget, selected on validation
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys

from fedjax_inv.runner import config as _config
from fedjax_inv.runner.config import (DEFAULT_ALGORITHM, DEFAULT_RUN, RUN_KEYS,  # noqa: F401
                               algorithm_overrides, check_run_config, flag as _flag,
                               load_config)


def _run_parser(sub):
  """Adds ``fedjax-inv run`` to the subparsers ``sub``: one flag per ``RUN_KEYS`` key,
  its help with the names its registry holds now (``config.help_text``), and the
  multi-process flags. Returns the parser; raises nothing."""
  p = sub.add_parser("run", help="train and evaluate; writes runs/<name>/")
  p.add_argument("--config", help="JSON or YAML file with any of the flags below")
  for key, (typ, _) in RUN_KEYS.items():
    flag = "--" + key.replace("_", "-")
    help_ = _config.help_text(key).replace("%", "%%")  # argparse %-formats helps
    if typ is bool:
      p.add_argument(flag, action="store_true", default=None, help=help_)
    elif typ is list:
      p.add_argument(flag, action="append", default=None, metavar="NAME=VALUE", help=help_)
    else:  # strings: check_run_config converts and range-checks with one-line messages
      p.add_argument(flag, type=str, default=None, help=help_)
  p.add_argument("--no-progress", action="store_true", help="no progress output: neither the "
                 "bar in a terminal nor the per-round lines in a log")
  d = p.add_argument_group("several processes (one per host or GPU; docs/multihost.md)")
  d.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                 help="process 0's address, or 'auto' (SLURM, Open MPI, TPU pods: JAX "
                 "reads the cluster from the environment); default $JAX_COORDINATOR_ADDRESS,"
                 " else one process")
  d.add_argument("--num-processes", default=None, help="default $JAX_NUM_PROCESSES")
  d.add_argument("--process-id", default=None, help="0 .. N-1; default $JAX_PROCESS_ID")
  return p


def resolve_run_config(args) -> dict:
  """The run's settings: ``--config`` file, then flags, over the defaults.

  Defaults: a bare ``fedjax-inv run`` is the ``DEFAULT_RUN`` comparison
  (4 algorithms × 3 seeds on ColoredMNIST). As soon as the user names a task or an
  algorithm (flag or config key), the comparison is off: the algorithm defaults to
  ``DEFAULT_ALGORITHM`` (fedavg), the task to ColoredMNIST and the seeds to 1.
  ``cfg['_defaulted']`` lists, for printing, which of these were filled in.

  Raises:
    ValueError: a bad or unknown config file (``load_config``), a bad value
      (``check_run_config``), or a name no registry holds (``config.check_names``: the
      flag, the value and the closest registered name).
  """
  user = {}
  if getattr(args, "resume", None):
    others = [k for k in RUN_KEYS if k != "resume" and getattr(args, k, None) is not None]
    if others or args.config:
      raise ValueError(f"--resume {args.resume!r} continues the folder's own config; drop "
                       f"the other settings ({', '.join(map(_flag, others)) or '--config'}).")
    saved = pathlib.Path(args.resume) / "config.json"
    if not saved.is_file():
      raise ValueError(f"--resume {args.resume!r}: no config.json there; give the folder of "
                       "an earlier `fedjax-inv run`.")
    user.update(json.loads(saved.read_text()))
    user["resume"] = args.resume
  if args.config:
    user.update(load_config(args.config))
  for key in RUN_KEYS:
    v = getattr(args, key, None)
    if v is not None:
      user[key] = v
  bare = "task" not in user and "algorithm" not in user
  if bare:
    base = dict(DEFAULT_RUN)
  else:
    base = dict(task=DEFAULT_RUN["task"], algorithm=DEFAULT_ALGORITHM, seeds=1)
  cfg = check_run_config({**base, **user})
  _config.check_names(cfg)
  cfg["_defaulted"] = {k: base[k] for k in ("task", "algorithm", "seeds")
                       if k not in user}
  cfg["_bare"] = bare
  return cfg


def describe_plan(cfg: dict) -> str:
  """One line saying what ``fedjax-inv run`` is about to run and which parts are
  defaults (so that ``--task T`` alone never silently runs a long comparison)."""
  algos = [a.strip() for a in str(cfg["algorithm"]).split(",") if a.strip()]
  nseeds = int(cfg.get("seeds") or 1)
  seed0 = int(cfg.get("seed") or 0)
  seeds = f"seed {seed0}" if nseeds == 1 else f"seeds {seed0}..{seed0 + nseeds - 1}"
  d = cfg.get("_defaulted", {})
  if cfg.get("_bare"):
    why = ("the default comparison (bare `fedjax-inv run`); pass --task/--algorithm "
           "to run something else")
  else:
    parts = []
    if "algorithm" in d:
      parts.append(f"no --algorithm given: {DEFAULT_ALGORITHM}")
    if "seeds" in d:
      parts.append("1 seed by default (--seeds N for more)")
    if "task" in d:
      parts.append(f"no --task given: {DEFAULT_RUN['task']}")
    why = "; ".join(parts) if parts else "as requested"
  return (f"fedjax-inv run: task {cfg['task']}, algorithm(s) {', '.join(algos)}, {seeds} "
          f"({why})")


DIST_TIMEOUT_S = 60  # bounded wait for the other processes ($FEDJAX_INV_DIST_TIMEOUT)


def distributed_args(args) -> tuple | None:
  """``(coordinator, num_processes, process_id)`` of a multi-process run from the flags or
  the environment (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``,
  ``JAX_PROCESS_ID``); ``('auto', None, None)`` for JAX's cluster detection; None for
  one process.

  Raises:
    ValueError: a count or id that is not an integer, a process id out of range, or a
      coordinator without the process count and id (one line naming the fix).
  """
  import os
  coord = args.coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
  nproc = args.num_processes or os.environ.get("JAX_NUM_PROCESSES")
  pid = args.process_id or os.environ.get("JAX_PROCESS_ID")
  if coord == "auto":
    return ("auto", None, None)
  if coord is None and nproc is None and pid is None:
    return None
  vals = []
  for name, v in (("--num-processes", nproc), ("--process-id", pid)):
    if v is None or not str(v).strip().isdigit():
      raise ValueError(f"{name} {v!r}: a run over several processes needs --coordinator "
                       "HOST:PORT, --num-processes N and --process-id I (integers), or "
                       "--coordinator auto.")
    vals.append(int(v))
  nproc, pid = vals
  if nproc < 1 or not 0 <= pid < nproc:
    raise ValueError(f"--process-id {pid}: must be in 0..{nproc - 1} for --num-processes "
                     f"{nproc}.")
  if nproc == 1:
    return None
  if not coord or ":" not in coord:
    raise ValueError(f"--coordinator {coord!r}: give process 0's HOST:PORT, reachable "
                     "from every process.")
  return (coord, nproc, pid)


def connect(dist: tuple) -> None:
  """Joins the other processes (``fedjax_inv.core.multihost.initialize``) with a bounded
  wait. Raises ValueError (one line) when they do not answer in time."""
  import os
  from fedjax_inv.core import multihost
  timeout = int(os.environ.get("FEDJAX_INV_DIST_TIMEOUT", DIST_TIMEOUT_S))
  coord, nproc, pid = dist
  if coord != "auto":
    _reach(coord, pid, timeout)
  try:
    if coord == "auto":
      multihost.initialize(initialization_timeout=timeout)
    else:
      multihost.initialize(coord, nproc, pid, initialization_timeout=timeout)
  except Exception as e:  # jax raises XlaRuntimeError / RuntimeError / ValueError
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise ValueError(f"--coordinator {coord}: the {nproc or 'cluster'} processes did not "
                     f"connect within {timeout} s ({first}); start every process with the "
                     "same --coordinator and --num-processes, or set "
                     "FEDJAX_INV_DIST_TIMEOUT.") from None


def _reach(coord: str, pid: int, timeout: float) -> None:
  """Checks the coordinator before JAX's client connects (which, on a coordinator that
  never answers, aborts the process after its deadline instead of raising): process 0
  must be able to bind ``coord``'s port; another process must reach it within
  ``timeout`` seconds (retried every 0.5 s). Raises ValueError (one line)."""
  import socket
  import time
  host, _, port = coord.rpartition(":")
  if not port.isdigit():
    raise ValueError(f"--coordinator {coord!r}: expected HOST:PORT with a numeric port.")
  if pid == 0:
    try:
      with socket.create_server(("", int(port))):
        return
    except OSError as e:
      raise ValueError(f"--coordinator {coord}: process 0 cannot listen on port {port} "
                       f"({e.strerror or e}); choose a free port.") from None
  end = time.monotonic() + timeout
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=2):
        return
    except OSError as e:
      if time.monotonic() > end:
        raise ValueError(f"--coordinator {coord}: not reachable within {timeout:.0f} s "
                         f"({e.strerror or e}); start process 0 with the same "
                         "--coordinator first, or set FEDJAX_INV_DIST_TIMEOUT.") from None
      time.sleep(0.5)


def cmd_run(args) -> int:
  dist = distributed_args(args)
  if dist is not None:
    connect(dist)  # before any other JAX call
  import jax
  lead = jax.process_index() == 0
  cfg = resolve_run_config(args)
  if lead:
    print(describe_plan(cfg), flush=True)
  # checked once (resolve_run_config); the planner reads lr, --hp, ... from it
  cfg = _config.CheckedConfig({k: v for k, v in cfg.items() if not k.startswith("_")})
  from fedjax_inv.runner.experiment import run_experiment
  if not lead:  # every process computes; only process 0 writes and prints (the others
    import os  # write their part of the checkpoints, in the shared --out)
    with open(os.devnull, "w") as quiet:
      run_experiment(cfg, progress=False, stream=quiet, write=False)
    return 0
  summary = run_experiment(cfg, progress=not args.no_progress)
  if summary.get("status") == "diverged":
    bad = ", ".join(f"{r['algorithm']} seed {r['seed']} (round {r['diverged_round']})"
                    for r in summary.get("failed_runs", []))
    print(f"fedjax-inv: {len(summary.get('failed_runs', []))} run(s) diverged: {bad}; "
          "the other runs finished and were written. Exit code 3.", file=sys.stderr)
    return 3
  return 0


def cmd_list(args) -> int:
  """``fedjax-inv list``: every registered task and algorithm with its paper, then the
  names ``--aggregator``, ``--attack`` and ``--execution`` accept (``config.choices``).
  ``args.starting``: also where each task's starting values come from. Returns 0 and
  raises nothing."""
  from fedjax_inv.algorithms import registry
  from fedjax_inv.tasks import task_registry
  print("Tasks:")
  for name, e in sorted(task_registry().items()):
    print(f"  {name:24s} {e.summary}  [{e.paper}]")
    if getattr(args, "starting", False) and e.starting:
      print(f"  {'':24s} starting values: {e.starting}")
  print("\nAlgorithms:")
  for name, e in sorted(registry().items()):
    print(f"  {name:24s} {e.summary}  [{e.paper}]")
  print("\nAggregators (--aggregator): " + ", ".join(_config.choices("aggregator")))
  print("Attacks (--attack): " + ", ".join(_config.choices("attack")))
  print("Execution strategies (--execution): " + ", ".join(_config.choices("execution"))
        + " (and loop, the benchmark baseline)")
  return 0


def cmd_hparams(args) -> int:
  """``fedjax-inv hparams ALGORITHM [--task T]``: the registry's view of one algorithm
  (``algorithms/hparams.py``): resolved defaults, the task's values (its paper's, when the
  task sets them), the names it reads in the round (``Algorithm.traced``: a batched
  ``--sweep`` can trace them) and the search space of ``run --search``.

  Raises:
    ValueError: an unregistered algorithm or task (the closest registered name)."""
  from fedjax_inv.algorithms import hparams as hp
  _check_registered("hparams", "algorithm", args.algorithm)
  if args.task:
    _check_registered("--task", "task", args.task)
  defaults = hp.defaults(args.algorithm)
  print(f"{args.algorithm}: defaults (the factory's, resolved)")
  for k, v in defaults.items():
    print(f"  {k:22s} {v!r}")
  if args.task:
    from fedjax_inv.tasks import make_task
    task = make_task(args.task)
    print(f"\non task {args.task!r} (its defaults, per_algorithm block: the paper's values "
          "where the task reproduces one)")
    for k, v in task.algorithm_settings(args.algorithm).items():
      print(f"  {k:22s} {v!r}")
  from fedjax_inv.algorithms import make_algorithm
  print("\ntraced (a batched --sweep gives each point its own value in one program): "
        + ", ".join(make_algorithm(args.algorithm).traced))
  print("\nsearch space (fedjax-inv run --search N)")
  for k, r in hp.search_space(args.algorithm).items():
    print(f"  {k:22s} {r.describe():24s} {r.source}")
  return 0


def _check_registered(where: str, key: str, value: str) -> None:
  """Raises ``config.unknown_name``'s ValueError (the flag ``where``, the value, the
  closest registered name) when ``value`` is not among ``config.choices(key)``."""
  if value not in _config.choices(key):
    raise _config.unknown_name(where, value, _config.NOUNS[key], _config.choices(key))


def _ints(flag: str, text) -> tuple:
  """Comma-separated integers of a flag (``--seeds 0,1,2``). Raises ValueError naming the
  flag and the value."""
  try:
    return tuple(int(v) for v in str(text).split(",") if v.strip())
  except ValueError as e:
    raise ValueError(f"{flag} {text!r}: give comma-separated integers, e.g. 0,1,2.") from e


def cmd_tune(args) -> int:
  """``fedjax-inv tune``: :func:`fedjax_inv.runner.tuning.tune_row`, then the markdown table.

  Raises:
    ValueError: an unregistered task, algorithm or ``--hp`` name (the flag, the value and
      the closest registered name), a malformed ``--hp`` or seed list, or whatever
      ``tune_row`` refuses."""
  from fedjax_inv.runner import tuning
  _check_registered("--task", "task", args.task)
  for a in str(args.algorithm).split(","):
    if a.strip():
      _check_registered("--algorithm", "algorithm", a.strip())

  fixed = {}
  for item in args.hp:
    if "=" not in item:
      raise ValueError(f"--hp {item!r}: use [ALGORITHM.]NAME=VALUE.")
    _config.check_names({"hp": [item]})  # a registered NAME (with a suggestion)
    name, value = item.split("=", 1)
    scope, _, name = name.rpartition(".")
    try:
      value = json.loads(value)
    except json.JSONDecodeError:
      pass
    fixed.setdefault(scope or "*", {})[name] = value
  protocol = tuning.Protocol(trials=args.trials,
                             tuning_seeds=_ints("--tuning-seeds", args.tuning_seeds),
                             report_seeds=_ints("--seeds", args.seeds),
                             search_seed=args.search_seed, val_fraction=args.val_fraction,
                             exclude=tuple(fixed.get("*", {})))
  row = tuning.tune_row(args.out, task=args.task, algorithms=args.algorithm,
                        rounds=args.rounds, protocol=protocol, fixed=fixed,
                        eval_every=args.eval_every, execution=args.execution)
  final = row["report"][row["protocol"]["algorithms"][0]][0]["final"] or {}
  metrics = {k: k for k in final if k.endswith(("_accuracy", "_mse")) and "client" not in k}
  print("\n" + tuning.markdown_table(row, metrics, variants=("starting", "report")))
  print(f"\nwrote {args.out}/ (protocol.json, selected.json, runs/)")
  return 0


def cmd_experiment(args) -> int:
  """``fedjax-inv experiment SPEC``: every (run, seed) of a spec
  (:mod:`fedjax_inv.runner.spec`) through the executor of ``fedjax-inv run``, one raw
  record each; records already there are kept (resume).

  Raises:
    ValueError: a missing or malformed spec, a run configuration ``fedjax-inv run``
      refuses, a bad ``--where`` or ``--seeds``; before anything runs."""
  from fedjax_inv.runner import spec as spec_lib
  sp = spec_lib.load_spec(args.spec)
  where = spec_lib.parse_where(args.where)
  runs = sp.select(where)
  spec_lib.check_runs(runs)
  seeds = list(_ints("--seeds", args.seeds)) if args.seeds else None
  out = pathlib.Path(args.out) if args.out else sp.path.parent
  n = len(runs) * len(seeds or sp.seeds)
  print(f"{sp.path}: {len(runs)} runs × {len(seeds or sp.seeds)} seeds = {n} records "
        f"in {out}/" + (" (dry run: nothing trained)" if args.dry_run else ""))
  if args.dry_run:
    import shlex
    for r in runs:
      print(f"  {r.label}: " + " ".join(
          f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, vs in r.config
          for v in (vs if isinstance(vs, list) else [vs])))
    return 0
  spec_lib.execute_spec(sp, out, where=where, seeds=seeds)
  print(f"\nwrote {out}/")
  return 0


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors (``fedjax-inv: error: ...``, exit code 2)."""

  def error(self, message):
    self.exit(2, f"fedjax-inv: error: {message} (see `{self.prog} --help`)\n")


def _harness():
  """The benchmark harness module: installed as ``fedjax_inv.benchmarks.harness``; from a
  source tree on ``PYTHONPATH`` (not installed, e.g. ``benchmarks/gpu_bench.sh``) it is the
  top-level ``benchmarks.harness``. ImportError when neither imports."""
  try:
    from fedjax_inv.benchmarks import harness
  except ModuleNotFoundError as e:
    if e.name not in ("fedjax_inv.benchmarks", "fedjax_inv.benchmarks.harness"):
      raise
    from benchmarks import harness
  return harness


def _no_bench(e: ImportError) -> int:
  print(f"fedjax-inv: error: the benchmark harness (fedjax_inv.benchmarks.harness, the "
        f"repository's benchmarks/ folder) did not import: {e}. Reinstall from a "
        "checkout: pip install -e .", file=sys.stderr)
  return 2


def main(argv=None) -> int:
  """Entry point of ``fedjax-inv``. Exit codes: 0 done; 2 bad input (one-line message on
  stderr, nothing run or written); 3 a run diverged (the others were written); 130
  interrupted (Ctrl-C; the finished runs were written)."""
  parser = _Parser(
      prog="fedjax-inv", description="Vectorized federated learning under distribution "
      "shift (FedILC, Invariant FedAvg, FedSR, FedGMA, FedIIR and baselines).")
  sub = parser.add_subparsers(dest="command")
  _run_parser(sub)
  ls = sub.add_parser("list", help="list tasks and algorithms")
  ls.add_argument("--starting", action="store_true",
                  help="also say where each task's starting values come from (the paper, "
                       "our choice, or a search and the data it was scored on)")
  hp = sub.add_parser("hparams", help="an algorithm's defaults, a task's values and the "
                      "search space of run --search")
  hp.add_argument("algorithm", help="registered algorithm name (fedjax-inv list): "
                  + ", ".join(_config.choices("algorithm")))
  hp.add_argument("--task", help="also show this task's values for the algorithm: "
                  + ", ".join(_config.choices("task")))
  tu = sub.add_parser("tune", help="equal-budget random search per algorithm, selected on "
                      "validation, then the report seeds (fedjax_inv/runner/tuning.py)")
  tu.add_argument("--task", required=True, help="task name (fedjax-inv list): "
                  + ", ".join(_config.choices("task")))
  tu.add_argument("--algorithm", required=True, help="comma-separated algorithm names: "
                  + ", ".join(_config.choices("algorithm")))
  tu.add_argument("--trials", type=int, default=8, help="trials per algorithm: the first "
                  "at its starting values (the task's / paper's settings), the others "
                  "drawn from its search space; default 8")
  tu.add_argument("--rounds", type=int, required=True)
  tu.add_argument("--tuning-seeds", default="100", help="comma-separated (default 100)")
  tu.add_argument("--seeds", default="0,1,2", help="report seeds, disjoint from the "
                  "tuning seeds (default 0,1,2)")
  tu.add_argument("--search-seed", type=int, default=0)
  tu.add_argument("--val-fraction", type=float, default=0.1)
  tu.add_argument("--eval-every", type=int, default=None)
  tu.add_argument("--execution", default="auto", help="execution strategy of every run: "
                  + ", ".join(_config.choices("execution")) + "; default auto (the one "
                  "measured fastest). Pin one (e.g. scan) for runs that must compute alike "
                  "on any machine")
  tu.add_argument("--hp", action="append", default=[], metavar="[ALGORITHM.]NAME=VALUE",
                  help="a value fixed for every trial (not searched); NAME as for "
                  "`fedjax-inv run --sweep`")
  tu.add_argument("--out", required=True, help="the row folder (new, empty, or resumed)")
  ex = sub.add_parser("experiment", help="run an experiment spec (spec.yaml: runs × seeds) "
                      "through the same executor as run; resumes")
  ex.add_argument("spec", help="the spec file, e.g. experiments/robustness/spec.yaml")
  ex.add_argument("--out", help="the folder the spec's record paths are relative to; "
                  "default: the spec's own folder")
  ex.add_argument("--where", action="append", default=[], metavar="AXIS=LABEL[,LABEL]",
                  help="run only the runs with these options (repeatable), e.g. "
                  "fraction=0.1 or group=stragglers; default: every run")
  ex.add_argument("--seeds", help="comma-separated subset of the spec's seeds; default: "
                  "all of them")
  ex.add_argument("--dry-run", action="store_true", help="check every run's configuration "
                  "and list the runs; nothing is trained or written")
  try:  # the thin entry point of the harness in benchmarks/ (fedjax_inv.benchmarks)
    _harness().add_parser(sub)
  except ImportError as e:  # an install without the harness: say so when asked for it
    missing = sub.add_parser("bench", help="(unavailable: the benchmark harness did not "
                             "import)")
    missing.set_defaults(func=lambda args, e=e: _no_bench(e))
  args = parser.parse_args(argv)
  if argv is None and not sys.stdout.isatty():  # a log file: results as they happen,
    try:  # in order with the progress lines on stderr
      sys.stdout.reconfigure(line_buffering=True)
    except (AttributeError, ValueError):  # a replaced stdout without reconfigure
      pass
  logging.basicConfig(level=logging.WARNING, format="%(message)s")
  if args.command is None:
    parser.print_help()
    return 2
  try:
    if args.command == "run":
      return cmd_run(args)
    if args.command == "list":
      return cmd_list(args)
    if args.command == "hparams":
      return cmd_hparams(args)
    if args.command == "tune":
      return cmd_tune(args)
    if args.command == "experiment":
      return cmd_experiment(args)
    return args.func(args)
  except (ValueError, FileNotFoundError, RuntimeError, MemoryError) as e:
    print(f"fedjax-inv: error: {e}", file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:
    where = f"; finished runs are in {e}/ (continue with --resume {e})" if str(e) else ""
    print(f"fedjax-inv: interrupted{where}.", file=sys.stderr)
    return 130


if __name__ == "__main__":
  sys.exit(main())
