"""The training loop: rounds of the jitted engine, periodic on-device evaluation, and the
run's reporting (model selection, last-k averages, ranking / fairness metrics;
``fedjax_inv.eval.reporting``)."""
from __future__ import annotations

import dataclasses
import time
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.runner import auto_strategy, checkpoint
from fedjax_inv.runner.config import PRECISIONS
from fedjax_inv.privacy import client_dp as privacy
from fedjax_inv.core import multihost
from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.core.data import padding_overhead
from fedjax_inv.core.engine import build_round, client_mesh, init_state
from fedjax_inv.eval import build_evaluator, summarize
from fedjax_inv.eval import reporting as reporting_lib
from fedjax_inv.eval.metrics import build_predict


@dataclasses.dataclass
class RunResult:
  """The outcome of :func:`run`.

  Attributes:
    history: one dict per evaluated round: ``round`` (1-based), ``train_objective`` (mean
      local objective of that round), ``<set>_loss`` and ``<set>_accuracy`` /
      ``<set>_worst_client_accuracy`` / ``<set>_mean_client_accuracy`` (or ``<set>_mse``)
      for ``train`` and every evaluation set (``fedjax_inv.eval.summarize``), plus the
      ranking / fairness keys the run's ``reporting`` asks for.
    final: the last entry.
    params: final global model.
    server_state: final server state.
    strategy: resolved execution strategy, as the ``execution`` name that reproduces it
      ('vmap+patches' when the convolutions ran in the patches form).
    seconds: wall time of the rounds (evaluation included).
    selected: ``{rule: history entry}`` — the round picked by each selection rule of
      ``reporting.select`` (e.g. ``'min:ood_loss'``), empty if none.
    selected_params: ``{rule: params}`` — an independent copy of the global model of that
      round (``reporting.keep_params``).
    last_k_mean: metrics averaged over the last ``reporting.last_k`` rounds
      (``fedjax_inv.eval.reporting.last_k_mean``), or None.
    reporting: the resolved ``Reporting`` as a dict.
    probe: with ``execution`` 'auto' / 'probe' / 'rule', how the strategy was chosen
      (``{'chosen', 'by': 'cache' | 'measured' | 'rule', 'seconds_per_round', ...}``,
      :func:`fedjax_inv.runner.auto_strategy.choose`); None for an explicit strategy.
    privacy: with client-level DP (``fedjax_inv.privacy.client_dp.apply``): ``epsilon`` at
      ``delta`` after the run, the accountant, noise multiplier, clip, sampling, rounds
      and what is not covered (:func:`fedjax_inv.privacy.client_dp.record`); else None.
    padding: padded examples ÷ real examples of the pool (``pool``) and of the local
      training's computation (``compute``) under the strategy that ran
      (:func:`fedjax_inv.core.data.padding_overhead`).
    timing: wall seconds of the run's stages
      (:meth:`fedjax_inv.runner.progress.RunProgress.timing`): ``load_s`` (data loading; None
      when the task was built by the caller), ``compile_s`` (setup to the end of the
      first device call: compilation plus that call), ``first_round_at_s`` (start of
      the run to the end of its first round), ``round_s`` (median per round after the
      first call); for batched replicas those of the whole batch.
    precision: the arithmetic of the run's float32 matrix products and convolutions
      (:func:`matmul_precision`): 'highest' | 'tf32' | 'bf16'.
    pool: where the training pool lived and why (:func:`resolve_pool`):
      ``residency`` ('device' | 'host'), ``reason``, the packed and padded sizes, and
      for a host pool the cohort widths compiled, the clients holding state and the
      seconds spent gathering cohorts.
  """
  history: list
  final: dict
  params: Any
  server_state: Any
  strategy: str
  seconds: float
  selected: dict = dataclasses.field(default_factory=dict)
  selected_params: dict = dataclasses.field(default_factory=dict)
  last_k_mean: dict | None = None
  reporting: dict = dataclasses.field(default_factory=dict)
  probe: dict | None = None
  privacy: dict | None = None
  padding: dict | None = None
  timing: dict | None = None
  pool: dict | None = None
  precision: str = "highest"

  def report(self) -> dict:
    """The reporting part for ``summary.json``: ``selected``, ``last_k_mean``,
    ``reporting``, ``execution_probe``, ``privacy``, ``padding``, ``timing`` and ``pool`` (keys
    with nothing in them are left out), and ``precision``."""
    out = {}
    if self.selected:
      out["selected"] = self.selected
    if self.last_k_mean is not None:
      out["last_k_mean"] = self.last_k_mean
    if self.reporting:
      out["reporting"] = self.reporting
    if self.probe:
      out["execution_probe"] = self.probe
    if self.privacy:
      out["privacy"] = self.privacy
    if self.padding:
      out["padding"] = self.padding
    if self.timing:
      out["timing"] = self.timing
    if self.pool:
      out["pool"] = self.pool
    out["precision"] = self.precision
    return out


def evaluate_all(evaluate, params, task, reporting=None, predict_fn=None) -> dict:
  """Pooled metrics for the training clients (``train_*``) and each evaluation set, plus
  the ranking / fairness metrics of ``reporting`` (``fedjax_inv.eval.reporting``)."""
  per = {"train": evaluate(params, task.train_for_eval()
                           if hasattr(task, "train_for_eval") else task.train)}
  for name, data in task.eval_sets.items():
    per[name] = evaluate(params, data)
  out = {}
  for name, pc in per.items():
    out.update(summarize(pc, name))
  if reporting:
    out.update(reporting_lib.round_extras(per, params, task, reporting, predict_fn))
  return out


# The evaluation sets holding one client per training client, in the same order
# (``tasks.with_validation`` and the domain tasks' 90/10 split), on which each client's
# personal model is evaluated (besides its training data).
PERSONAL_SETS = ("val",)


def personal_metrics(evaluate, component, states, task) -> dict:
  """Each pool client's personal model on its own data (Ditto's personalized accuracy).

  Args:
    evaluate: :func:`fedjax_inv.eval.build_evaluator`'s function (its ``each``).
    component: the algorithm's personal component (``Algorithm.personal``).
    states: its per-client state, leading pool axis ``[N, ...]``.
    task: the run's task; its training clients and each set of :data:`PERSONAL_SETS`
      with ``N`` clients are evaluated, client ``i`` with ``personal_params(states[i])``.
      The training data is skipped when the task evaluates a sample of it
      (``Task.train_eval``).

  Returns:
    ``summarize`` metrics with the prefixes ``personal_train`` and ``personal_val``:
    ``personal_val_mean_client_accuracy`` is the mean over clients of each personal
    model's accuracy on its own held-out rows (Ditto's reported metric, the test
    accuracy averaged over devices; Li et al. 2021), beside ``val_mean_client_accuracy`` of
    the global model on the same rows.
  """
  own = jax.vmap(lambda s: component.call("personal_params", state=s))(states)
  n = task.train.num_clients
  sets = {} if getattr(task, "train_eval", None) is not None else {"train": task.train}
  sets.update({k: d for k, d in task.eval_sets.items()
               if k in PERSONAL_SETS and d.num_clients == n})
  out = {}
  for name, data in sets.items():
    out.update(summarize(evaluate.each(own, data), f"personal_{name}"))
  return out


class DivergedError(FloatingPointError):
  """A run's train objective became non-finite (NaN or ±inf).

  Attributes:
    round: the first round (1-based) whose train objective was not finite.
    history: the evaluated rounds before it (``RunResult.history`` entries).
    algorithm: the algorithm's name.
  """

  def __init__(self, round: int, history: list, algorithm: str):
    self.round, self.history, self.algorithm = int(round), list(history), algorithm
    super().__init__(f"training diverged at round {self.round}: the train objective of "
                     f"{algorithm} is not finite; lower the learning rates.")


@jax.jit
def _first_bad_round(bad, loss, r):
  # Stays on device: the first round whose objective is not finite (0 while all are).
  return jnp.where((bad == 0) & ~jnp.isfinite(loss), r, bad)


# How often (in rounds) the device-side divergence flag is read between evaluations.
CHECK_EVERY = 10


def build_fused_rounds(round_fn):
  """Fuses several rounds into one device call.

  Args:
    round_fn: a :func:`fedjax_inv.core.engine.build_round` result.

  Returns:
    ``fused(server, client_states, data, key, bad, first_round, n) -> (server,
    client_states, bad, train_loss)``: runs rounds ``first_round .. first_round + n - 1``
    (1-based) inside one jitted ``lax.fori_loop`` (``n`` is traced: one compile for every
    segment length) and returns the state after them, the device-side first non-finite
    round ``bad`` (0 while all are finite) and the last round's ``train_loss`` (scalar).
    The per-client states (argument 1) are donated, as in ``round_fn``.
  """
  raw = round_fn.jitted

  def fused(server, cstates, data, key, bad, first_round, n):
    loss0 = jax.eval_shape(lambda s, c: raw(s, c, data, key)[2]["train_loss"], server,
                           cstates)

    def body(i, carry):
      s, c, b, _ = carry
      s, c, m = raw(s, c, data, key)
      return s, c, _first_bad_round(b, m["train_loss"], first_round + i), m["train_loss"]
    return jax.lax.fori_loop(0, n, body, (server, cstates, bad,
                                          jnp.zeros(loss0.shape, loss0.dtype)))

  jitted = jax.jit(fused, donate_argnums=(1,))
  return lambda server, cstates, data, key, bad, first_round, n: jitted(
      server, cstates, data, key, bad, jnp.int32(first_round), jnp.int32(n))


def advance(round_fn, fused, server, cstates, data, key, bad, first: int, rounds: int,
            stops, rounds_per_call: int):
  """Runs the rounds of one device call starting at round ``first``: up to the next
  round in ``stops`` (evaluation / checkpoint rounds), at most ``rounds_per_call``
  rounds, never past ``rounds``; one ``round_fn`` call, or one ``fused`` call
  (:func:`build_fused_rounds`) for several rounds.

  Returns:
    ``(server, client_states, bad, train_loss, last_round)``.
  """
  r = first
  if fused is not None:
    while r < rounds and r - first + 1 < rounds_per_call and r not in stops:
      r += 1
  if r > first:
    return (*fused(server, cstates, data, key, bad, first, r - first + 1), r)
  server, cstates, metrics = round_fn(server, cstates, data, key)
  return (server, cstates, _first_bad_round(bad, metrics["train_loss"], r),
          metrics["train_loss"], r)


def keep_selected(rep, history: list, params, selected_params: dict) -> None:
  """After ``history`` got a new entry: for each selection rule of ``rep`` that now picks
  that entry, stores an independent copy of ``params`` in ``selected_params[rule]``
  (the selected index only ever moves to the newest entry, so copying now suffices)."""
  if not rep.keep_params:
    return
  for rule in rep.select:
    if reporting_lib.select_index(history, rule, rep.select_from)[0] == len(history) - 1:
      selected_params[rule] = _copy_params(params)


def _copy_params(params):
  # An independent copy: the selected model must not change with later rounds, even if
  # the engine ever donates or updates the server state in place.
  return jax.tree.map(lambda a: jnp.array(a, copy=True), params)


def warn_short_schedule(algorithm, rounds: int) -> str | None:
  """Warns (``UserWarning``, and returns the text) when a run is too short for the
  algorithm's penalty schedule: with ``rounds <= warmup_rounds`` an algorithm whose
  penalty starts after a warm-up (Invariant FedAvg §3.3: λ(t) = 0 until FedAvg has
  converged) never switches the penalty on, so the run *is* its base algorithm. The
  warm-up is not rescaled silently: the paper's schedule is in rounds, and a rescaled
  one would make short and long runs different algorithms. Returns None when fine."""
  import warnings
  warm = (getattr(algorithm, "hparams", None) or {}).get("warmup_rounds")
  if not warm or rounds > int(warm):
    return None
  msg = (f"{algorithm.name}: rounds={rounds} <= warmup_rounds={int(warm)}, so the "
         "penalty never switches on and this run is the base algorithm (FedAvg for "
         f"inv_fedavg). Run more than {int(warm)} rounds, or pass a shorter warm-up "
         "(--hp warmup_rounds=K, K < rounds).")
  warnings.warn(msg, UserWarning, stacklevel=4)  # the caller of run() / run_replicas()
  return msg


def _privacy_record(algorithm, task, num_clients: int, cohort: int, rounds: int):
  """summary.json's ``privacy``: client-level DP (``fedjax_inv.privacy.client_dp.record``) and,
  under DP-SGD, ``sample_level`` (``fedjax_inv.privacy.dp_sgd.record``); None without either."""
  from fedjax_inv.privacy import dp_sgd
  rec = privacy.record(algorithm, num_clients, cohort, rounds)
  sample = dp_sgd.record(algorithm, task.train.n, rounds)
  if sample is None:
    return rec
  return {**(rec or {}), "sample_level": sample}


def prepare(task, algorithm, rounds, clients_per_round, execution, chunk_size,
            eval_every, shard, reporting, rounds_per_call, measure: bool = True,
            streamed: bool = False):
  """Checks a run's settings and builds its jitted pieces (shared by :func:`run` and
  ``fedjax_inv.runner.replicas.run_replicas``); every check happens before any compile.

  Returns:
    a namespace: ``rounds``, ``num_clients``, ``cohort``, ``rep`` (resolved reporting),
    ``schedule`` (set of evaluated rounds), ``model``, ``round_fn``, ``rounds_per_call``,
    ``evaluate``, ``predict_fn`` (or None), ``probe`` (how 'auto' / 'probe' / 'rule'
    chose the strategy, :func:`fedjax_inv.runner.auto_strategy.choose`; None for an explicit
    strategy). ``measure=False`` (a batch of replicas): 'auto' takes the fixed rule.
    ``streamed=True`` (a host pool, :func:`resolve_pool`): the round trains on cohorts
    gathered on the host (``engine.build_round(streamed=True)``), 'auto' takes the fixed
    rule and every round is one device call (a fused call would need every round's
    cohort on the device at once).

  Raises:
    ValueError: as :func:`run`.
  """
  if isinstance(rounds, bool) or int(rounds) != rounds or rounds < 1:
    raise ValueError(f"rounds={rounds}; it must be an integer >= 1.")
  rounds = int(rounds)
  warn_short_schedule(algorithm, rounds)
  num_clients = task.train.num_clients
  # None means "the default"; 0 or a negative number is refused, never replaced
  for name, v in (("clients_per_round", clients_per_round), ("eval_every", eval_every),
                  ("chunk_size", chunk_size)):
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))
                          or v < 1):
      raise ValueError(f"{name}={v!r}; it must be an integer >= 1 (or None for the "
                       "default).")
  cohort = num_clients if clients_per_round is None else int(clients_per_round)
  eval_every = max(1, rounds // 20) if eval_every is None else int(eval_every)
  if isinstance(rounds_per_call, bool) or not isinstance(rounds_per_call, (int, np.integer)) \
      or rounds_per_call < 1:
    raise ValueError(f"rounds_per_call={rounds_per_call!r}; it must be an integer >= 1 "
                     "(1 = one device call per round).")
  rep = reporting_lib.resolve(reporting, task)
  reporting_lib.check(rep, task)
  schedule = set(reporting_lib.eval_rounds(rounds, int(eval_every), rep.last_k))
  mesh = device_mesh(shard, cohort)
  model = algorithm.model_for(task.model)
  def build(strategy):
    return build_round(model, task.kind, algorithm, num_clients, cohort,
                       execution=strategy, chunk_size=chunk_size, mesh=mesh,
                       feature_shape=task.train.feature_shape, n_max=task.train.n_max,
                       streamed=streamed)

  probe = None
  if execution in auto_strategy.MODES:
    # 'auto' by measurement with a cache, 'probe' (measure now) or 'rule' (the fixed
    # rule); every process of a multi-process run, and a batch of replicas, takes the
    # fixed rule (one program for all; fedjax_inv/runner/auto_strategy.py).
    mode = (execution if measure and jax.process_count() == 1 and not streamed
            else "rule")
    server, cstates = (init_state(algorithm, model.init(0), num_clients)
                       if mode != "rule" else (None, None))
    round_fn, probe = auto_strategy.choose(
        mode, task, model, algorithm, cohort, rounds, build, server, cstates,
        num_devices=mesh.devices.size if mesh is not None else 1)
  else:
    round_fn = build(execution)
  evaluate = build_evaluator(model, task.kind, algorithm)
  predict_fn = build_predict(model, algorithm) if rep.ranking else None
  return types.SimpleNamespace(
      mesh=mesh,
      rounds=rounds, num_clients=num_clients, cohort=cohort, rep=rep, schedule=schedule,
      model=model, round_fn=round_fn,
      rounds_per_call=1 if streamed else int(rounds_per_call),
      evaluate=evaluate, predict_fn=predict_fn, probe=probe,
      privacy=_privacy_record(algorithm, task, num_clients, cohort, rounds),
      padding=padding_overhead(task.train, algorithm, cohort, round_fn.strategy,
                               getattr(round_fn, "chunk_size", None)),
      dp_epsilon=(None if "dp_clip" not in algorithm.hparams else
                  lambda r: privacy.record(algorithm, num_clients, cohort, r)["epsilon"]))


def run(task, algorithm, *, rounds: int, clients_per_round: int | None = None,
        seed: int = 0, execution: str = "auto", chunk_size: int | None = None,
        eval_every: int | None = None, progress: bool = True, shard: bool = True,
        callback: Callable[[dict], None] | None = None,
        reporting="auto", checkpoint_dir=None,
        checkpoint_every: int | None = None, rounds_per_call: int = 1,
        loggers=None, run_name: str | None = None, label: str | None = None,
        load_seconds: float | None = None, pool: str = "auto",
        precision: str = "highest", host_split: bool = False) -> RunResult:
  """Trains ``algorithm`` on ``task`` for ``rounds`` rounds.

  Args:
    task: a ``Task`` (``fedjax_inv.tasks``) or any object with ``train``, ``eval_sets``,
      ``model``, ``kind`` (and ``info`` for ``reporting='auto'``).
    algorithm: an ``Algorithm`` (``fedjax_inv.algorithms.make_algorithm``).
    rounds: number of rounds (>= 1).
    clients_per_round: cohort size C (default: all training clients).
    seed: initializes the model (``seed``) and drives sampling/minibatches; the same seed
      gives bit-identical metrics on the same machine.
    execution: 'auto' (default: the strategy measured fastest for this round shape on
      this device, from the cache, or measured now for a run of at least
      ``auto_strategy.MEASURE_MIN_ROUNDS`` rounds, else the fixed rule;
      ``fedjax_inv/runner/auto_strategy.py``) | 'rule' (the fixed rule, no measurement) |
      'probe' (measure now, refresh the cache) | 'vmap' | 'scan' | 'chunked'. How the
      strategy was chosen is in ``RunResult.probe``.
    eval_every: evaluate every this many rounds (default ``max(1, rounds // 20)``); the
      last round, and each of the last ``reporting.last_k`` rounds, are always evaluated
      (``fedjax_inv.eval.reporting.eval_rounds``).
    progress: a tqdm bar when stderr is a terminal; otherwise (logs, CI, ``nohup``,
      pipes, notebooks) one flushed line on stderr per evaluated round and at least one a
      minute, with round/total, s/round, ETA and the main metrics
      (:class:`fedjax_inv.runner.progress.RunProgress`); either way a first line with the data
      loading and compile seconds. False: nothing.
    shard: True (default): shard the client axis over all devices when more than one is
      present and the cohort divides evenly; False: one device; an int N: the first N
      devices (:func:`device_mesh`; ``fedjax-inv run --devices N``).
    callback: called with each history entry.
    loggers: experiment loggers (``fedjax_inv.runner.loggers``: ``TensorBoardLogger``,
      ``WandbLogger``, ``CsvLogger``, or any object with ``log(run, config, entry)`` and
      ``close()``): each history entry is logged under ``run_name`` (default
      ``'<algorithm>-seed<seed>'``) with the algorithm's hyperparameters and the seed as
      its config; they are closed when the run ends.
    run_name: the run's name in ``loggers``.
    label: the run's name on progress lines (default ``'<algorithm> seed <seed>'``).
    load_seconds: seconds the caller spent building ``task`` (its data loading), for the
      first progress line and ``RunResult.timing['load_s']``; None = unknown.
    reporting: what to record beyond the pooled metrics — 'auto' (default: the task's
      paper protocol, ``fedjax_inv.eval.reporting.for_task``), None (nothing), a dict of
      ``Reporting`` fields (e.g. ``{'select': ['min:ood_loss'], 'last_k': 20}``) or a
      ``Reporting``. Results: ``RunResult.selected`` / ``selected_params`` /
      ``last_k_mean`` and extra history keys.
    checkpoint_dir: with ``checkpoint_every``, the state (server, per-client states,
      selected models, round, history, divergence flag) is saved there every
      ``checkpoint_every`` rounds (:func:`save_checkpoint`); if a checkpoint is already
      there the run continues from it (``callback`` is replayed on the restored history)
      and ends bit-identical to an uninterrupted run (the per-round randomness derives
      from the seed and the server's round counter).
    checkpoint_every: rounds between checkpoints (>= 1); None = never save.
    rounds_per_call: fused rounds: up to this many rounds run in ONE device
      call (a ``lax.fori_loop`` over the jitted round, :func:`build_fused_rounds`), with
      no host synchronization between them; evaluation, checkpoints, the divergence
      check and the progress bar happen at call boundaries (a call always ends at an
      evaluation or checkpoint round). 1 (default) = one call per round. Results equal
      the per-round loop (``tests/test_fused.py``).
    pool: where the training pool lives (:func:`resolve_pool`): 'device' (the whole
      padded ``[N, n_max, ...]`` pool on the device, each round gathers its cohort
      there), 'host' (a packed pool on the host, each round's cohort gathered, padded to
      a bucketed width and sent to the device while the previous round runs; per-client
      state only for clients that took part) or 'auto' (default: 'device' when the
      padded pool is small, else 'host'). Same numbers either way for the same seed;
      ``RunResult.pool`` says which and why.
    host_split: a host pool's 'scan' round on one CPU device as two programs at once, each
      training half of the cohort from its own host thread (``engine.build_split_round``):
      about 1.3x faster on 2 CPU cores (FEMNIST, ``benchmarks/RESULTS.md``), but not
      bit-reproducible: XLA:CPU's float32 results of two programs at once vary from run
      to run in the last bits, which training then amplifies. Default False: one
      program, the same numbers on every rerun. Ignored elsewhere.
    precision: the arithmetic of float32 matrix products and convolutions
      (:func:`matmul_precision`): 'highest' (default: float32 on every device), 'tf32'
      or 'bf16'; recorded in ``RunResult.precision``.

  Raises:
    ValueError: ``rounds < 1``, bad cohort, an unknown ``precision``, bad strategy,
      ``clients_per_round`` / ``eval_every`` / ``chunk_size`` / ``checkpoint_every`` < 1
      (0 is refused, not replaced by the default), ``rounds_per_call`` < 1, a bad
      ``shard`` (more devices
      than exist, a cohort that does not divide evenly), bad ``eval_every`` or
      ``reporting`` (e.g. a selection rule on a metric the run does not record) — all
      before compiling.
    DivergedError: (a ``FloatingPointError``) the train objective became NaN/inf; the
      run stops at the next evaluation or within ``CHECK_EVERY`` rounds, and the error
      carries the FIRST non-finite round (a device-side scalar updated every round)
      and the history so far.
  """
  with matmul_precision(precision):
    from fedjax_inv.runner import progress as progress_lib
    started = progress_lib.clock()
    check_checkpoint_every(checkpoint_every)
    task, pool_record = resolve_pool(task, pool)
    host = pool_record["residency"] == "host"
    p = prepare(task, algorithm, rounds, clients_per_round, execution, chunk_size,
                eval_every, shard, reporting, rounds_per_call, streamed=host)
    round_fn = p.round_fn
    if host:
      from fedjax_inv.core.stream import StreamedRound
      server, one = init_state(algorithm, p.model.init(seed), 1)
      if one and checkpoint_dir is not None and checkpoint_every:
        raise ValueError(f"{algorithm.name} keeps per-client state, which a host pool "
                         "(--pool host) does not checkpoint yet; use --pool device, or run "
                         "without --checkpoint-every.")
      split = None
      if (p.round_fn.strategy == "scan" and p.mesh is None and p.cohort > 1 and
          jax.default_backend() == "cpu" and host_split):
        from fedjax_inv.core.engine import build_split_round
        split = build_split_round(p.model, task.kind, algorithm, p.num_clients, p.cohort)
      round_fn = StreamedRound(p.round_fn, task.train, jax.tree.map(lambda a: a[0], one),
                               split=split)
      cstates = {}
    else:
      server, cstates = init_state(algorithm, p.model.init(seed), p.num_clients)
    if loggers:
      from fedjax_inv.runner.loggers import close_all
      name = run_name or f"{algorithm.name}-seed{seed}"
      config = {**algorithm.hparams, "seed": seed, "task": task.name}
      user_cb = callback

      def callback(e):
        if user_cb is not None:
          user_cb(e)
        for lg in loggers:
          lg.log(name, config, e)
    try:
      out = train_loop(p, round_fn, task.train, server, cstates, jax.random.key(seed),
                       tasks=[task], algorithm=algorithm, batched=False, progress=progress,
                       desc=f"{algorithm.name} on {task.name}",
                       callback=None if callback is None else lambda i, e: callback(e),
                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                       label=label or f"{algorithm.name} seed {seed}",
                       load_seconds=load_seconds, started=started)[0]
    finally:
      if loggers:
        close_all(loggers)
      if host:
        pool_record.update(round_fn.record())
        round_fn.close()
    if isinstance(out, DivergedError):
      raise out
    out.pool = pool_record
    out.precision = precision
    return out


def matmul_precision(precision: str):
  """The context a run computes in: ``jax.default_matmul_precision`` of ``precision``
  (``config.PRECISIONS``): 'highest' → float32 products on every device, 'tf32' →
  TensorFloat-32 on NVIDIA GPUs that have it, 'bf16' → bfloat16 products with float32
  sums. Every program a run compiles (rounds, evaluation, the strategy probe) is traced
  inside it, and the choice is part of JAX's compilation cache key.

  Raises:
    ValueError: ``precision`` not one of 'highest', 'tf32', 'bf16'.

  Source: JAX documentation, "Matmul precision" (JAX's default on recent NVIDIA GPUs is
  TensorFloat-32)."""
  if precision not in PRECISIONS:
    raise ValueError(f"precision={precision!r}; choose one of {tuple(PRECISIONS)} "
                     "('highest': float32 on every device, the default).")
  return jax.default_matmul_precision(PRECISIONS[precision])


POOLS = ("auto", "device", "host")
# 'auto' keeps a packed pool's padded layout on the device up to this size (and up to
# RESIDENT_MAX_FRACTION of the device's memory), and streams it from the host above.
RESIDENT_MAX_BYTES = 1 << 30
RESIDENT_MAX_FRACTION = 0.1


def _mb(b) -> float:
  return round(b / 2**20, 1)


def resolve_pool(task, pool: str = "auto"):
  """Where a run's training pool lives: ``(task, record)``.

  Args:
    task: the run's task; its ``train`` is a resident ``ClientData`` or a packed host
      pool (``core.packed.PackedPool``: ``femnist`` and pools built with
      ``pack_client_arrays``).
    pool: 'device' | 'host' | 'auto'. 'auto' keeps a ``ClientData`` as it is, and puts
      a packed pool on the device when its padded layout takes at most
      ``RESIDENT_MAX_BYTES`` and ``RESIDENT_MAX_FRACTION`` of the device's memory
      (small pools lose nothing), else keeps it on the host (several processes: always
      the device).

  Returns:
    the task with its pool in that layout (a packed pool padded for 'device', a
    ``ClientData`` packed for 'host'; evaluation sets follow a packed training pool),
    and ``{'residency', 'reason', 'packed_mb', 'padded_mb'}`` for summary.json.

  Raises:
    ValueError: an unknown ``pool``, or 'host' with several processes.
  """
  import dataclasses as dc
  from fedjax_inv.core.packed import PackedPool
  rec = pool_plan(task, pool)
  train = task.train
  packed = isinstance(train, PackedPool)
  if rec["residency"] == "device" and packed:
    sets = {k: v.padded() if isinstance(v, PackedPool) else v
            for k, v in task.eval_sets.items()}
    task = dc.replace(task, train=train.padded(), eval_sets=sets)
  elif rec["residency"] == "host" and not packed:
    task = dc.replace(task, train=PackedPool.from_client_data(train))
  return task, rec


def pool_plan(task, pool: str = "auto") -> dict:
  """:func:`resolve_pool`'s decision without moving any data: ``{'residency',
  'reason', 'packed_mb', 'padded_mb'}`` (the two layouts' sizes of the training pool;
  ``fedjax-inv run --dry-run`` prints them). Raises ValueError as
  :func:`resolve_pool`."""
  from fedjax_inv.runner.config import unknown_name
  from fedjax_inv.core import memory
  from fedjax_inv.core.packed import PackedPool
  if pool not in POOLS:
    raise unknown_name("--pool", pool, "pool residency", POOLS)
  train = task.train
  packed = isinstance(train, PackedPool)
  if packed:
    stored, padded = train.stored_bytes(), train.padded_bytes()
  else:  # the resident layout's real rows, packed as float32
    n = np.asarray(train.n, np.int64)
    row = int(np.prod(train.feature_shape, dtype=np.int64)) * 4 + 4
    stored, padded = int(n.sum()) * row + 8 * (len(n) + 1), len(n) * train.n_max * row
  rec = {"packed_mb": _mb(stored), "padded_mb": _mb(padded)}
  if pool == "host" and jax.process_count() > 1:
    raise ValueError("--pool host runs in one process; several processes shard the "
                     "cohort of a device pool: use --pool device (or auto).")
  if pool == "auto":
    limit = min(RESIDENT_MAX_BYTES, RESIDENT_MAX_FRACTION * memory.device_memory_bytes())
    if not packed:
      residency, why = "device", "the task's pool is resident already (a ClientData)"
    elif jax.process_count() > 1:
      residency, why = "device", "several processes shard the cohort of a device pool"
    elif padded <= limit:
      residency, why = "device", f"the padded layout fits under {limit / 2**20:,.0f} MB"
    else:
      residency, why = "host", (f"the padded layout exceeds {limit / 2**20:,.0f} MB: each "
                                "round's cohort is streamed from the packed pool")
  else:
    residency, why = pool, f"asked for (--pool {pool})"
  rec.update(residency=residency, reason=why)
  return rec


def device_mesh(shard, cohort: int):
  """The ``clients`` mesh a run shards its client axis over (``engine.client_mesh``).

  Args:
    shard: True = every device of ``jax.devices()`` (the cohort is split only when it
      divides evenly, else the round runs unsharded, as before ``--devices``); False = no
      mesh; an int N >= 1 = the first N devices (``fedjax-inv run --devices N``).
    cohort: clients per round ``C``.

  Returns:
    a 1-D ``jax.sharding.Mesh`` with axis ``'clients'``, or None for one device.

  Raises:
    ValueError: N < 1, N > ``jax.device_count()``, or ``C`` not divisible by N (the
      message names the values and a fix).
  """
  if shard is True:
    return client_mesh()
  if shard is False or shard is None:
    return None
  if isinstance(shard, bool) or not isinstance(shard, (int, np.integer)) or shard < 1:
    raise ValueError(f"devices={shard!r}: use a number of devices >= 1, or all.")
  count = jax.device_count()
  if shard > count:
    raise ValueError(f"--devices {shard} (shard={shard}): this machine has {count} "
                     f"{jax.default_backend()} "
                     f"device(s); use --devices all or a number <= {count}.")
  if cohort % shard:
    fit = max(d for d in range(1, int(shard) + 1) if cohort % d == 0)
    raise ValueError(f"--devices {shard} (shard={shard}): clients_per_round={cohort} does "
                     f"not split evenly over {shard} devices; use --devices {fit}, or a "
                     f"--clients-per-round that is a multiple of {shard}.")
  return client_mesh(int(shard))


def check_checkpoint_every(checkpoint_every) -> None:
  """Raises ValueError unless ``checkpoint_every`` is None or an integer >= 1."""
  if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or
                                       int(checkpoint_every) != checkpoint_every or
                                       checkpoint_every < 1):
    raise ValueError(f"checkpoint_every={checkpoint_every}; it must be an integer >= 1.")


def _take(tree, i):
  return jax.tree.map(lambda a: a[i], tree)


class _Replicas:
  """The per-replica bookkeeping of :func:`train_loop`: histories, selected models and
  divergence errors of S runs, and their (de)serialization for checkpoints. With
  ``batched=False`` there is one replica and the states carry no replica axis."""

  def __init__(self, tasks, algorithm_name: str, batched: bool):
    self.tasks, self.name, self.batched = list(tasks), algorithm_name, batched
    self.S = len(self.tasks)
    self.histories = [[] for _ in self.tasks]
    self.selected_params = [{} for _ in self.tasks]
    self.errors: list = [None] * self.S

  def params(self, server, i):
    return _take(server.params, i) if self.batched else server.params

  def client_state(self, cstates, name: str, i):
    """Replica ``i``'s pool state ``cstates[name]`` (``[N, ...]``)."""
    return _take(cstates[name], i) if self.batched else cstates[name]

  def flags(self, bad) -> np.ndarray:
    return np.atleast_1d(multihost.to_host(bad))

  def zero_flags(self):
    return jnp.zeros((self.S,) if self.batched else (), jnp.int32)

  def check(self, bad) -> bool:
    """Records a DivergedError for each newly diverged replica; True when all have."""
    for i, b in enumerate(self.flags(bad)):
      if b and self.errors[i] is None:
        self.errors[i] = DivergedError(int(b), self.histories[i], self.name)
    return all(e is not None for e in self.errors)

  def state(self, server, cstates):
    sel = self.selected_params if self.batched else self.selected_params[0]
    return (server, cstates, sel)

  def meta(self, r: int, bad) -> dict:
    if not self.batched:  # the one-run format (history, bad, selected rule names)
      return {"round": r, "history": self.histories[0], "bad": int(self.flags(bad)[0]),
              "selected": list(self.selected_params[0])}
    return {"round": r, "histories": self.histories, "bad": [int(b) for b in self.flags(bad)],
            "selected": [list(s) for s in self.selected_params]}

  def restore(self, checkpoint_dir, server, cstates):
    """``(server, cstates, bad, next round)`` from the newest checkpoint in
    ``checkpoint_dir``, or the given states at round 1 when there is none."""
    meta0 = checkpoint.load_checkpoint_meta(checkpoint_dir)
    if meta0 is None:
      return server, cstates, self.zero_flags(), 1
    rules = [meta0["selected"]] if not self.batched else meta0["selected"]
    sel = [{rule: self.params(server, i) for rule in rs} for i, rs in enumerate(rules)]
    target = (server, cstates, sel if self.batched else sel[0])
    (server, cstates, sel), meta = checkpoint.load_checkpoint(checkpoint_dir, target)
    self.selected_params = sel if self.batched else [sel]
    self.histories = meta["histories"] if self.batched else [meta["history"]]
    bad = jnp.asarray(meta["bad"], jnp.int32)
    self.check(bad)
    return server, cstates, bad, meta["round"] + 1

  def results(self, p, server, strategy: str, seconds: float, probe=None,
              timing=None) -> list:
    """One RunResult (or DivergedError) per replica."""
    rep, out = p.rep, []
    for i in range(self.S):
      if self.errors[i] is not None:
        out.append(self.errors[i])
        continue
      h = self.histories[i]
      out.append(RunResult(
          h, h[-1], self.params(server, i), _take(server, i) if self.batched else server,
          strategy, seconds,
          selected=reporting_lib.select_rounds_by(h, rep.select, rep.select_from),
          selected_params=self.selected_params[i],
          last_k_mean=reporting_lib.last_k_mean(h, rep.last_k, p.rounds)
          if rep.last_k else None,
          reporting=rep.to_dict() if rep else {}, probe=probe,
          privacy=getattr(p, "privacy", None), padding=getattr(p, "padding", None),
          timing=dict(timing) if timing else None))
    return out


def train_loop(p, round_fn, data, server, cstates, keys, *, tasks, algorithm, batched: bool,
               progress: bool = True, desc: str = "", callback=None, checkpoint_dir=None,
               checkpoint_every: int | None = None, label: str | None = None,
               load_seconds: float | None = None, started: float | None = None) -> list:
  """THE training loop: rounds of ``round_fn`` (one device call per round, or
  fused calls), the divergence check, evaluation on the schedule, model selection,
  checkpoints and resume, the progress bar — for one run (``batched=False``,
  :func:`run`) or S runs batched on a leading replica axis (``batched=True``,
  ``fedjax_inv.runner.replicas.run_replicas``).

  Args:
    p: :func:`prepare`'s namespace (rounds, schedule, reporting, evaluator, fused rounds).
    round_fn: ``(server, client_states, data, keys) -> (server, client_states, metrics)``
      with ``metrics['train_loss']`` a scalar, or ``[S]`` when batched.
    data: the training ``ClientData`` (``[N, n_max, ...]``; ``[S, N, ...]`` for
      per-replica data).
    server, cstates, keys: initial states and PRNG keys (``[S, ...]`` when batched).
    tasks: S tasks, replica ``i`` is evaluated on ``tasks[i]`` (S = 1 unbatched).
    algorithm: the (structure) ``Algorithm``; its name goes into errors.
    callback: ``callback(i, entry)`` after each evaluation of replica ``i`` (after that
      round's checkpoint).
    checkpoint_dir, checkpoint_every: save every ``checkpoint_every`` rounds and resume
      from a checkpoint found in ``checkpoint_dir`` (``fedjax_inv.runner.checkpoint``;
      bit-identical to an uninterrupted run); ``callback`` is replayed on the restored
      histories.
    progress, desc, label, load_seconds, started: the run's progress on stderr
      (:class:`fedjax_inv.runner.progress.RunProgress`: a bar in a terminal, else plain lines;
      ``label`` names the run on them, default ``desc``); ``load_seconds`` = its data
      loading, ``started`` = ``progress.clock()`` when its setup began (default: when
      the loop starts). The first device call is waited for, so that ``compile_s``
      (setup + compilation + that call) is measured; s/round counts only calls the loop
      waited for anyway (evaluation, divergence check) or waits for when a plain line
      is due. ``RunResult.timing`` gets the numbers.

  Returns:
    one ``RunResult`` or ``DivergedError`` per replica (a diverged replica stops being
    evaluated; the loop ends early when all have diverged). ``seconds`` is the wall
    time divided by S.
  """
  reps = _Replicas(tasks, algorithm.name, batched)
  personal = algorithm.personal
  fused = build_fused_rounds(round_fn) if p.rounds_per_call > 1 else None
  from fedjax_inv.runner import progress as progress_lib
  t0 = time.perf_counter()
  started = progress_lib.clock() if started is None else started
  bad, start = reps.zero_flags(), 1
  multi = jax.process_count() > 1
  if multi and batched:
    raise ValueError("several processes: batched replicas are not supported yet; run "
                     "one after another.")
  saving = bool(checkpoint_every) and checkpoint_dir is not None
  if checkpoint_dir is not None:  # every process reads the same (shared) folder
    server, cstates, bad, start = reps.restore(checkpoint_dir, server, cstates)
    if multi:
      multihost.agree(start - 1, f"the newest checkpoint round in {checkpoint_dir}",
                      "give --out a folder on a file system every process shares")
    for i, h in enumerate(reps.histories):
      for entry in h if callback is not None else ():
        callback(i, entry)
  if multi:  # several processes: every input a global array on the 'clients' mesh
    data, server, cstates, keys, bad = _global_inputs(p.mesh, data, server, cstates,
                                                      keys, bad)
  stops = set(p.schedule) | (set(range(checkpoint_every, p.rounds + 1, checkpoint_every))
                             if saving else set())
  prog = progress_lib.RunProgress(label or desc, p.rounds, enabled=progress,
                                  initial=start - 1, desc=desc, load_s=load_seconds,
                                  started=started)
  with prog:
    r = start
    while r <= p.rounds and not all(e is not None for e in reps.errors):
      first = r
      server, cstates, bad, train_loss, r = advance(
          round_fn, fused, server, cstates, data, keys, bad, first, p.rounds, stops,
          p.rounds_per_call)
      check = r in p.schedule or r % CHECK_EVERY == 0 or r > first  # reads the device
      synced = check
      if prog.compile_s is None or (not check and prog.due()):
        jax.block_until_ready(train_loss)  # compile_s / a line of finished rounds
        synced = True
        if prog.compile_s is None:
          prog.first_call_done()
      if check and reps.check(bad):
        break
      if r in p.schedule:
        losses = reps.flags(train_loss).astype(float)
        for i in range(reps.S):
          if reps.errors[i] is None:
            params = reps.params(server, i)
            if multi:  # the replicated global model, as local arrays for evaluation
              params = multihost.to_host(params)
            entry = {"round": r, "train_objective": float(losses[i])}
            if p.dp_epsilon is not None:  # client-level DP: epsilon spent so far
              entry["dp_epsilon"] = p.dp_epsilon(r)
            entry.update(evaluate_all(p.evaluate, params, reps.tasks[i], p.rep,
                                      p.predict_fn))
            if personal is not None:
              states = reps.client_state(round_fn.client_states() if hasattr(
                  round_fn, "client_states") else cstates, personal.name, i)
              entry.update(personal_metrics(
                  p.evaluate, personal, multihost.to_host(states) if multi else states,
                  reps.tasks[i]))
            reps.histories[i].append(entry)
            keep_selected(p.rep, reps.histories[i], params, reps.selected_params[i])
      if saving and r % checkpoint_every == 0 and r < p.rounds:
        state = reps.state(server, cstates)  # several processes: host copies, which
        checkpoint.save_checkpoint(checkpoint_dir,  # orbax writes from process 0 only
                                   multihost.to_host(state) if multi else state,
                                   reps.meta(r, bad))
      if r in p.schedule:
        for i in range(reps.S):
          if reps.errors[i] is None and callback is not None:
            callback(i, reps.histories[i][-1])
      evaluated = [reps.histories[i][-1] for i in range(reps.S)
                   if reps.errors[i] is None and r in p.schedule]
      prog.update(r, r - first + 1, progress_lib.mean_entry(evaluated), synced=synced)
      r += 1
  seconds = (time.perf_counter() - t0) / reps.S
  if multi:
    server = multihost.to_host(server)
  # the strategy as one name ('vmap+patches' for the patches form of the convolutions)
  return reps.results(p, server, strategy_lib.execution_name(round_fn), seconds, p.probe,
                      timing=prog.timing() if prog.compile_s is not None else None)


def _global_inputs(mesh, data, server, cstates, keys, bad):
  """A run over several processes (``fedjax-inv run --coordinator``): every process holds
  the same pool, states and keys (same task, same seed); they become global arrays on
  the ``clients`` mesh: the pool and the per-client states sharded by client when the
  pool divides evenly over the devices, else replicated; the server state, keys and
  divergence flag replicated (``fedjax_inv.core.multihost``; checked equal across
  processes)."""
  if mesh is None:
    raise ValueError("several processes need a 'clients' mesh over their devices.")
  even = data.n.shape[0] % mesh.devices.size == 0
  place = multihost.shard_clients if even else multihost.replicate
  data, cstates = place(data, mesh), place(cstates, mesh)
  server, keys, bad = multihost.replicate((server, keys, bad), mesh)
  return data, server, cstates, keys, bad
