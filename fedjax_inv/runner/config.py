"""Run settings: every key of ``fedjax-inv run`` / a config file, its type, default and
range check, and the algorithm overrides derived from it.

Shared by the command line (``cli.py``) and the experiment runner (``experiment.py``), so
neither imports the other. Every check runs before anything is loaded or compiled and
fails with one line naming the flag, the value and the allowed range.
"""
from __future__ import annotations

import json
import pathlib

# The comparison a researcher wants first: FedAvg vs the invariance methods on
# ColoredMNIST (IRM protocol), 3 seeds. Only a bare `fedjax-inv run` (no task and no
# algorithm from flags or config) runs it: `--algorithm a,b` runs those on ColoredMNIST,
# `--task T` alone runs DEFAULT_ALGORITHM on T; both with 1 seed unless `--seeds` says
# otherwise.
DEFAULT_RUN = dict(task="colored_mnist", algorithm="fedavg,inv_fedavg,fediir,fishr_inter_geo",
                   seeds=3)
DEFAULT_ALGORITHM = "fedavg"
# How runs that can share one compiled program run (--replicas, run_lodo, run_sweep): one
# set of modes, one default.
REPLICA_MODES = ("auto", "batched", "sequential")
# --precision NAME: the arithmetic of float32 matrix products and convolutions, as the value
# of jax.default_matmul_precision. 'highest': float32 on every device (the default, so that
# a result does not depend on the card); 'tf32': TensorFloat-32 on NVIDIA GPUs that have it
# (JAX's own default there); 'bf16': bfloat16 products with float32 sums. A CPU computes
# float32 under all three.
PRECISIONS = {"highest": "highest", "tf32": "tensorfloat32", "bf16": "bfloat16"}
DEFAULT_REPLICAS = "auto"

# config key -> (type, help); every help states the default. A {token} in a help
# (``_HELP_LISTS``: {algorithms}, {tasks}, ...) is replaced by the names its registry
# holds when the parser is built (:func:`help_text`), never copied here by hand.
RUN_KEYS = {
    "task": (str, "task name (fedjax-inv list describes them): {tasks}; default "
                  "colored_mnist"),
    "algorithm": (str, "algorithm name, or a comma-separated list to compare: "
                       "{algorithms}; default fedavg (a bare `fedjax-inv run` compares "
                       + DEFAULT_RUN["algorithm"] + ")"),
    "rounds": (int, "communication rounds >= 1; default: the task's"),
    "clients_per_round": (int, "clients sampled per round, 1..#clients; default: all"),
    "local_steps": (int, "local optimizer steps per round >= 1; default: the task's"),
    "local_epochs": (int, "local epochs per round >= 1: client i runs E*ceil(n_i/B) steps "
                          "of batch B over its own data (clients of different sizes run "
                          "different step counts); replaces --local-steps; default: the "
                          "task's (femnist, shakespeare, cifar100_fed: 1), else none"),
    "batch_size": (str, "local minibatch size >= 1, or 'full' for the whole client data; "
                        "default: the task's"),
    "lr": (float, "client learning rate > 0; default: the task's"),
    "server_lr": (float, "server learning rate > 0; default: the algorithm's"),
    "client_optimizer": (str, "{client_optimizers}; default: the task's"),
    "aggregator": (str, "server aggregation rule: {aggregators}; or a robust one, NAME "
                        "or NAME:k=v (e.g. krum:f=2, trimmed_mean:beta=0.1): "
                        "{robust_aggregators}; default: the algorithm's"),
    "tau": (float, "sign-agreement threshold in [0, 1] for gma / and_mask; default 0.4"),
    "seed": (int, "first seed S >= 0: the task's data (its generation, client split "
                  "and validation split) is drawn once from S; each run's training "
                  "(model init, client sampling, minibatches, attackers) from its own "
                  "seed; default 0"),
    "seeds": (int, "number of seeds N >= 1: runs seeds S..S+N-1 (S = --seed) on data "
                   "generated once from the first seed S, so seed S+1 of --seeds 2 is "
                   "not the run of --seed S+1 (whose data comes from S+1); default 1 (3 "
                   "for the bare comparison)"),
    "execution": (str, "auto (the strategy measured fastest for this round on this "
                       "device: cached, or measured for runs of >= 50 rounds, else the "
                       "fixed rule) | rule (the fixed rule, no measurement) | probe "
                       "(measure now, refresh the cache) | vmap | scan | chunked | "
                       "vmap+patches | chunked+patches (a model's convolutions as patches "
                       "times the kernel, one batched matrix product over the clients; "
                       "'auto' times them on a GPU or TPU); the choice is in "
                       "summary.json; default auto"),
    "chunk_size": (int, "clients per chunk for --execution chunked (>= 1); default: auto"),
    "devices": (str, "all | N: shard the client axis over all local devices or the first N "
                     "of jax.devices() (the cohort must divide evenly; 1 = no sharding); "
                     "default all"),
    "rounds_per_call": (int, "fused rounds: run up to N rounds in one device call (>= 1; "
                             "evaluation, checkpoints and progress at call boundaries); "
                             "default 1"),
    "precision": (str, "arithmetic of float32 matrix products and convolutions: highest "
                       "(float32 on every device, so results do not depend on the card) | "
                       "tf32 (TensorFloat-32 on NVIDIA GPUs that have it) | bf16 "
                       "(bfloat16 products, float32 sums); a CPU computes float32 under "
                       "all three; recorded in summary.json; default highest"),
    "pool": (str, "where the training pool lives: device (the whole padded pool on the "
                  "device) | host (packed on the host, each round's cohort sent to the "
                  "device while the previous round runs) | auto (device when the padded "
                  "pool is small, else host); same numbers either way; the choice and its "
                  "reason are in summary.json; default auto"),
    "host_split": (bool, "with a host pool on one CPU device, train each round's cohort as "
                         "two programs at once, one per host thread: about 1.3x faster on "
                         "2 cores, but not bit-reproducible between reruns (XLA:CPU's "
                         "float32 results of two programs at once vary in the last bits); "
                         "default off: one program, the same numbers on every rerun"),
    "replicas": (str, "auto | batched | sequential: run an algorithm's seeds (sweep "
                      "points; --holdout domains of equal size) as one vmapped program "
                      "(batched) or one after another; auto = batched on GPU/TPU, "
                      "sequential on CPU (bench --replicas); default auto"),
    "eval_every": (int, "evaluate every N rounds (>= 1); default: the task's, else "
                        "rounds/20"),
    "out": (str, "output directory, new or empty (default runs/<task>-<algorithms>-<time>-"
                 "<id>); an existing non-empty one is refused unless --overwrite"),
    "dry_run": (bool, "check the config, load the task and print the plan (clients, "
                      "both pool layouts' memory, the runs), then stop: nothing is "
                      "trained or written; default off"),
    "overwrite": (bool, "replace an earlier fedjax-inv run in --out (never a folder "
                        "fedjax-inv did not write); default off"),
    "resume": (str, "folder of an interrupted run: keep its finished runs, continue the "
                    "current one from its checkpoint, run the rest (same config); "
                    "default off"),
    "checkpoint_every": (int, "save the current run's state every N rounds (>= 1) so that "
                              "--resume continues it bit-identically; default off"),
    "data_dir": (str, "directory with raw dataset files (or $FEDJAX_INV_DATA_DIR); "
                      "default: none"),
    "task_arg": (list, "a task argument NAME=VALUE (repeatable), e.g. num_clients=100, "
                       "heldout_writers=0.1 or max_examples=500; the task's docstring "
                       "(fedjax-inv list) names them; default none"),
    "source": (str, "data source: auto | raw | tfds | bundled | synthetic (femnist, "
                    "shakespeare, cifar100_fed: a generated pool of the real shape) | hf "
                    "(femnist, shakespeare, cifar100_fed, pacs, office_home, task hf: the "
                    "Hugging Face hub's copy through Flower Datasets); "
                    "default auto"),
    "download": (bool, "download missing raw data (opt-in; short timeout); default off"),
    "hp": (list, "algorithm hyperparameter NAME=VALUE, or ALGORITHM.NAME=VALUE for one "
                 "algorithm only (repeatable), e.g. mu=0.1, fedprox.mu=0.1; NAME as for "
                 "--sweep (fedjax-inv hparams ALGORITHM shows an algorithm's own); "
                 "default none"),
    "sweep": (list, "hyperparameter grid NAME=V1,V2 or ALGORITHM.NAME=V1,V2 (repeatable): "
                    "every point of the product × every seed, each a row of the table. "
                    "NAME (lr = client_lr): {hparams}. The points run batched as one "
                    "program when the algorithm reads every name in the round (fedjax-inv "
                    "hparams ALGORITHM lists them as traced) and --replicas allows; "
                    "default none"),
    "search": (int, "random hyperparameter search: N points per algorithm drawn from its "
                    "search space (fedjax-inv hparams ALGORITHM; DomainBed-style), each × "
                    "every seed a row of the table; names fixed with --hp are kept; not "
                    "with --sweep; default off"),
    "search_seed": (int, "seed of --search's draws (>= 0; the points depend on it and the "
                         "algorithm only); default 0"),
    "holdout": (str, "leave-one-domain-out: 'all' or comma-separated domains (domain "
                     "tasks); default off"),
    "select": (str, "model-selection rules, comma-separated (e.g. 'min:ood_loss'), or "
                    "'none'; default: the task's paper protocol"),
    "last_k": (int, "also report the mean over the last K rounds (0 = off); default: the "
                    "task's"),
    "reporting": (str, "auto (the task's paper protocol) | none; default auto"),
    "validation": (str, "--holdout model selection: mean | pooled; default mean"),
    "dp_clip": (float, "client-level DP (DP-FedAvg): clip every client update to this L2 "
                       "norm C > 0 (the run's weighting becomes uniform); default off"),
    "dp_noise_multiplier": (float, "DP noise multiplier sigma >= 0: Gaussian noise of std "
                                   "sigma*C on the sum of the clipped updates; default: "
                                   "solved from --dp-target-epsilon"),
    "dp_target_epsilon": (float, "DP: solve sigma so that epsilon after the run's rounds is "
                                 "at most this (> 0); instead of --dp-noise-multiplier; "
                                 "default off"),
    "dp_delta": (float, "DP delta in (0, 1); default 1e-5"),
    "dp_adaptive_quantile": (float, "DP adaptive clipping (Andrew et al. 2021): the clip "
                                    "norm starts at --dp-clip and tracks this quantile "
                                    "(0, 1) of the client update norms; default off "
                                    "(fixed clip)"),
    "dp_sgd_clip": (float, "sample-level DP-SGD on the client (Abadi et al. 2016): clip "
                    "every per-example gradient to this L2 norm; needs --local-epochs or "
                    "--batch-size full; default off"),
    "dp_sgd_noise_multiplier": (float, "DP-SGD noise multiplier sigma >= 0 (noise std "
                                "sigma * clip on the sum of a step's clipped gradients); "
                                "default: none, give it with --dp-sgd-clip"),
    "dp_sgd_delta": (float, "DP-SGD delta in (0, 1), per example; default 1e-5"),
    "dp_accountant": (str, "DP accountant: rdp | pld (pld needs --client-sampling "
                           "poisson); default rdp"),
    "client_sampling": (str, "fixed (exactly --clients-per-round clients) | poisson (each "
                             "client independently with probability C/N, the DP "
                             "accountants' assumption); default fixed"),
    "attack": (str, "malicious clients: {attacks}, by --attack-fraction of the pool "
                    "(drawn from the seed); default none"),
    "attack_fraction": (float, "fraction of the pool that attacks, in [0, 1); default 0.1 "
                               "with --attack"),
    "attack_scale": (float, "the scale attack's factor lambda; default: the cohort size "
                            "(model replacement)"),
    "bucketing": (int, "bucket size s >= 1 around a robust --aggregator (Karimireddy et al. "
                       "2022); default none"),
    "availability": (float, "probability in (0, 1] that a pool client is online when the "
                            "cohort is drawn; default 1"),
    "dropout": (float, "probability in [0, 1) that a selected client never returns; the "
                       "server aggregates the others; default 0"),
    "stragglers": (float, "probability in [0, 1) that a selected client is a straggler and "
                          "runs Uniform{1..K-1} of its K local steps; default 0"),
    "straggler_mode": (str, "keep (aggregate the stragglers' partial work, FedProx) | drop "
                            "(discard them, FedAvg); default keep"),
    "log": (str, "experiment logs besides metrics.jsonl and summary.json, comma-separated: "
                 "tensorboard (OUT/tensorboard/), wandb (offline unless WANDB_MODE or "
                 "WANDB_API_KEY is set), csv (OUT/metrics.csv); needs "
                 "pip install 'fedjax_inv[log]'; default none"),
}

# Range checks of check_run_config: key -> (kind, minimum or choices).
_CHECKS = {
    "rounds": ("int", 1), "clients_per_round": ("int", 1),
    "seed": ("int", 0), "seeds": ("int", 1), "chunk_size": ("int", 1),
    "eval_every": ("int", 1), "last_k": ("int", 0), "checkpoint_every": ("int", 1),
    "rounds_per_call": ("int", 1), "search": ("int", 1), "search_seed": ("int", 0),
    # the hyperparameter flags: their rule is the schema's (algorithms/schema.py)
    "lr": ("hparam", None), "server_lr": ("hparam", None), "tau": ("hparam", None),
    "local_steps": ("hparam", None), "local_epochs": ("hparam", None),
    "client_optimizer": ("hparam", None),
    "execution": ("choice", None),  # None: read when checked (choices(key))
    "devices": ("devices", None), "log": ("loggers", None),
    "replicas": ("choice", REPLICA_MODES),
    "pool": ("choice", ("auto", "device", "host")),
    "precision": ("choice", tuple(PRECISIONS)),
    "source": ("choice", ("auto", "raw", "tfds", "bundled", "synthetic", "hf")),
    "reporting": ("choice", ("auto", "none")),
    "validation": ("choice", ("mean", "pooled")),
    "dp_clip": ("float", None), "dp_noise_multiplier": ("float", None),
    "dp_target_epsilon": ("float", None), "dp_delta": ("float", None),
    "dp_adaptive_quantile": ("float", None),
    "dp_sgd_clip": ("float", None), "dp_sgd_noise_multiplier": ("float", None),
    "dp_sgd_delta": ("float", None),
    "dp_accountant": ("choice", ("rdp", "pld")),
    "client_sampling": ("choice", ("fixed", "poisson")),
    "attack": ("choice", None),  # fedjax_inv.core.adversary.ATTACKS
    "attack_fraction": ("float", None), "attack_scale": ("float", None),
    "bucketing": ("int", 1), "availability": ("float", None), "dropout": ("float", None),
    "stragglers": ("float", None), "straggler_mode": ("choice", None),
}
DP_KEYS = ("dp_clip", "dp_noise_multiplier", "dp_target_epsilon", "dp_delta",
           "dp_accountant", "dp_adaptive_quantile")


def flag(key: str) -> str:
  """``'rounds_per_call'`` -> ``'--rounds-per-call'``."""
  return "--" + key.replace("_", "-")


# What an error message calls the value of a flag with a fixed set of choices.
NOUNS = {"algorithm": "algorithm", "task": "task", "aggregator": "aggregator",
         "attack": "attack", "hp": "hyperparameter", "sweep": "hyperparameter",
         "execution": "execution strategy", "replicas": "replica mode",
         "source": "data source", "reporting": "reporting mode",
         "validation": "validation rule", "dp_accountant": "DP accountant",
         "client_sampling": "client sampling", "straggler_mode": "straggler mode",
         "client_optimizer": "client optimizer"}


def hparam_names() -> tuple:
  """The hyperparameter names ``--hp`` and ``--sweep`` accept, sorted: every name of the
  schema (``fedjax_inv.algorithms.schema.SCHEMA``) that a flag can set (not the
  Python-API-only ones, kind ``'any'``, e.g. ``lambda_schedule``) and the aliases
  (``lr``). Read when called, so a name added to the schema is listed. Raises nothing."""
  from fedjax_inv.algorithms import schema
  return tuple(sorted({n for n, p in schema.SCHEMA.items() if p.kind != "any"}
                      | set(schema.ALIASES)))


def choices(key: str) -> tuple:
  """The values the run setting ``key`` accepts, read from its registry when called
  (never a copy): ``algorithm`` (``fedjax_inv.algorithms.registry``), ``task``
  (``fedjax_inv.tasks.task_registry``), ``aggregator`` (``algorithms.base.AGGREGATORS``
  and ``robust.ROBUST``), ``attack`` / ``straggler_mode``
  (``core.adversary.ATTACKS`` / ``STRAGGLER_MODES``), ``execution`` (the engine's
  ``core.strategy.STRATEGIES``, ``rule`` and ``probe``), ``client_optimizer``
  (``algorithms.schema.CLIENT_OPTIMIZERS``), ``hp`` / ``sweep`` (:func:`hparam_names`),
  or a fixed choice of ``_CHECKS``. Registries are sorted; fixed choices keep their order.

  Args:
    key: a ``RUN_KEYS`` key.

  Raises:
    KeyError: ``key`` has no fixed set of values.
  """
  if key == "algorithm":
    from fedjax_inv.algorithms import registry
    return tuple(sorted(registry()))
  if key == "task":
    from fedjax_inv.tasks import task_registry
    return tuple(sorted(task_registry()))
  if key == "aggregator":
    from fedjax_inv.aggregation import robust
    from fedjax_inv.algorithms import base
    return tuple(sorted(base.AGGREGATORS)) + tuple(sorted(robust.ROBUST))
  if key in ("attack", "straggler_mode"):
    from fedjax_inv.core import adversary
    return tuple(sorted(adversary.ATTACKS)) if key == "attack" else \
        tuple(adversary.STRAGGLER_MODES)
  if key == "execution":
    from fedjax_inv.core import strategy
    return tuple(strategy.STRATEGIES) + ("rule", "probe")
  if key == "client_optimizer":
    from fedjax_inv.algorithms import schema
    return tuple(schema.CLIENT_OPTIMIZERS)
  if key in ("hp", "sweep"):
    return hparam_names()
  kind, arg = _CHECKS.get(key, (None, None))
  if kind != "choice" or not arg:
    raise KeyError(f"{key!r} has no fixed set of values")
  return tuple(arg)


def unknown_name(where: str, value, what: str, names) -> ValueError:
  """The one-line error for a name that is not among ``names``, with the closest one
  (``difflib``) as a suggestion, or every name when none is close:
  ``"--algorithm fedavgg: unknown algorithm; did you mean fedavg?"``.

  Args:
    where: the flag the value came from (``'--algorithm'``, ``'--hp'``; one ending in
      ``=``, ``'--hp aggregator='``, is followed by the value without a space).
    value: the name given.
    what: what a name is (``'algorithm'``).
    names: the accepted names.

  Returns:
    the ValueError (the caller raises it). Raises nothing itself.
  """
  import difflib
  names = [str(n) for n in names]
  close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
  hint = f"did you mean {close[0]}?" if close else f"choose one of {', '.join(names)}."
  sep = "" if where.endswith("=") else " "  # '--hp aggregator=krumm'
  return ValueError(f"{where}{sep}{value}: unknown {what}; {hint}")


def _aggregator_help() -> tuple:
  """``(base names, robust names)``, each sorted and comma-joined (``--aggregator``)."""
  from fedjax_inv.aggregation import robust
  from fedjax_inv.algorithms import base
  return ", ".join(sorted(base.AGGREGATORS)), ", ".join(sorted(robust.ROBUST))


# {token} of a RUN_KEYS help -> the names it stands for, read when the parser is built.
_HELP_LISTS = {
    "algorithms": lambda: ", ".join(choices("algorithm")),
    "tasks": lambda: ", ".join(choices("task")),
    "aggregators": lambda: _aggregator_help()[0],
    "robust_aggregators": lambda: _aggregator_help()[1],
    "attacks": lambda: ", ".join(choices("attack")),
    "client_optimizers": lambda: " | ".join(choices("client_optimizer")),
    "hparams": lambda: ", ".join(hparam_names()),
}


def help_text(key: str) -> str:
  """The ``--help`` text of ``RUN_KEYS[key]`` with every ``{token}`` of ``_HELP_LISTS``
  replaced by the names its registry holds now (so the help lists what is registered
  when the parser is built). Raises KeyError for a key not in ``RUN_KEYS``."""
  text = RUN_KEYS[key][1]
  for token, names in _HELP_LISTS.items():
    if "{" + token + "}" in text:
      text = text.replace("{" + token + "}", names())
  return text


def check_aggregator(spec, where: str = "--aggregator") -> None:
  """Checks an aggregator name (``mean``, ``krum``, ...) against the registered ones, and
  a robust one's ``NAME:k=v`` arguments (``fedjax_inv.aggregation.robust.parse``), before anything
  is built.

  Args:
    spec: the value (``'krum:f=2'``); a non-string is left to the algorithm's factory.
    where: the flag it came from, for the message.

  Raises:
    ValueError: an unknown name (:func:`unknown_name`, with a suggestion) or a bad
      robust argument (``robust.parse``'s message).
  """
  if not isinstance(spec, str):
    return
  name = spec.partition(":")[0].strip()
  if name not in choices("aggregator"):
    raise unknown_name(where, spec, NOUNS["aggregator"], choices("aggregator"))
  from fedjax_inv.aggregation import robust
  if name in robust.ROBUST:
    robust.parse(spec)
  elif ":" in spec:
    sep = "" if where.endswith("=") else " "
    raise ValueError(f"{where}{sep}{spec}: {name} takes no NAME:k=v arguments (only the "
                     f"robust aggregators do: {', '.join(sorted(robust.ROBUST))}).")


def _hparam_name(where: str, item: str) -> tuple:
  """``(scope or None, name, value text)`` of ``[ALGORITHM.]NAME=VALUE`` (``item``), the
  name checked against :func:`hparam_names`. Raises ValueError naming ``where``."""
  from fedjax_inv.algorithms import schema
  name, _, value = str(item).partition("=")
  scope, _, name = name.strip().rpartition(".")
  name = name.strip()
  if name not in hparam_names():
    p = schema.SCHEMA.get(name)
    if p is not None and p.kind == "any":
      raise ValueError(f"{where} {name}: set from the Python API only "
                       f"(make_algorithm(..., {name}=...)), not from a flag.")
    raise unknown_name(where, name, NOUNS["hp"], hparam_names())
  return scope.strip() or None, schema.canonical(name), value.strip()


def check_names(cfg: dict) -> None:
  """Checks every name a run's settings pick from a registry (``fedjax-inv run``: flags
  and config file): ``--task``, each ``--algorithm``, ``--aggregator`` (and an
  ``--hp aggregator=...``), ``--attack``, the NAME of every ``--hp`` and ``--sweep``
  item, before anything is loaded, built or printed. Call it after
  :func:`check_run_config` (it assumes the types that one checked).

  Args:
    cfg: the checked run config.

  Raises:
    ValueError: one line naming the flag and the value, with the closest registered name
      (``"--algorithm fedavgg: unknown algorithm; did you mean fedavg?"``) or the list.
  """
  if cfg.get("task") is not None and cfg["task"] not in choices("task"):
    raise unknown_name("--task", cfg["task"], NOUNS["task"], choices("task"))
  for a in str(cfg.get("algorithm") or "").split(","):
    if a.strip() and a.strip() not in choices("algorithm"):
      raise unknown_name("--algorithm", a.strip(), NOUNS["algorithm"],
                         choices("algorithm"))
  if cfg.get("aggregator") is not None:
    check_aggregator(cfg["aggregator"])
  for key in ("hp", "sweep"):
    for item in cfg.get(key) or []:
      scope, name, value = _hparam_name(flag(key), item)
      if key == "hp" and name == "aggregator":
        check_aggregator(_parse_value(value),
                         f"--hp {scope + '.' if scope else ''}aggregator=")


def check_devices(v, where: str = "--devices"):
  """``'all'`` or an integer >= 1 (a digit string becomes an int). Does not look at the
  machine: ``simulation.device_mesh`` checks N against ``jax.device_count()``.

  Raises:
    ValueError: anything else (the message names ``where``, the value and the fix).
  """
  if isinstance(v, str):
    t = v.strip().lower()
    v = "all" if t == "all" else (int(t) if t.lstrip("+-").isdigit() else v)
  if v == "all":
    return v
  if isinstance(v, bool) or not isinstance(v, int) or v < 1:
    raise ValueError(f"{where} {v!r}: use 'all' or a number of devices >= 1 (1 = no "
                     "sharding).")
  return v


def _check_privacy(cfg: dict) -> None:
  """Checks the client-level DP and the DP-SGD settings (each raises ValueError)."""
  for settings in (dp_settings(cfg), dp_sgd_settings(cfg)):
    if settings is not None:
      settings.check()


def dp_sgd_settings(cfg: dict):
  """The run's sample-level DP-SGD settings (``fedjax_inv.privacy.dp_sgd.DPSGDSettings``,
  unchecked), or None when no ``dp_sgd_*`` key is given.

  Raises:
    ValueError: a ``dp_sgd_*`` key without ``--dp-sgd-clip`` and
      ``--dp-sgd-noise-multiplier``."""
  keys = ("dp_sgd_clip", "dp_sgd_noise_multiplier", "dp_sgd_delta")
  given = [k for k in keys if cfg.get(k) is not None]
  if not given:
    return None
  if cfg.get("dp_sgd_clip") is None or cfg.get("dp_sgd_noise_multiplier") is None:
    raise ValueError(f"{', '.join(flag(k) for k in given)}: DP-SGD needs both "
                     "--dp-sgd-clip C and --dp-sgd-noise-multiplier SIGMA (e.g. 1.0 and "
                     "1.1).")
  from fedjax_inv.privacy.dp_sgd import DPSGDSettings
  return DPSGDSettings(clip=float(cfg["dp_sgd_clip"]),
                       noise_multiplier=float(cfg["dp_sgd_noise_multiplier"]),
                       delta=1e-5 if cfg.get("dp_sgd_delta") is None
                       else float(cfg["dp_sgd_delta"]))


def dp_settings(cfg: dict):
  """The run's client-level DP settings (``fedjax_inv.privacy.client_dp.DPSettings``, unchecked),
  or None when no ``dp_*`` key is given.

  Raises:
    ValueError: a ``dp_*`` key without ``--dp-clip``."""
  given = [k for k in DP_KEYS if cfg.get(k) is not None]
  if not given:
    return None
  if cfg.get("dp_clip") is None:
    raise ValueError(f"{', '.join(flag(k) for k in given)} without --dp-clip: client-level "
                     "DP needs the clipping norm C (e.g. --dp-clip 1.0).")
  from fedjax_inv.privacy.client_dp import DPSettings
  return DPSettings(clip=float(cfg["dp_clip"]),
                    noise_multiplier=cfg.get("dp_noise_multiplier"),
                    delta=1e-5 if cfg.get("dp_delta") is None else float(cfg["dp_delta"]),
                    accountant=(cfg.get("dp_accountant") or "rdp").lower(),
                    sampling=(cfg.get("client_sampling") or "fixed").lower(),
                    target_epsilon=cfg.get("dp_target_epsilon"),
                    adaptive_quantile=cfg.get("dp_adaptive_quantile"))


def check_replicas(mode, name: str = "replicas") -> str:
  """The batching choice of the Python front ends (``run_lodo``, ``run_sweep``), checked
  the way ``--replicas`` is: None gives :data:`DEFAULT_REPLICAS`.

  Raises:
    ValueError: ``mode`` is not one of :data:`REPLICA_MODES` (names the value).
  """
  if mode is None:
    return DEFAULT_REPLICAS
  if mode not in REPLICA_MODES:
    raise ValueError(f"{name}={mode!r}; choose one of {REPLICA_MODES} (default "
                     f"{DEFAULT_REPLICAS!r}: batched on GPU/TPU, sequential on CPU).")
  return mode


class CheckedConfig(dict):
  """A run configuration as :func:`check_run_config` returns it: checked once, where it
  entered (the command line or the Python API), so the planner does not check it again.
  Removing keys keeps it checked; a changed or added value needs a new check."""


def check_run_config(cfg: dict) -> dict:
  """Checks every run setting (flags, config file, API) for type and range before
  anything is loaded or compiled, and returns a copy with numbers as numbers (flags
  arrive as strings). ``None`` means "not given" (the default is used); 0 is never
  replaced by a default, it is refused where it is not allowed.

  Args:
    cfg: ``{key: value}`` with keys of ``RUN_KEYS``.

  Returns:
    the checked config (ints/floats converted, whitespace-stripped strings), a
    :class:`CheckedConfig`.

  Raises:
    ValueError: one line naming the flag, the value and the allowed range; unknown keys.
  """
  unknown = sorted(k for k in cfg if k not in RUN_KEYS and not k.startswith("_"))
  if unknown:
    raise ValueError(f"unknown settings {unknown}; valid: {sorted(RUN_KEYS)}.")
  out = dict(cfg)
  for key, (typ, _) in RUN_KEYS.items():
    v = cfg.get(key)
    if v is None:
      continue
    f = flag(key)
    kind, arg = _CHECKS.get(key, (None, None))
    if kind == "int":
      if isinstance(v, str) and v.strip().lstrip("+-").isdigit():
        v = int(v.strip())
      if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{f} {v!r}: must be an integer >= {arg}.")
      if v < arg:
        raise ValueError(f"{f} {v}: must be an integer >= {arg} (a value out of range is "
                         "refused, not replaced; leave the flag out for the default).")
    elif kind == "hparam":  # a flag string becomes a number, then the schema's check
      from fedjax_inv.algorithms.schema import RUN_FLAGS, check
      if isinstance(v, str):
        t = v.strip()
        v = int(t) if t.lstrip("+-").isdigit() else t
        if isinstance(v, str) and typ is float:
          try:
            v = float(t)
          except ValueError:
            pass
      if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
      v = check(RUN_FLAGS[key], v, f, sep=" ")
    elif kind == "float":  # a number (ranges: the feature's own check, e.g. DPSettings)
      try:
        v = float(v.strip()) if isinstance(v, str) else v
      except ValueError:
        raise ValueError(f"{f} {v!r}: must be a number.") from None
      if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{f} {v!r}: must be a number.")
      v = float(v)
    elif kind == "devices":
      v = check_devices(v, f)
    elif kind == "loggers":
      from fedjax_inv.runner.loggers import check_loggers
      v = check_loggers(v, f)
    elif typ is bool:
      if not isinstance(v, bool):
        raise ValueError(f"{f} {v!r}: must be true or false.")
    elif typ is list:
      if isinstance(v, str):
        v = [v]
      if key == "sweep":
        from fedjax_inv.runner.grid import parse_sweep
        if isinstance(v, dict):  # config file: {name: [values]}
          v = [f"{k}=" + ",".join(json.dumps(x) if not isinstance(x, str) else x
                                  for x in (vs if isinstance(vs, list) else [vs]))
               for k, vs in v.items()]
        if not isinstance(v, (list, tuple)) or not all(isinstance(i, str) for i in v):
          raise ValueError(f"{f} {v!r}: must be a list of NAME=V1,V2 strings or a mapping "
                           "{name: [values]}.")
        parse_sweep(list(v))  # raises with the item and the fix
        out[key] = list(v)
        continue
      if not isinstance(v, (list, tuple)) or not all(isinstance(i, str) for i in v):
        raise ValueError(f"{f} {v!r}: must be a list of NAME=VALUE strings.")
      for item in v:
        name = item.split("=", 1)[0].strip()
        if "=" not in item or not name or name.startswith(".") or name.endswith("."):
          if key == "task_arg":
            raise ValueError(f"{f} {item!r}: use NAME=VALUE, e.g. --task-arg "
                             "num_clients=100.")
          raise ValueError(f"{f} {item!r}: expected NAME=VALUE or ALGORITHM.NAME=VALUE, "
                           "e.g. --hp mu=0.1 or --hp fedprox.mu=0.1.")
      v = list(v)
    else:
      if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise ValueError(f"{f} {v!r}: must be a string.")
      v = str(v).strip()
      if not v and key not in ("select",):
        raise ValueError(f"{f} {v!r}: must not be empty.")
      if kind == "choice" and v.lower() not in [c.lower() for c in choices(key)]:
        raise unknown_name(f, v, NOUNS.get(key, "value"), choices(key))
    out[key] = v
  if "algorithm" in out and out["algorithm"] is not None:
    names = [a.strip() for a in str(out["algorithm"]).split(",")]
    if not all(names):
      raise ValueError(f"--algorithm {out['algorithm']!r}: give one name or a "
                       "comma-separated list without empty entries (fedjax-inv list).")
    if len(set(names)) != len(names):
      raise ValueError(f"--algorithm {out['algorithm']!r}: an algorithm is listed twice.")
  b = out.get("batch_size")
  if b is not None and str(b).lower() != "full":
    if not (str(b).isdigit() and int(b) >= 1):
      raise ValueError(f"--batch-size {b!r}: use a positive integer or 'full'.")
  _check_privacy(out)
  if out.get("resume") and out.get("out") and str(out["out"]) != str(out["resume"]):
    raise ValueError(f"--resume {out['resume']!r} with --out {out['out']!r}: a resumed run "
                     "writes into its own folder; drop --out.")
  if out.get("resume") and out.get("overwrite"):
    raise ValueError("--resume and --overwrite contradict each other; use one.")
  return CheckedConfig(out)


def _parse_value(s: str):
  try:
    return json.loads(s)
  except json.JSONDecodeError:
    return s


def robustness_settings(cfg: dict) -> dict:
  """``{'attack': Attack | None, 'participation': Participation | None, 'bucket': int |
  None}`` from ``--attack*``, ``--availability``, ``--dropout``, ``--stragglers``,
  ``--straggler-mode`` and ``--bucketing`` (checked by ``fedjax_inv.aggregation.robust.configure``).
  Raises ValueError for an attack setting without ``--attack``."""
  from fedjax_inv.core.adversary import Attack, Participation
  attack = None
  if cfg.get("attack"):
    attack = Attack(str(cfg["attack"]), float(cfg.get("attack_fraction") if
                                              cfg.get("attack_fraction") is not None else 0.1),
                    scale=cfg.get("attack_scale"))
  elif cfg.get("attack_fraction") is not None or cfg.get("attack_scale") is not None:
    raise ValueError("--attack-fraction / --attack-scale need --attack NAME.")
  keys = ("availability", "dropout", "stragglers", "straggler_mode")
  part = None
  if any(cfg.get(k) is not None for k in keys):
    defaults = Participation()
    part = Participation(**{k: cfg[k] if cfg.get(k) is not None else getattr(defaults, k)
                            for k in keys})
  return {"attack": attack, "participation": part, "bucket": cfg.get("bucketing")}


def task_arguments(cfg: dict) -> dict:
  """``{name: value}`` from ``--task-arg NAME=VALUE`` items (values parsed as JSON, else
  kept as strings). Raises ValueError for an item without ``=`` or a reserved name."""
  out = {}
  for item in cfg.get("task_arg") or []:
    name, eq, value = str(item).partition("=")
    name = name.strip()
    if not eq or not name.isidentifier():
      raise ValueError(f"--task-arg {item!r}: use NAME=VALUE, e.g. --task-arg "
                       "num_clients=100.")
    if name in ("seed", "data_dir", "source", "download", "holdout"):
      flag = "--holdout" if name == "holdout" else "--" + name.replace("_", "-")
      raise ValueError(f"--task-arg {name}: set it with {flag} instead.")
    out[name] = _parse_value(value.strip())
  return out


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
                       "only: tags such as !!python/... are refused.") from e
  else:
    try:
      cfg = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"--config {path}: not valid JSON ({e}); use .yaml/.yml for YAML.") from e
  if not isinstance(cfg, dict):
    raise ValueError(f"--config {path}: the top level must be a mapping of flag names.")
  if isinstance(cfg.get("config"), dict) and "provenance" in cfg:
    # a run's summary.json: its resolved config reproduces the run
    cfg = {k: v for k, v in cfg["config"].items() if k not in ("out", "overwrite", "resume")}
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


def algorithm_overrides(cfg: dict) -> dict:
  """Algorithm hyperparameters set explicitly by flags / config (no task defaults)."""
  from fedjax_inv.algorithms.schema import RUN_FLAGS
  kw = {}
  for src, dst in RUN_FLAGS.items():
    if src == "batch_size":
      continue  # below: 'full' means the whole client
    if cfg.get(src) is not None:
      kw[dst] = cfg[src]
  if cfg.get("batch_size") is not None:
    b = str(cfg["batch_size"])
    if b.lower() in ("full", "none", "0"):
      kw["batch_size"] = None
    else:
      try:
        kw["batch_size"] = int(b)
      except ValueError as e:
        raise ValueError(f"--batch-size {b!r}: use a positive integer or 'full'.") from e
  for item in cfg.get("hp") or []:
    if "=" not in item:
      raise ValueError(f"--hp {item!r}: expected NAME=VALUE or ALGORITHM.NAME=VALUE, "
                       "e.g. --hp mu=0.1 or --hp fedprox.mu=0.1.")
    k, v = item.split("=", 1)
    kw[k.strip()] = _parse_value(v.strip())
  return kw
