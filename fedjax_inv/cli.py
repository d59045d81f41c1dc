"""``fedjax-inv``: run federated experiments, list tasks/algorithms, benchmark.

  fedjax-inv run                       # the default comparison (see DEFAULT_RUN)
  fedjax-inv run --task rotated_mnist  # fedavg, 1 seed, on another task
  fedjax-inv run --algorithm fedprox --rounds 100 --hp mu=0.1
  fedjax-inv run --config exp.yaml     # JSON or YAML, keys = flag names; flags override
  fedjax-inv list
"""
from __future__ import annotations

import argparse
import datetime
import json
import logging
import pathlib
import sys
import time

# The comparison a researcher wants first (issue 3): FedAvg vs the invariance methods on
# ColoredMNIST (IRM protocol), 3 seeds. Only a bare `fedjax-inv run` (no task and no
# algorithm from flags or config) runs it (issue 12): `--algorithm a,b` runs those on
# ColoredMNIST, `--task T` alone runs DEFAULT_ALGORITHM on T; both with 1 seed unless
# `--seeds` says otherwise.
DEFAULT_RUN = dict(task="colored_mnist", algorithm="fedavg,inv_fedavg,fediir,fishr_inter_geo",
                   seeds=3)
DEFAULT_ALGORITHM = "fedavg"

RUN_KEYS = {  # config key -> (type, help)
    "task": (str, "task name (fedjax-inv list); default colored_mnist"),
    "algorithm": (str, "algorithm name, or a comma-separated list to compare; default "
                       "fedavg (a bare `fedjax-inv run` compares " + DEFAULT_RUN["algorithm"]
                  + ")"),
    "rounds": (int, "communication rounds (default: the task's)"),
    "clients_per_round": (int, "clients sampled per round (default: all)"),
    "local_steps": (int, "local optimizer steps per round"),
    "batch_size": (str, "local minibatch size, or 'full' for the whole client data"),
    "lr": (float, "client learning rate"),
    "server_lr": (float, "server learning rate"),
    "client_optimizer": (str, "sgd | momentum | adam"),
    "aggregator": (str, "mean | geometric | gma | and_mask"),
    "tau": (float, "sign-agreement threshold for gma / and_mask"),
    "seed": (int, "first seed"),
    "seeds": (int, "number of seeds (seed, seed+1, ...); default 1 (3 for the bare "
                   "comparison)"),
    "execution": (str, "auto | vmap | scan | chunked"),
    "chunk_size": (int, "clients per chunk for --execution chunked"),
    "eval_every": (int, "evaluate every N rounds"),
    "out": (str, "output directory (default runs/<task>-<algorithms>-<time>)"),
    "data_dir": (str, "directory with raw dataset files (or $FEDJAX_INV_DATA_DIR)"),
    "source": (str, "data source: auto | raw | tfds | bundled"),
    "download": (bool, "download missing raw data (opt-in; short timeout)"),
    "hp": (list, "algorithm hyperparameter NAME=VALUE (repeatable), e.g. mu=0.1"),
    "holdout": (str, "leave-one-domain-out: 'all' or comma-separated domains (domain tasks)"),
}


def _parse_value(s: str):
  try:
    return json.loads(s)
  except json.JSONDecodeError:
    return s


def load_config(path: str) -> dict:
  """Reads a JSON or YAML config (never executed). Raises ValueError on unknown keys."""
  p = pathlib.Path(path)
  if not p.is_file():
    raise ValueError(f"--config {path}: no such file.")
  text = p.read_text()
  if p.suffix.lower() in (".yaml", ".yml"):
    import yaml
    try:
      cfg = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
      raise ValueError(f"--config {path}: not valid plain YAML ({e}). Configs are data "
                       "only: tags such as !!python/... are refused.")
  else:
    try:
      cfg = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"--config {path}: not valid JSON ({e}); use .yaml/.yml for YAML.")
  if not isinstance(cfg, dict):
    raise ValueError(f"--config {path}: the top level must be a mapping of flag names.")
  cfg = {k.replace("-", "_"): v for k, v in cfg.items()}
  if "hparams" in cfg:
    hp = cfg.pop("hparams")
    if not isinstance(hp, dict):
      raise ValueError(f"--config {path}: 'hparams' must be a mapping.")
    cfg["hp"] = [f"{k}={json.dumps(v)}" for k, v in hp.items()]
  unknown = sorted(set(cfg) - set(RUN_KEYS))
  if unknown:
    raise ValueError(f"--config {path}: unknown keys {unknown}; valid keys: "
                     f"{sorted(RUN_KEYS)} (and 'hparams').")
  return cfg


def _run_parser(sub):
  p = sub.add_parser("run", help="train and evaluate; writes runs/<name>/")
  p.add_argument("--config", help="JSON or YAML file with any of the flags below")
  for key, (typ, help_) in RUN_KEYS.items():
    flag = "--" + key.replace("_", "-")
    if typ is bool:
      p.add_argument(flag, action="store_true", default=None, help=help_)
    elif typ is list:
      p.add_argument(flag, action="append", default=None, metavar="NAME=VALUE", help=help_)
    else:
      p.add_argument(flag, type=typ, default=None, help=help_)
  p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
  return p


def resolve_run_config(args) -> dict:
  """The run's settings: ``--config`` file, then flags, over the defaults.

  Defaults (issue 12): a bare ``fedjax-inv run`` is the ``DEFAULT_RUN`` comparison
  (4 algorithms × 3 seeds on ColoredMNIST). As soon as the user names a task or an
  algorithm (flag or config key), the comparison is off: the algorithm defaults to
  ``DEFAULT_ALGORITHM`` (fedavg), the task to ColoredMNIST and the seeds to 1.
  ``cfg['_defaulted']`` lists, for printing, which of these were filled in.

  Raises:
    ValueError: a bad or unknown config file (``load_config``).
  """
  user = {}
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
  cfg = {**base, **user}
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


def algorithm_overrides(cfg: dict) -> dict:
  """Algorithm hyperparameters set explicitly by flags / config (no task defaults)."""
  kw = {}
  mapping = {"lr": "client_lr", "server_lr": "server_lr", "local_steps": "local_steps",
             "client_optimizer": "client_optimizer", "aggregator": "aggregator",
             "tau": "tau"}
  for src, dst in mapping.items():
    if cfg.get(src) is not None:
      kw[dst] = cfg[src]
  if cfg.get("batch_size") is not None:
    b = str(cfg["batch_size"])
    if b.lower() in ("full", "none", "0"):
      kw["batch_size"] = None
    else:
      try:
        kw["batch_size"] = int(b)
      except ValueError:
        raise ValueError(f"--batch-size {b!r}: use a positive integer or 'full'.")
  for item in cfg.get("hp") or []:
    if "=" not in item:
      raise ValueError(f"--hp {item!r}: expected NAME=VALUE, e.g. --hp mu=0.1")
    k, v = item.split("=", 1)
    kw[k.strip()] = _parse_value(v.strip())
  return kw


def cmd_run(args) -> int:
  cfg = resolve_run_config(args)
  print(describe_plan(cfg), flush=True)
  cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
  if cfg.get("holdout"):
    from fedjax_inv.experiment import run_holdout_experiment
    run_holdout_experiment(cfg, progress=not args.no_progress,
                           overrides=algorithm_overrides(cfg))
    return 0
  from fedjax_inv.experiment import run_experiment
  summary = run_experiment(cfg, progress=not args.no_progress,
                           overrides=algorithm_overrides(cfg))
  return 0 if summary else 1


def cmd_list(args) -> int:
  from fedjax_inv.algorithms import registry
  from fedjax_inv.tasks import task_registry
  print("Tasks:")
  for name, e in sorted(task_registry().items()):
    print(f"  {name:24s} {e.summary}  [{e.paper}]")
  print("\nAlgorithms:")
  for name, e in sorted(registry().items()):
    print(f"  {name:24s} {e.summary}  [{e.paper}]")
  print("\nExecution strategies: auto, vmap, scan, chunked")
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="fedjax-inv", description="Vectorized federated learning under distribution "
      "shift (FedILC, Invariant FedAvg, FedSR, FedGMA, FedIIR and baselines).")
  sub = parser.add_subparsers(dest="command")
  _run_parser(sub)
  sub.add_parser("list", help="list tasks and algorithms")
  try:
    from fedjax_inv.bench import add_parser as add_bench
    add_bench(sub)
  except ImportError:
    pass
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format="%(message)s")
  if args.command is None:
    parser.print_help()
    return 2
  try:
    if args.command == "run":
      return cmd_run(args)
    if args.command == "list":
      return cmd_list(args)
    return args.func(args)
  except (ValueError, FileNotFoundError, RuntimeError, MemoryError) as e:
    print(f"fedjax-inv: error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
