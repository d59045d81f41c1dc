"""The training loop: rounds of the jitted engine, periodic on-device evaluation."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import numpy as np

from fedjax_inv.core.engine import build_round, client_mesh, init_state
from fedjax_inv.eval import build_evaluator, summarize


@dataclasses.dataclass
class RunResult:
  """``history``: one dict per evaluated round (``round`` 1-based, ``train_loss`` = mean
  local objective of that round, ``<set>_accuracy`` / ``<set>_loss`` for ``train`` and
  every evaluation set); ``final``: the last entry; ``params``: final global model;
  ``strategy``: resolved execution strategy; ``seconds``: wall time of the rounds."""
  history: list
  final: dict
  params: Any
  server_state: Any
  strategy: str
  seconds: float


def evaluate_all(evaluate, params, task) -> dict:
  """Pooled metrics for the training clients (``train_*``) and each evaluation set."""
  out = summarize(evaluate(params, task.train), "train")
  for name, data in task.eval_sets.items():
    out.update(summarize(evaluate(params, data), name))
  return out


def run(task, algorithm, *, rounds: int, clients_per_round: int | None = None,
        seed: int = 0, execution: str = "auto", chunk_size: int | None = None,
        eval_every: int | None = None, progress: bool = True, shard: bool = True,
        callback: Callable[[dict], None] | None = None) -> RunResult:
  """Trains ``algorithm`` on ``task`` for ``rounds`` rounds.

  Args:
    task: a ``Task`` (``fedjax_inv.tasks``) or any object with ``train``, ``eval_sets``,
      ``model``, ``kind``.
    algorithm: an ``Algorithm`` (``fedjax_inv.algorithms.make_algorithm``).
    rounds: number of rounds (>= 1).
    clients_per_round: cohort size C (default: all training clients).
    seed: initializes the model (``seed``) and drives sampling/minibatches; the same seed
      gives bit-identical metrics on the same machine.
    execution: 'auto' | 'vmap' | 'scan' | 'chunked'.
    eval_every: evaluate every this many rounds (default ``max(1, rounds // 20)``); the
      last round is always evaluated.
    shard: shard the client axis over all devices when more than one is present.
    callback: called with each history entry.

  Raises:
    ValueError: ``rounds < 1``, bad cohort, bad strategy (before compiling).
  """
  if rounds < 1:
    raise ValueError(f"rounds={rounds}; it must be >= 1.")
  num_clients = task.train.num_clients
  cohort = clients_per_round or num_clients
  eval_every = eval_every or max(1, rounds // 20)
  if eval_every < 1:
    raise ValueError(f"eval_every={eval_every}; it must be >= 1.")
  mesh = client_mesh() if shard else None
  model = algorithm.model_for(task.model)
  round_fn = build_round(model, task.kind, algorithm, num_clients, cohort,
                         execution=execution, chunk_size=chunk_size, mesh=mesh,
                         feature_shape=task.train.feature_shape, n_max=task.train.n_max)
  evaluate = build_evaluator(model, task.kind, algorithm)
  params = model.init(seed)
  server, cstates = init_state(algorithm, params, num_clients)
  key = jax.random.key(seed)
  history = []
  bar = None
  if progress:
    from tqdm.auto import tqdm
    bar = tqdm(total=rounds, desc=f"{algorithm.name} on {task.name}", unit="round",
               leave=False)
  t0 = time.perf_counter()
  try:
    for r in range(1, rounds + 1):
      server, cstates, metrics = round_fn(server, cstates, task.train, key)
      if r % eval_every == 0 or r == rounds:
        entry = {"round": r, "train_objective": float(metrics["train_loss"])}
        entry.update(evaluate_all(evaluate, server.params, task))
        history.append(entry)
        if callback is not None:
          callback(entry)
        if bar is not None:
          post = {k.replace("_accuracy", "_acc"): f"{v:.3f}" for k, v in entry.items()
                  if k.endswith("_accuracy") and "worst" not in k}
          bar.set_postfix(post)
      if bar is not None:
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
  seconds = time.perf_counter() - t0
  if not np.isfinite(history[-1]["train_objective"]):
    raise FloatingPointError(
        f"training diverged (train objective {history[-1]['train_objective']}) for "
        f"{algorithm.name}; lower the learning rates.")
  return RunResult(history, history[-1], server.params, server, round_fn.strategy, seconds)
