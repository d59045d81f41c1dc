"""Timing one configuration of ``fedjax-inv bench`` (a workload × cohort ``C``, pool
``N = C``): every implementation in turn, in this process and one at a time, one JSON row
each (:func:`run_config`).

A row's fields: steady-state round time (median after warm-up, min–max), client updates
per second (``C / median``), compile time, ``ratio_vs_loop``, FLOPs per round
(``flops.count_flops``) and achieved FLOP/s against the measured peak, XLA's FLOPs for
one local step × ``K`` × ``C``, and memory: the analytic estimate (``core.memory``),
XLA's ``memory_analysis()`` of the compiled round, the process's peak-RSS increase
while the round ran (``rss``) and, on an accelerator, the device allocator's peak
(``device_peak_mb``: ``jax.devices()[0].memory_stats()['peak_bytes_in_use']`` after the
row's timed rounds, the peak of the whole process so far, since JAX cannot reset it;
``device_peak_exact`` is True when the row raised it, i.e. the value is the row's own
peak, False when it is only an upper bound; ``device_in_use_mb``: bytes in use after the
row). At each ``C`` the implementation ``auto`` resolves to is timed first, so its row
raises the peak whenever its ``C`` needs more than the smaller ones did.

All timings use ``time.perf_counter`` around a call followed by ``jax.block_until_ready``.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from typing import Any, Callable

from .flops import count_flops, loop_flops, xla_flops_local
from .loop_round import build_loop_round
from .rss import peak_rss_bytes, reset_peak_rss, rss_bytes
from .summary import add_ratios_vs_loop
from .workloads import IMPLS, Workload, synthetic_pool


def _timed_rounds(call: Callable, state, warmup: int, rounds: int, budget_s: float):
  """Runs ``state = call(state)`` ``warmup`` times, then up to ``rounds`` timed calls
  (at least 2, fewer than ``rounds`` when they would exceed ``budget_s``)."""
  import jax
  first = None
  for _ in range(warmup):
    t0 = time.perf_counter()
    state = call(state)
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
  if first and rounds > 2:
    rounds = max(2, min(rounds, int(budget_s / max(first, 1e-9))))
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    state = call(state)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return state, times


def _mb(b) -> float | None:
  return None if b is None else round(b / 2 ** 20, 1)


def _shape_kw(workload: Workload) -> dict:
  """``feature_shape=`` and ``n_max=`` (the workload's) for ``build_round`` when the
  engine accepts them (its 'auto' then inspects the model and the memory, as in a real
  run)."""
  import inspect
  from fedjax_inv.core import engine
  if "n_max" in inspect.signature(engine.build_round).parameters:
    return dict(feature_shape=tuple(workload.feature_shape), n_max=workload.n_per_client)
  return {}


def _resolve_auto(model, kind, algorithm, C, workload: Workload) -> tuple[str, int | None]:
  """``(strategy, chunk size or None)`` that ``execution='auto'`` resolves to for this
  model and cohort."""
  from fedjax_inv.core import engine
  rf = engine.build_round(model, kind, algorithm, C, C, execution="auto",
                          **_shape_kw(workload))
  return rf.strategy, getattr(rf, "chunk_size", None)


def _device_memory() -> tuple[int | None, int | None]:
  """``(peak_bytes_in_use, bytes_in_use)`` of the first JAX device (None, None where the
  backend keeps no statistics, e.g. the CPU)."""
  import jax
  try:
    st = jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001 - a backend without statistics
    st = {}
  return st.get("peak_bytes_in_use"), st.get("bytes_in_use")


def _row(workload: Workload, C: int, impl: str, **kw) -> dict:
  row = dict(source="fedjax_inv", workload=workload.name, model=workload.model,
             algorithm=workload.algorithm, clients=C, pool=C, impl=impl, strategy=None,
             chunk_size=None, rounds_timed=0, round_s=None, round_s_min=None,
             round_s_max=None, client_updates_per_s=None, compile_s=None,
             ratio_vs_loop=None, gflop_per_round=None, gflops=None, pct_of_peak=None,
             xla_gflop_per_round=None, mem_estimate_mb=None, xla_temp_mb=None,
             xla_arg_mb=None, xla_out_mb=None, rss_peak_delta_mb=None, device_peak_mb=None,
             device_peak_exact=None, device_in_use_mb=None, note="")
  row.update(kw)
  return row


@dataclasses.dataclass
class _Setup:
  """What the implementations of one configuration share: the models, the algorithm,
  the synthetic pool, the (steady) start state, and the FLOP counts computed once."""
  workload: Workload
  C: int
  task_model: Any
  model: Any
  algorithm: Any
  alg_note: str
  capacity: int
  kind: str = "multiclass"
  data: Any = None
  key: Any = None
  start_state: tuple = ()
  ndev: int = 1
  flops_cache: dict = dataclasses.field(default_factory=dict)
  xla_local: float | None = None


def _start_state(s: _Setup) -> None:
  """Fills ``s.data``, ``s.key``, ``s.start_state`` and ``s.ndev``. When the algorithm's
  server state changes pytree structure after round 1, the start state is round 1's
  output (the steady state) and ``s.alg_note`` says so."""
  import jax
  from fedjax_inv.core import engine
  C, model, algorithm, kind = s.C, s.model, s.algorithm, s.kind
  w = s.workload
  s.data = data = synthetic_pool(C, w.n_per_client, tuple(w.feature_shape))
  params = model.init(0)
  s.key = key = jax.random.key(0)
  start_state = engine.init_state(algorithm, params, C)
  shape_in = jax.tree.structure(start_state[0])
  shape_out = jax.tree.structure(jax.eval_shape(
      engine.build_round(model, kind, algorithm, C, C, execution="scan").jitted,
      *start_state, data, key)[0])
  if shape_in != shape_out:
    # The algorithm's server state changes structure after round 1 (its round would
    # compile twice in a training run): time the steady state, and say so.
    rf0 = engine.build_round(model, kind, algorithm, C, C, execution="scan")
    start_state = rf0(*start_state, data, key)[:2]
    s.alg_note = ((s.alg_note + "; ") if s.alg_note else "") + (
        "server state changes pytree structure after round 1 (compiles twice); timed "
        "from round 2")
  s.start_state = start_state
  s.ndev = jax.device_count()


def _predicted_too_slow(s: _Setup, impl: str, history: dict, warmup: int, rounds: int,
                        max_impl_s: float) -> str | None:
  """The skip note when ``impl``'s time predicted (linear in ``C``) from its earlier row
  in ``history`` for the warm-up and timed rounds exceeds ``max_impl_s``, else None."""
  prev = history.get((s.workload.name, impl))
  if not prev:
    return None
  c0, t0 = prev
  pred = t0 * s.C / c0 * (warmup + min(rounds, 3))
  if pred > max_impl_s:
    return (f"skipped: predicted {pred:.0f} s for {warmup}+{min(rounds, 3)} rounds "
            f"(from {t0:.3g} s/round at C={c0}) > --max-impl-s {max_impl_s:.0f}")
  return None


def _while_trips(s: _Setup) -> int:
  """Trip count of the clients' ``while_loop`` for the FLOP count: the local steps of a
  ``local_epochs`` recipe (every synthetic client has ``n_per_client`` examples), else 1
  (no such loop)."""
  from fedjax_inv.core.client import max_client_steps
  if getattr(s.algorithm, "local_epochs", None) is None:
    return 1
  return max_client_steps(s.algorithm, s.workload.n_per_client)


def _compile_impl(s: _Setup, impl: str, strategy: str, mesh, chunk_size, server, cstates):
  """Builds and compiles ``impl``'s round. Returns ``(rf, compile_s, call, memory
  analysis, FLOPs per round, chunk size or None)`` with ``call(state) -> state`` one
  round of ``state = (server, client_states)``."""
  import jax
  from fedjax_inv.core import engine
  from fedjax_inv.core import strategy as strategy_lib
  C, data, key = s.C, s.data, s.key
  if impl == "loop":
    rf = build_loop_round(s.model, s.kind, s.algorithm, C, C)
    compile_s = rf.compile(server, cstates, data, key)
    call = lambda st, rf=rf, d=data: rf(st[0], st[1], d, key)[:2]  # noqa: E731
    return (rf, compile_s, call, rf.client_memory(),
            loop_flops(rf, server, cstates, data, key, _while_trips(s)), None)
  dat = data
  if mesh is not None and C % s.ndev == 0:
    from jax.sharding import NamedSharding, PartitionSpec as P
    dat = jax.device_put(data, NamedSharding(mesh, P("clients")))
  rf = engine.build_round(s.model, s.kind, s.algorithm, C, C, execution=strategy,
                          chunk_size=chunk_size, mesh=mesh, **_shape_kw(s.workload))
  t0 = time.perf_counter()
  compiled = rf.jitted.lower(server, cstates, dat, key).compile()
  compile_s = time.perf_counter() - t0
  call = lambda st, c=compiled, d=dat: c(st[0], st[1], d, key)[:2]  # noqa: E731
  if "engine" not in s.flops_cache:
    s.flops_cache["engine"] = count_flops(rf.jitted, server, cstates, dat, key,
                                          while_trips=_while_trips(s))
  chunk = (strategy_lib.largest_divisor_at_most(C, chunk_size or min(C, 64))
           if strategy.startswith("chunked") else None)
  return rf, compile_s, call, compiled.memory_analysis(), s.flops_cache["engine"], chunk


def _time_impl(s: _Setup, impl: str, strategy: str, sharded: bool, *, chunk_size,
               fraction: float, warmup: int, rounds: int, budget_s: float,
               peak_flops: float | None, history: dict, log) -> tuple[dict, bool]:
  """Times one implementation: the memory estimate (a skip row when it does not fit),
  compile, warm-up and timed rounds. Returns ``(row, timed)``; ``timed`` is False for a
  skip or error row (an exception is reported in the row's note, never raised)."""
  import jax
  from fedjax_inv.core import engine, memory
  workload, C = s.workload, s.C
  mesh = engine.client_mesh() if sharded else None
  nd = s.ndev if sharded else 1
  est = None
  if strategy != "loop":
    try:
      est = memory.check_fits(s.task_model, s.algorithm, C, workload.n_per_client,
                              tuple(workload.feature_shape), strategy, chunk_size,
                              num_devices=nd,
                              capacity_bytes=s.capacity, fraction=fraction)
    except memory.DoesNotFitError as e:
      return _row(workload, C, impl, strategy=strategy,
                  note=f"skipped (memory estimate): {e}"), False
  log(f"  {workload.name:22s} C={C:<6d} {impl:8s} ...")
  gc.collect()
  server, cstates = jax.tree.map(lambda a: a.copy() if hasattr(a, "copy") else a,
                                 s.start_state)
  dev_peak0, _ = _device_memory()
  try:
    rf, compile_s, call, ma, flops, chunk = _compile_impl(s, impl, strategy, mesh,
                                                          chunk_size, server, cstates)
    if s.xla_local is None:
      s.xla_local = xla_flops_local(s.model, s.kind, s.algorithm, s.data, server) or 0.0
    rss0 = rss_bytes()
    reset_peak_rss()
    _, times = _timed_rounds(call, (server, cstates), warmup, rounds, budget_s)
    peak = peak_rss_bytes()
    dev_peak, dev_in_use = _device_memory()
  except Exception as e:  # report and go on: one failing impl must not stop the bench
    return _row(workload, C, impl, strategy=strategy,
                note=f"error: {type(e).__name__}: {str(e)[:300]}"), False
  med = statistics.median(times)
  history[(workload.name, impl)] = (C, med)
  xla_local = s.xla_local
  row = _row(
      workload, C, impl, strategy=strategy, chunk_size=chunk, rounds_timed=len(times),
      round_s=med, round_s_min=min(times), round_s_max=max(times),
      client_updates_per_s=C / med, compile_s=compile_s,
      gflop_per_round=flops / 1e9, gflops=flops / med / 1e9,
      pct_of_peak=(100.0 * flops / med / peak_flops) if peak_flops else None,
      xla_gflop_per_round=(xla_local * C / 1e9) if xla_local else None,
      mem_estimate_mb=_mb(est),
      xla_temp_mb=_mb(getattr(ma, "temp_size_in_bytes", None)),
      xla_arg_mb=_mb(getattr(ma, "argument_size_in_bytes", None)),
      xla_out_mb=_mb(getattr(ma, "output_size_in_bytes", None)),
      rss_peak_delta_mb=_mb((peak - rss0) if (peak is not None and rss0) else None),
      device_peak_mb=_mb(dev_peak), device_in_use_mb=_mb(dev_in_use),
      device_peak_exact=(None if dev_peak is None or dev_peak0 is None
                         else bool(dev_peak > dev_peak0)),
      note=s.alg_note)
  if impl == "loop":
    row["note"] = ("jit(single-client update) + Python loop; memory columns are one "
                   "client's" + (f"; {s.alg_note}" if s.alg_note else ""))
  if impl == "sharded":
    row["note"] = f"vmap over a {s.ndev}-device 'clients' mesh"
  del rf, call
  return row, True


def run_config(workload: Workload, C: int, impls: list[str], *, warmup: int, rounds: int,
               budget_s: float, peak_flops: float | None, chunk_size: int | None,
               history: dict, max_impl_s: float, fraction: float = 0.8,
               log=print) -> list[dict]:
  """Times every implementation in ``impls`` on one workload with cohort ``C`` (pool
  ``N = C``). Returns one row per implementation (skipped ones carry a ``note``).

  ``history`` maps ``(workload, impl) -> (C, median round seconds)`` of earlier rows and is
  used to skip an implementation whose predicted time (linear in ``C``) for the warm-up
  and timed rounds exceeds ``max_impl_s``.
  """
  from fedjax_inv.core import memory
  from fedjax_inv.core import strategy as strategy_lib

  task_model = workload.make_model()
  algorithm, alg_note = workload.make_algorithm()
  s = _Setup(workload, C, task_model, algorithm.model_for(task_model), algorithm,
             alg_note, memory.device_memory_bytes())
  pool_bytes = C * workload.n_per_client * (math.prod(workload.feature_shape) + 1) * 4
  if pool_bytes > 0.35 * s.capacity:
    return [_row(workload, C, i, note=f"skipped: the pool alone is {_mb(pool_bytes)} MB "
                 f"(> 35% of {_mb(s.capacity)} MB device memory)") for i in impls]
  _start_state(s)
  rows = []
  resolved_auto, auto_chunk = _resolve_auto(s.model, s.kind, algorithm, C, workload)
  # With several devices the engine's users get 'vmap' sharded over the clients mesh.
  auto_impl = "sharded" if s.ndev > 1 and resolved_auto == "vmap" else resolved_auto
  order = [i for i in impls if i != "auto"]
  from fedjax_inv.core.strategy import largest_divisor_at_most
  other_chunk = (auto_impl == "chunked" and auto_chunk
                 != largest_divisor_at_most(C, chunk_size or min(C, 64)))
  if "auto" in impls and (auto_impl not in order or other_chunk):
    order.append("auto")  # timed on its own unless a fixed row compiles the same round
  # What `auto` runs goes first: its row then raises the device's peak memory (which JAX
  # cannot reset) whenever this C needs more than the earlier rows did.
  first = ("auto" if "auto" in order else
           auto_impl if "auto" in impls and auto_impl in order else None)
  if first:
    order.remove(first)
    order.insert(0, first)
  measured: dict = {}
  for impl in order:
    if impl.endswith(strategy_lib.PATCHES) and not memory.uses_convolution(
        s.model, tuple(workload.feature_shape)):
      rows.append(_row(workload, C, impl, note="skipped: the model has no convolution, "
                       "so the patches form is the same round as without it"))
      continue
    if impl == "sharded" and s.ndev < 2:
      rows.append(_row(workload, C, impl, note=f"skipped: {s.ndev} device (sharding needs "
                       "several; try --host-devices 8 on CPU)"))
      continue
    slow = _predicted_too_slow(s, impl, history, warmup, rounds, max_impl_s)
    if slow:
      rows.append(_row(workload, C, impl, note=slow))
      continue
    strategy = {"loop": "loop", "auto": resolved_auto, "sharded": "vmap"}.get(impl, impl)
    sharded = impl == "sharded" or (impl == "auto" and auto_impl == "sharded")
    chunk = auto_chunk if impl == "auto" and auto_chunk is not None else chunk_size
    row, timed = _time_impl(s, impl, strategy, sharded, chunk_size=chunk,
                            fraction=fraction, warmup=warmup, rounds=rounds,
                            budget_s=budget_s, peak_flops=peak_flops, history=history,
                            log=log)
    rows.append(row)
    if timed:
      measured[impl if impl in ("auto", "sharded") else strategy] = row
  if "auto" in impls and "auto" not in measured:
    src = measured.get(auto_impl)
    if src is not None:
      rows.append(dict(src, impl="auto", note=f"auto -> {auto_impl}: the same "
                       f"compiled round as the '{auto_impl}' row"))
    else:
      rows.append(_row(workload, C, "auto", strategy=resolved_auto,
                       note=f"auto -> {auto_impl}, which was skipped"))
  add_ratios_vs_loop(rows)
  rank = {i: k for k, i in enumerate(IMPLS)}
  rows.sort(key=lambda r: rank.get(r["impl"], 99))
  del s
  gc.collect()
  return rows
