"""Run-level throughput of ``fedjax-inv bench --replicas S`` / ``--fused R``:
S seeds batched as one program vs S sequential runs, and R rounds per device call vs one
call per round, timed in the steady state (after compiling)."""
from __future__ import annotations

import time

from .workloads import Workload, synthetic_pool


def _steady_seconds(step, state, calls: int) -> float:
  """Seconds per call of ``state = step(state)`` after one untimed (compiling) call."""
  import jax
  state = step(state)
  jax.block_until_ready(state)
  t = time.perf_counter()
  for _ in range(calls):
    state = step(state)
  jax.block_until_ready(state)
  return (time.perf_counter() - t) / calls


def measure_runs(workload: Workload, C: int, *, replicas: int = 0, fused: int = 0,
                 rounds: int = 20, log=lambda s: None) -> list[dict]:
  """Run-level throughput on synthetic MNIST-shaped clients (pool N = C),
  timing the engine's jitted calls after compiling (steady state):

  * ``replicas=S``: one round of S seeds as one vmapped call
    (``replicas.batched_round``) vs S single-seed round calls; rows
    ``replicas_sequential_xS`` / ``replicas_batched_xS`` (ms per round of all S runs),
    ``speedup`` = sequential / batched.
  * ``fused=R``: ``R`` rounds in one call (``simulation.build_fused_rounds``) vs one call
    per round; rows ``per_round_call`` / ``fused_R`` (ms per round), ``speedup`` =
    per-round / fused.

  ``rounds``: rounds timed per row. Returns rows ``{workload, clients, impl,
  ms_per_round, speedup}``.

  Raises:
    ValueError: ``replicas`` or ``fused`` below 0, ``rounds`` < 1.
  """
  import jax
  import jax.numpy as jnp
  from fedjax_inv.runner import simulation
  from fedjax_inv.core.engine import init_state
  from fedjax_inv.runner.replicas import batched_round, stacked_state
  from fedjax_inv.tasks import Task
  if replicas < 0 or fused < 0 or rounds < 1:
    raise ValueError(f"replicas={replicas}, fused={fused}, rounds={rounds}: use "
                     "replicas/fused >= 0 and rounds >= 1.")
  model = workload.make_model()
  alg, _ = workload.make_algorithm()
  task = Task(f"bench_{workload.name}", "multiclass",
              synthetic_pool(C, workload.n_per_client, tuple(workload.feature_shape)), {},
              model, {})
  p = simulation.prepare(task, alg, rounds, None, "auto", None, None, True, None,
                         max(1, fused))
  data, key = task.train, jax.random.key(0)
  rows = []

  def row(impl, sec, speedup=None):
    log(f"  {workload.name} C={C} {impl}: {1e3 * sec:.1f} ms/round"
        + ("" if speedup is None else f" (x{speedup:.2f})"))
    rows.append(dict(workload=workload.name, clients=C, impl=impl, ms_per_round=1e3 * sec,
                     speedup=speedup))

  def one_round(st):
    s, c = st
    s, c, _ = p.round_fn(s, c, data, key)
    return s, c
  per = _steady_seconds(one_round, init_state(alg, p.model.init(0), C), rounds)
  if replicas:
    S = replicas
    vround = batched_round(p.round_fn)
    server, cstates, keys = stacked_state(alg, p.model, C, range(S))

    def batched(st):
      s, c = st
      s, c, _ = vround(s, c, data, keys)
      return s, c
    bat = _steady_seconds(batched, (server, cstates), rounds)
    row(f"replicas_sequential_x{S}", S * per)
    row(f"replicas_batched_x{S}", bat, S * per / bat)
  if fused:
    bad = jnp.zeros((), jnp.int32)
    run_fused = simulation.build_fused_rounds(p.round_fn)

    def fused_call(st):
      s, c = st
      s, c, _, _ = run_fused(s, c, data, key, bad, 1, fused)
      return s, c
    fus = _steady_seconds(fused_call, init_state(alg, p.model.init(0), C),
                          max(1, rounds // fused)) / fused
    row("per_round_call", per)
    row(f"fused_{fused}", fus, per / fus)
  return rows
