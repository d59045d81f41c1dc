"""Many runs as one computation: S seeds of one algorithm on one task run as ONE
batched program, ``vmap`` over a leading replica axis ``[S, ...]`` of the server states,
per-client states and PRNG keys; the client data is shared (broadcast, not copied).

A research table is seeds × settings; on an accelerator S small runs batched keep the
device busy where each alone is bound by dispatch and synchronization. Results equal S
sequential :func:`fedjax_inv.runner.simulation.run` calls (``tests/test_replicas.py``);
``fedjax-inv bench --replicas`` measures batched vs sequential on the machine at hand.

What is shared and what is per replica:

* per replica: model initialization (``model.init(seed)``), the round's randomness
  (``jax.random.key(seed)`` folded with the round), the server/client states, the
  divergence flag, the history, the selected models;
* per replica, when given (``hparams=``): the traced hyperparameters of a sweep point
  (``client_lr``, ``server_lr`` and the components' ``traced`` coefficients such as
  FedProx's ``mu``, Fishr's ``fishr_lambda``, FedIIR's ``gamma``), carried as float32
  scalars in the server state (``extras[HPARAMS]``) like ``optax.inject_hyperparams``
  carries them in the optimizer state; ``fedjax_inv/runner/sweep.py`` builds such sweeps;
* shared: task, the algorithm's structure and its other hyperparameters (Python
  constants), cohort size, schedule.

Memory grows S-fold over one run: the engine's memory check is for one replica.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.runner import simulation
from fedjax_inv.core.algorithm import HPARAMS
from fedjax_inv.core.engine import init_state


def _stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def batched_round(round_fn, per_replica_data: bool = False):
  """``round_fn`` (``engine.build_round``) over a leading replica axis: ``vround(server
  [S, ...], client_states [S, ...], data, keys [S]) -> (server, client_states,
  metrics)`` with ``metrics['train_loss']: [S]``; ``data`` is shared, or stacked
  ``[S, N, n_max, ...]`` with ``per_replica_data`` (leave-one-domain-out: one held-out
  domain per replica); jitted, client states donated; has ``.jitted`` so
  :func:`simulation.build_fused_rounds` can fuse it."""
  vround = jax.jit(jax.vmap(round_fn.jitted,
                            in_axes=(0, 0, 0 if per_replica_data else None, 0)),
                   donate_argnums=(1,))
  vround.jitted = vround
  vround.strategy = round_fn.strategy
  vround.execution = strategy_lib.execution_name(round_fn)
  return vround


def stacked_state(algorithm, model, num_clients: int, seeds, hparams=None):
  """Initial server / per-client states and PRNG keys of the seeds, stacked on a leading
  replica axis ``[S, ...]`` (each replica as ``simulation.run(seed=s)`` starts it).
  ``hparams``: optional list (one per replica) of ``{name: value}`` traced
  hyperparameters, stored as float32 scalars in ``server.extras[HPARAMS]``."""
  states = [init_state(algorithm, model.init(s), num_clients) for s in seeds]
  if hparams is not None:
    for (server, _), hp in zip(states, hparams):
      server.extras[HPARAMS] = {k: jnp.float32(v) for k, v in sorted(hp.items())}
  return (_stack([st[0] for st in states]), _stack([st[1] for st in states]),
          jnp.stack([jax.random.key(s) for s in seeds]))


def run_replicas(task, algorithm, *, seeds, rounds: int,
                 clients_per_round: int | None = None, execution: str = "auto",
                 chunk_size: int | None = None, eval_every: int | None = None,
                 progress: bool = True, shard: bool = True, callback=None,
                 reporting="auto", rounds_per_call: int = 1, hparams=None,
                 tasks=None, checkpoint_dir=None, checkpoint_every: int | None = None,
                 label: str | None = None, load_seconds: float | None = None,
                 precision: str = "highest") -> list:
  """Runs ``algorithm`` on ``task`` once per seed, all seeds batched in one program.

  Args:
    task, algorithm, rounds, clients_per_round, execution, chunk_size, eval_every,
      shard, reporting, rounds_per_call: as :func:`fedjax_inv.runner.simulation.run`
      (shared by every replica).
    seeds: the replicas' seeds (S >= 1 distinct integers); replica ``i`` equals
      ``simulation.run(..., seed=seeds[i])``.
    progress: the batch's progress on stderr, as :func:`fedjax_inv.runner.simulation.run`'s
      (one bar in a terminal, else plain lines with the metrics averaged over the
      replicas).
    label: the batch's name on progress lines (default ``'<algorithm> seeds 0,1,...'``,
      or ``'<algorithm> ×S replicas'`` with ``hparams`` or ``tasks``).
    load_seconds: seconds the caller spent building the task(s), for the first progress
      line and ``RunResult.timing['load_s']``; None = unknown.
    callback: ``callback(seed, entry)`` with each replica's history entries, or
      ``callback(i, entry)`` (replica index) when ``hparams`` or ``tasks`` is given.
    hparams: optional list of S dicts ``{name: number}``, replica ``i``'s traced
      hyperparameters (a sweep point; names of ``algorithm.traced``, every dict with
      the same names; each replica's value replaces the built one). Seeds may repeat
      across different points.
    tasks: optional list of S tasks; replica ``i`` trains and is evaluated on
      ``tasks[i]`` (e.g. the held-out domains of a leave-one-domain-out sweep); their
      data must have equal shapes (checked, :func:`check_same_shapes`; ``task`` is then
      ignored and may be None). Seeds may repeat across tasks.
    checkpoint_dir, checkpoint_every: as :func:`fedjax_inv.runner.simulation.run`, for the whole
      batch (one checkpoint holds every replica; resuming needs the same replicas).
    precision: as :func:`fedjax_inv.runner.simulation.run` ('highest' by default).

  Returns:
    a list with one item per seed, in order: a ``RunResult`` (its ``seconds`` is the
    batch's wall time divided by S), or a ``simulation.DivergedError`` for a replica
    whose train objective became non-finite (the others go on; a diverged replica's
    NaNs stay in its own slice of the batch).

  Raises:
    ValueError: no seeds, a repeated (seed, hparams) replica, ``hparams`` of another
      length than ``seeds``, names that differ between replicas or that nothing reads,
      and everything :func:`simulation.run` refuses — before compiling.
  """
  with simulation.matmul_precision(precision):
    from fedjax_inv.runner import progress as progress_lib
    started = progress_lib.clock()
    seeds = [int(s) for s in seeds]
    # a batch of replicas trains on the device pool (a packed pool is padded there)
    task = simulation.resolve_pool(task, "device")[0]
    if tasks is not None:
      tasks = [simulation.resolve_pool(t, "device")[0] for t in tasks]
      if len(tasks) != len(seeds):
        raise ValueError(f"tasks has {len(tasks)} entries for {len(seeds)} seeds; give one "
                         "task per replica.")
      check_same_shapes(tasks)
      task = tasks[0]
    # a replica is (seed, task): the same task object twice with one seed is a repeat
    distinct = [(s, id(t)) for s, t in zip(seeds, tasks or [None] * len(seeds))]
    if hparams is not None:
      _check_hparams(algorithm, seeds, hparams)
      keys_ = [(s, tuple(sorted(h.items())), t) for (s, t), h in zip(distinct, hparams)]
      if len(set(keys_)) != len(keys_):
        raise ValueError(f"replicas {[k[:2] for k in keys_]}: a (seed, hyperparameters) "
                         "pair is repeated (on the same task).")
    elif not seeds or len(set(distinct)) != len(distinct):
      raise ValueError(f"seeds={seeds}; give one or more distinct integer seeds (per task).")
    simulation.check_checkpoint_every(checkpoint_every)
    p = simulation.prepare(task, algorithm, rounds, clients_per_round, execution,
                           chunk_size, eval_every, shard, reporting, rounds_per_call,
                           measure=False)  # one batched program: the fixed rule
    vround = batched_round(p.round_fn, per_replica_data=tasks is not None)
    data = task.train if tasks is None else _stack([t.train for t in tasks])
    server, cstates, keys = stacked_state(algorithm, p.model, p.num_clients, seeds, hparams)
    key = (lambda i: i) if hparams is not None or tasks is not None else seeds.__getitem__
    out = simulation.train_loop(
        p, vround, data, server, cstates, keys, tasks=tasks or [task] * len(seeds),
        algorithm=algorithm, batched=True, progress=progress,
        desc=f"{algorithm.name} on {task.name} ×{len(seeds)} seeds",
        callback=None if callback is None else lambda i, e: callback(key(i), e),
        checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
        label=label or (f"{algorithm.name} seeds {','.join(map(str, seeds))}"
                        if hparams is None and tasks is None
                        else f"{algorithm.name} ×{len(seeds)} replicas"),
        load_seconds=load_seconds, started=started)
    for r in out:
      if isinstance(r, simulation.RunResult):
        r.precision = precision
    return out


def _check_hparams(algorithm, seeds, hparams) -> None:
  """Refuses traced hyperparameters that nothing would read (a silent no-op sweep)."""
  import math
  if not seeds or len(hparams) != len(seeds):
    raise ValueError(f"hparams has {len(hparams)} entries for {len(seeds)} seeds; give one "
                     "dict per replica.")
  names = set(hparams[0])
  readable = set(algorithm.traced)
  for h in hparams:
    if set(h) != names:
      raise ValueError(f"hparams {sorted(h)} vs {sorted(names)}: every replica must trace "
                       "the same names.")
    for k, v in h.items():
      if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"hparams {k}={v!r}: a traced hyperparameter must be a finite "
                         "number.")
  unread = sorted(names - readable)
  if unread:
    raise ValueError(f"hparams {unread}: {algorithm.name} does not read them as traced "
                     f"values (traceable: {sorted(readable)}); run those points one after "
                     "another (fedjax_inv.runner.sweep does).")


def _shapes(task) -> tuple:
  def one(d):
    return tuple((tuple(a.shape), str(a.dtype)) for a in (d.x, d.y, d.n))
  return (task.kind, one(task.train),
          tuple((k, one(v)) for k, v in sorted(task.eval_sets.items())))


def check_same_shapes(tasks) -> None:
  """Raises ValueError unless every task has the same kind, training-data shapes and
  evaluation sets (names and shapes): the condition for stacking them on a replica axis.
  The message names the first task that differs (run them one after another instead)."""
  ref = _shapes(tasks[0])
  for i, t in enumerate(tasks[1:], 1):
    if _shapes(t) != ref:
      raise ValueError(
          f"tasks[{i}] (holdout {t.info.get('holdout', '?')!r}) has other data shapes than "
          f"tasks[0] (holdout {tasks[0].info.get('holdout', '?')!r}): train x "
          f"{tuple(t.train.x.shape)} vs {tuple(tasks[0].train.x.shape)}; batched replicas "
          "need equal shapes (equal-sized domains), so run them one after another.")
