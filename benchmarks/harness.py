"""The benchmark harness behind ``fedjax-inv bench`` (``fedjax_inv.benchmarks.harness``):
throughput of one federated round, side by side.

For each configuration (workload × cohort size ``C``), in one process and one at a time,
the harness times:

* ``loop`` — the baseline (ratio 1.00): FedJAX's "jit backend" design (FedJAX
  ``for_each_client``): the single-client update is jit-compiled once and a Python loop
  runs it client after client, accumulating the aggregator's sums on device
  (``loop_round.LoopRound``; same protocol, same randomness, same numbers as the engine);
* this engine (``core.engine.build_round``) under each execution strategy: ``auto``,
  ``vmap``, ``scan``, ``chunked`` and ``sharded`` (``vmap`` over a ``clients`` mesh, only
  when several devices exist);
* optionally the peers (``--peers``): FedJAX 0.0.17, DrJAX and PyTorch in their own
  environment (``benchmarks/peers/setup.sh``), pfl-research 0.6.0 (PyTorch backend, MLP
  and ConvNet) in another (``benchmarks/peers/setup_pfl.sh``) and Flower 1.42 (Ray
  simulation backend, PyTorch, MLP and ConvNet) in a third
  (``benchmarks/peers/setup_flower.sh``), merged by workload and ``C``.

Reported per row: steady-state round time (median after warm-up, min–max), client
updates per second (``C / median``), compile time, ``ratio_vs_loop`` (loop median / row
median: > 1 is faster than the loop), FLOPs per round (counted from the round's jaxpr with
loop trip counts, ``flops.count_flops``; XLA's ``cost_analysis()`` counts a loop body once,
so it is reported separately for one local step × ``K`` × ``C``), achieved FLOP/s against
the machine's measured f32 matmul peak (``flops.measure_matmul_peak``), and memory: the
analytic estimate (``core.memory``), XLA's ``memory_analysis()`` of the compiled round and
the process's peak-RSS increase while the round ran.

This module is the command line and the orchestration (``add_parser``, ``cmd_bench``);
the pieces live beside it in ``fedjax_inv.benchmarks`` and are re-exported here:
``workloads`` (workloads, synthetic clients, the QUICK/FULL plans), ``loop_round`` (the
baseline), ``timing`` (``run_config``: one configuration), ``flops`` (FLOP counting,
matmul peaks), ``rss`` (resident memory), ``runs`` (``--replicas`` / ``--fused``),
``peers`` (the peer simulators), ``summary`` (``ratio_vs_loop``, the targets) and
``plots`` (the text table, the PNG).

All timings use ``time.perf_counter`` around a call followed by ``jax.block_until_ready``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

from fedjax_inv.runner.config import PRECISIONS

# The pieces, re-exported (``__all__``) for the harness's callers: notebooks, scripts.
from .flops import (count_flops, loop_flops, measure_matmul_peak, measure_shape_peak,
                    mlp_step_shapes)
from .loop_round import LoopRound, build_loop_round
from .peers import PEERS_DIR, merge_peers, run_all_peers, run_peers
from .plots import fmt, format_table, plot_throughput
from .rss import peak_rss_bytes, reset_peak_rss, rss_bytes
from .runs import measure_runs
from .summary import add_ratios_vs_loop, summarize
from .timing import run_config
from .workloads import (CLIENT_COUNTS, ENGINE_IMPLS, EXAMPLES_PER_CLIENT, FEATURE_SHAPE,
                        FULL, HEAVY_ALGORITHMS, IMPLS, LOCAL, NUM_CLASSES, QUICK, Workload,
                        synthetic_pool, workloads)

__all__ = [
    # the command line (this module)
    "add_parser", "cmd_bench", "machine_info",
    # workloads.py
    "CLIENT_COUNTS", "ENGINE_IMPLS", "EXAMPLES_PER_CLIENT", "FEATURE_SHAPE", "FULL",
    "HEAVY_ALGORITHMS", "IMPLS", "LOCAL", "NUM_CLASSES", "QUICK", "Workload",
    "synthetic_pool", "workloads",
    # loop_round.py, timing.py, runs.py
    "LoopRound", "build_loop_round", "run_config", "measure_runs",
    # flops.py, rss.py
    "count_flops", "loop_flops", "measure_matmul_peak", "measure_shape_peak",
    "mlp_step_shapes", "peak_rss_bytes", "reset_peak_rss", "rss_bytes",
    # peers.py, summary.py, plots.py
    "PEERS_DIR", "merge_peers", "run_all_peers", "run_peers", "add_ratios_vs_loop",
    "summarize", "fmt", "format_table", "plot_throughput",
]


def machine_info() -> dict:
  """CPU model and core count (``lscpu``), platform, JAX version and devices, and the XLA
  flags in effect (``cpu_flags``: what ``fedjax_inv.core.xla_cpu`` added)."""
  import jax
  from fedjax_inv.core import xla_cpu
  model = platform.processor() or "unknown"
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
      if line.startswith("Model name:"):
        model = line.split(":", 1)[1].strip()
  except (OSError, subprocess.SubprocessError):
    pass
  try:
    load = os.getloadavg()
  except OSError:
    load = None
  return dict(cpu=model, cores=os.cpu_count(), platform=platform.platform(),
              python=platform.python_version(), jax=jax.__version__,
              backend=jax.default_backend(), devices=jax.device_count(),
              device_kind=jax.devices()[0].device_kind, loadavg_start=load,
              cpu_flags=xla_cpu.status())


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

def _csv(s: str, typ=str) -> list:
  try:
    return [typ(v) for v in s.split(",") if v.strip()]
  except ValueError as e:
    raise ValueError(f"expected a comma-separated list of {typ.__name__}, got {s!r}.") from e


def add_parser(subparsers) -> argparse.ArgumentParser:
  """Registers ``fedjax-inv bench`` (``args.func = cmd_bench``)."""
  p = subparsers.add_parser(
      "bench", help="round throughput: engine strategies vs a per-client loop (and peers)",
      description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true",
                 help="small plan (MLP FedAvg C=10,100; fishr_inter_geo, fediir, fedsr "
                      "C=10), < 2 min on 2 idle CPU cores")
  p.add_argument("--workloads", help="comma list: mlp, cnn, cifar10 (pfl-research's "
                 "CIFAR10 setting), heavy, mlp_<algorithm> (default: the plan's)")
  p.add_argument("--clients", help="comma list of cohort sizes C (default 10,100,1000,"
                 "10000; --quick 10,100)")
  p.add_argument("--impls", help=f"comma list from {','.join(IMPLS)} (default all), or "
                 "vmap+patches, chunked+patches (the ConvNet's convolutions as batched "
                 "matrix products)")
  p.add_argument("--rounds", type=int, help="timed rounds per row (default 5; quick 3)")
  p.add_argument("--warmup", type=int, help="untimed rounds after compiling (default 1)")
  p.add_argument("--chunk-size", type=int, default=None,
                 help="clients per chunk for 'chunked' (default the engine's min(C, 64))")
  p.add_argument("--max-impl-s", type=float, default=None,
                 help="skip an implementation whose predicted time at the next C exceeds "
                      "this (default 240; quick 30)")
  p.add_argument("--replicas", type=int, default=0, metavar="S",
                 help="instead of the plan: S seeds batched as one program vs S sequential "
                      "runs, per workload and C (run_replicas)")
  p.add_argument("--fused", type=int, default=0, metavar="R",
                 help="instead of the plan: R rounds per device call vs one call per "
                      "round, per workload and C (simulation.run(rounds_per_call=R))")
  p.add_argument("--json", metavar="FILE", help="write rows + meta as JSON ('-' = stdout)")
  p.add_argument("--plot", metavar="PNG", help="plot client updates/s vs C (mlp_fedavg)")
  p.add_argument("--peers", action="store_true",
                 help="also run benchmarks/peers/bench_peers.py (FedJAX, DrJAX, PyTorch), "
                      "bench_pfl.py (pfl-research, MLP and ConvNet) and bench_flower.py "
                      "(Flower with Ray, MLP and ConvNet), each in its own environment, "
                      "and merge the rows")
  p.add_argument("--peers-python", default=str(PEERS_DIR / ".venv" / "bin" / "python"),
                 help="interpreter of the peers' environment (benchmarks/peers/setup.sh)")
  p.add_argument("--pfl-python", default=str(PEERS_DIR / ".venv-pfl" / "bin" / "python"),
                 help="interpreter of pfl-research's environment "
                      "(benchmarks/peers/setup_pfl.sh); used with --peers")
  p.add_argument("--flower-python",
                 default=str(PEERS_DIR / ".venv-flower" / "bin" / "python"),
                 help="interpreter of Flower's environment "
                      "(benchmarks/peers/setup_flower.sh); used with --peers")
  p.add_argument("--host-devices", type=int, default=None,
                 help="CPU only: split the host into N XLA devices (sets XLA_FLAGS before "
                      "JAX starts) so the 'sharded' row runs")
  p.add_argument("--precision", default="highest", choices=tuple(PRECISIONS),
                 help="arithmetic of float32 matrix products and convolutions, as for "
                      "`fedjax-inv run --precision`: highest (float32 on every device, "
                      "the default), tf32 (TensorFloat-32 on NVIDIA GPUs), bf16; recorded "
                      "in the JSON's meta")
  p.add_argument("--no-matmul-peak", action="store_true",
                 help="skip measuring the f32 matmul peak (no %%peak column)")
  p.set_defaults(func=cmd_bench)
  return p


def _engine_strategies() -> tuple:
  """The engine's execution strategies beyond ``IMPLS`` (``core.strategy.STRATEGIES``:
  'vmap+patches', 'chunked+patches'): ``--impls`` accepts them too; not in the default
  plan."""
  from fedjax_inv.core import strategy
  return tuple(s for s in strategy.STRATEGIES if s not in IMPLS)


def _plan(args) -> tuple[dict, list[tuple[list, tuple, tuple]]]:
  cfg = dict(QUICK if args.quick else FULL)
  if args.rounds is not None:
    if args.rounds < 1:
      raise ValueError(f"--rounds {args.rounds}: use >= 1 timed rounds.")
    cfg["rounds"] = args.rounds
  if args.warmup is not None:
    if args.warmup < 0:
      raise ValueError(f"--warmup {args.warmup}: use >= 0.")
    cfg["warmup"] = args.warmup
  if args.max_impl_s is not None:
    cfg["max_impl_s"] = args.max_impl_s
  if args.chunk_size is not None and args.chunk_size < 1:
    raise ValueError(f"--chunk-size {args.chunk_size}: use a positive int.")
  impls = _csv(args.impls) if args.impls else None
  for i in impls or ():
    if i not in IMPLS and i not in _engine_strategies():
      raise ValueError(f"--impls {i!r}: choose from {IMPLS + _engine_strategies()}.")
  clients = _csv(args.clients, int) if args.clients else None
  for c in clients or ():
    if c < 1:
      raise ValueError(f"--clients {c}: cohort sizes must be >= 1.")
  plan = []
  if args.workloads:
    for w in _csv(args.workloads):
      ws = workloads([w])
      plan.append((ws, tuple(clients or (CLIENT_COUNTS if not args.quick else (10, 100)))
                   , tuple(impls or IMPLS)))
  else:
    for w, cs, im in cfg["plan"]:
      plan.append((workloads([w]), tuple(clients or cs), tuple(impls or im)))
  return cfg, plan


def _write_json(path: str | None, payload: dict) -> None:
  """Writes ``payload`` to ``path`` (also after every configuration, with
  ``meta.partial = True``, so an interrupted run keeps what it measured)."""
  if not path or path == "-":
    return
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(str(path) + ".tmp")
  tmp.write_text(json.dumps(payload, indent=1, default=str))
  tmp.replace(path)


def _backends_started() -> bool:
  """Whether JAX has created its backends (after which XLA_FLAGS has no effect)."""
  from fedjax_inv.core import xla_cpu
  return xla_cpu.backends_started()


def _set_host_devices(n: int) -> None:
  """``--host-devices N``: splits the CPU into N XLA devices (XLA_FLAGS) when JAX's
  backends have not started yet; otherwise says on stderr that it is ignored."""
  if _backends_started():
    print("fedjax-inv bench: JAX's backends are already initialized; --host-devices is "
          "ignored (set XLA_FLAGS=--xla_force_host_platform_device_count=N instead).",
          file=sys.stderr)
  else:  # XLA reads the flag when the CPU backend starts, not at `import jax`
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={n}").strip()


def _meta(args, cfg: dict, log, plan=()) -> tuple[dict, float | None]:
  """The run's ``meta`` (machine, date, command, data, local recipe, rounds, each planned
  workload's data shape and recipe; the matmul peaks unless ``--no-matmul-peak``) and the
  f32 matmul peak in FLOP/s (or None)."""
  meta = machine_info()
  meta.update(date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              command="fedjax-inv " + " ".join(sys.argv[1:]) if sys.argv else "",
              workload_data="synthetic clients: x uniform [0,1) of shape "
              f"[C, {EXAMPLES_PER_CLIENT}, 28, 28, 1] (MNIST-shaped; cifar10_fedavg: "
              "[C, 50, 32, 32, 3]), 10 uniform labels; pool N = C",
              local=dict(LOCAL), warmup=cfg["warmup"], rounds=cfg["rounds"],
              workloads={w.name: w.describe() for ws, _, _ in plan for w in ws})
  peak = None
  if not args.no_matmul_peak:
    log(f"measuring f32 matmul peak (n={cfg['matmul_n']}) ...")
    peak = measure_matmul_peak(cfg["matmul_n"])
  meta["matmul_peak_gflops"] = None if peak is None else peak / 1e9
  if not args.no_matmul_peak:
    log("measuring the MLP step's matmul roofline (batch 32, 784-128-10) ...")
    meta["mlp_step_matmul_peak_gflops"] = measure_shape_peak(mlp_step_shapes()) / 1e9
  return meta, peak


def _bench_runs(args, cfg: dict, plan, meta: dict, t_start: float, log) -> int:
  """``--replicas S`` / ``--fused R``: run-level rows (``runs.measure_runs``) per workload
  and ``C`` instead of the plan; prints them and writes ``--json``. Exit 0.

  Raises:
    ValueError: a negative ``--replicas`` or ``--fused``.
  """
  if args.replicas < 0 or args.fused < 0:
    raise ValueError(f"--replicas {args.replicas} / --fused {args.fused}: use >= 1.")
  rows = []
  for ws, clients, _ in plan:
    for w in ws:
      for C in clients:
        rows += measure_runs(w, C, replicas=args.replicas, fused=args.fused,
                             rounds=max(2 * args.fused, 4 * cfg["rounds"]),
                             log=log)
        _write_json(args.json, dict(meta=dict(meta, partial=True), rows=rows, notes=[]))
  print("\n".join(f"{r['workload']:14s} C={r['clients']:<6d} {r['impl']:28s} "
                   f"{r['ms_per_round']:9.2f} ms/round"
                   + ("" if r["speedup"] is None else f"  x{r['speedup']:.2f}")
                   for r in rows))
  meta["seconds"] = time.perf_counter() - t_start
  _write_json(args.json, dict(meta=meta, rows=rows, notes=[]))
  return 0


def _bench_plan(args, cfg: dict, plan, meta: dict, peak: float | None, known,
                log) -> tuple[list[dict], list[str]]:
  """Times the plan (``timing.run_config`` per workload and ``C``; an algorithm not in
  ``known``, the registry, is a note), writing the partial JSON after every
  configuration. Returns ``(rows, notes)``."""
  rows, notes, history = [], [], {}
  for ws, clients, impls in plan:
    for w in ws:
      if w.algorithm not in known:
        notes.append(f"{w.name}: algorithm {w.algorithm!r} is not registered yet; "
                     "skipped.")
        continue
      for C in clients:
        rows += run_config(w, C, list(impls), warmup=cfg["warmup"], rounds=cfg["rounds"],
                           budget_s=cfg["budget_s"], peak_flops=peak,
                           chunk_size=args.chunk_size, history=history,
                           max_impl_s=cfg["max_impl_s"], log=log)
        _write_json(args.json, dict(meta=dict(meta, partial=True), rows=rows, notes=notes,
                                    summary=summarize(rows)))
  return rows, notes


def _report(args, rows: list[dict], notes: list[str], meta: dict, t_start: float) -> None:
  """Prints the table, the notes, the summary and the machine line; writes ``--json``
  (or prints it for ``-``) and ``--plot``."""
  try:
    meta["loadavg_end"] = os.getloadavg()
  except OSError:
    pass
  meta["seconds"] = time.perf_counter() - t_start
  summary = summarize(rows)
  shape_peak = meta.get("mlp_step_matmul_peak_gflops")
  summary["auto_pct_of_mlp_step_matmul_peak"] = {
      r["clients"]: 100.0 * r["gflops"] / shape_peak for r in rows
      if shape_peak and r["workload"] == "mlp_fedavg" and r["impl"] == "auto"
      and r.get("gflops")}
  print(format_table(rows))
  if notes:
    print("\n" + "\n".join(notes))
  print("\nsummary: " + json.dumps({k: v for k, v in summary.items() if k != "targets"},
                                   default=str))
  print(f"matmul peak {fmt(meta['matmul_peak_gflops'], '{:.1f}')} GFLOP/s (MLP step "
        f"shapes: {fmt(meta.get('mlp_step_matmul_peak_gflops'), '{:.1f}')}); "
        f"{meta['cpu']}, {meta['cores']} cores, jax {meta['jax']}, "
        f"{meta['devices']} device(s); load {meta['loadavg_start']} -> "
        f"{meta.get('loadavg_end')}; {meta['seconds']:.0f} s")
  payload = dict(meta=meta, rows=rows, notes=notes, summary=summary)
  if args.json == "-":
    print(json.dumps(payload, indent=1, default=str))
  else:
    _write_json(args.json, payload)
  if args.plot:
    plot_throughput(rows, args.plot)


def cmd_bench(args) -> int:
  """Runs the benchmark plan; prints the table (and JSON with ``--json``). Exit 0.

  Raises:
    ValueError: a bad flag value (``fedjax-inv`` prints it as a one-line error, exit 2).
  """
  cfg, plan = _plan(args)
  if args.host_devices:
    _set_host_devices(args.host_devices)
  import jax  # noqa: F401  (initialize the backend after XLA_FLAGS is set)
  from fedjax_inv.algorithms import registry
  t_start = time.perf_counter()
  log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
  from fedjax_inv.runner.simulation import matmul_precision
  with matmul_precision(args.precision):  # every program below is traced under it
    meta, peak = _meta(args, cfg, log, plan)
    meta["precision"] = args.precision
    known = registry()
    if args.replicas or args.fused:
      return _bench_runs(args, cfg, plan, meta, t_start, log)
    rows, notes = _bench_plan(args, cfg, plan, meta, peak, known, log)
  if args.peers:
    rows, pnotes = run_all_peers(rows, args.peers_python, args.pfl_python, cfg["warmup"],
                                 cfg["rounds"], log=log, flower_python=args.flower_python)
    notes += pnotes
  _report(args, rows, notes, meta, t_start)
  return 0
