"""FEMNIST at its real size: the packed host pool against the resident device pool, and
pfl-research beside them, on one machine in one run.

Workload (task ``femnist --source synthetic``, Reddi et al. 2021 App. D): 3,400 writers,
671,585 training images (8-bit, 28x28), Reddi et al.'s EMNIST CNN (1,206,590
parameters), FedAvg with 10 writers a round (``--clients``), 1 local epoch of batch 20,
client SGD lr 0.1, server lr 1. Every layout runs in a fresh process (a clean peak RSS):

* ``host, first run``: ``--pool host`` with an empty pool cache (the pool is generated,
  written to the cache and memory-mapped);
* ``host, cached``: the same again, the pool read from the cache;
* ``host_split``: cached, with ``host_split=True`` (``--host-split``: the round as two
  programs at once, one per host thread; faster on a 2-core CPU, not bit-reproducible);
* ``device``: ``--pool device``, the whole padded ``[3400, 475, 28, 28, 1]`` float32
  pool resident (as every run was before the host pool existed);
* ``pfl``: ``benchmarks/peers/bench_pfl.py --models femnist`` in its own environment
  (``benchmarks/peers/setup_pfl.sh``), when that environment exists; its rows are
  merged as they are (``source="peer"``).

Each of ours runs ``--rounds`` rounds through ``simulation.run`` with evaluation every
round on one training writer only (the test set's 77k images are left out: the numbers
are about training), so each round's end is a synchronized wall-clock stamp. Reported:
``first_round_at_s`` (seconds from the process's start, interpreter and imports
included, to the end of round 1), ``load_s`` (building or reading the task),
``round_s`` (median seconds per round after round 1), ``rss_peak_mb``
(``ru_maxrss``), ``compiled_round_programs`` and the pool record of summary.json.

Usage:
  python benchmarks/pool_femnist.py --rounds 20 --json benchmarks/results_pool_femnist.json
  python benchmarks/pool_femnist.py --layouts host_first --rounds 3  (a quick look)
  python benchmarks/pool_femnist.py --layouts host_first,device --clients 100 \
    --execution chunked+patches --rounds 8                        (on a GPU)
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
PFL_PY = HERE / "peers" / ".venv-pfl" / "bin" / "python"


def child(layout: str, rounds: int, t0: float, cohort: int = 10,
          execution: str = "rule") -> dict:
  """One layout in this process: the row."""
  import dataclasses
  import resource
  t_import = time.time()
  from fedjax_inv import tasks
  from fedjax_inv.runner import simulation
  from fedjax_inv.algorithms import make_algorithm
  import_s = time.time() - t_import
  t = time.time()
  task = tasks.make_task("femnist", source="synthetic", seed=0)
  load_s = time.time() - t
  task = dataclasses.replace(task, eval_sets={}, train_eval=(0,))
  alg = make_algorithm("fedavg", **task.algorithm_settings("fedavg"))
  stamps = []
  res = simulation.run(task, alg, rounds=rounds, clients_per_round=cohort, seed=0,
                       eval_every=1, progress=False, reporting=None,
                       pool="host" if layout.startswith("host") else "device",
                       host_split=layout == "host_split",
                       execution=execution, callback=lambda e: stamps.append(time.time()),
                       load_seconds=load_s)
  steps = [b - a for a, b in zip(stamps, stamps[1:])]
  import jax
  stats = jax.local_devices()[0].memory_stats() or {}
  return {"layout": layout, "workload": "femnist_fedavg", "C": cohort, "clients": 3400,
          "rounds": rounds, "strategy": res.strategy,
          "first_round_at_s": round(stamps[0] - t0, 2), "import_s": round(import_s, 2),
          "load_s": round(load_s, 2), "round_s": round(statistics.median(steps), 3),
          "round_times_s": [round(s, 3) for s in steps],
          "client_updates_per_s": round(cohort / statistics.median(steps), 2),
          "device": str(jax.local_devices()[0].device_kind),
          "device_peak_mb": (round(stats["peak_bytes_in_use"] / 2**20, 1)
                             if "peak_bytes_in_use" in stats else None),
          "rss_peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
          "compiled_round_programs": (res.pool or {}).get("compiled_round_programs", 1),
          "pool": res.pool, "final_train_objective": res.final["train_objective"]}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--rounds", type=int, default=20)
  p.add_argument("--layouts", default="host_first,host_cached,host_split,device,pfl",
                 help="comma-separated: host_first, host_cached, host_split, device, pfl")
  p.add_argument("--pfl-python", default=str(PFL_PY),
                 help="interpreter of pfl-research's environment (default "
                      "benchmarks/peers/.venv-pfl, made by benchmarks/peers/setup_pfl.sh)")
  p.add_argument("--clients", type=int, default=10, help="writers a round (C)")
  p.add_argument("--execution", default="rule",
                 help="execution strategy of ours (default: the engine's fixed rule; a "
                      "streamed pool never measures), e.g. chunked+patches on a GPU")
  p.add_argument("--json", default=None, help="write the rows here (atomically)")
  p.add_argument("--child", default=None, help=argparse.SUPPRESS)
  p.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    print("ROW " + json.dumps(child(a.child, a.rounds, a.t0, a.clients, a.execution)),
          flush=True)
    return 0
  rows = []
  cache = tempfile.mkdtemp(prefix="fedjax_inv_pool_bench_")
  env = {**os.environ, "FEDJAX_INV_CACHE_DIR": cache}
  for layout in a.layouts.split(","):
    if layout == "pfl":
      if not pathlib.Path(a.pfl_python).exists():
        print(f"pfl: no {a.pfl_python} (bash benchmarks/peers/setup_pfl.sh); skipped",
              file=sys.stderr)
        continue
      with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([a.pfl_python, str(HERE / "peers" / "bench_pfl.py"), "--models",
                        "femnist", "--femnist-cohort", str(a.clients), "--configs", "1x1,2x1",
                        "--rounds", str(a.rounds - 1),
                        "--budget-s", "600", "--json", f.name], check=True)
        got = json.loads(pathlib.Path(f.name).read_text())
      rows += [dict(r, layout="pfl") for r in (got["rows"] if isinstance(got, dict)
                                               else got)]
      continue
    cmd = [sys.executable, __file__, "--child", layout, "--rounds", str(a.rounds),
           "--clients", str(a.clients), "--execution", a.execution, "--t0", repr(time.time())]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
    if out.returncode or not line:
      print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
      raise SystemExit(f"{layout}: failed (exit {out.returncode})")
    rows.append(json.loads(line[0][4:]))
    r = rows[-1]
    print(f"{layout:12s} first round at {r['first_round_at_s']:6.1f} s  load "
          f"{r['load_s']:5.1f} s  {r['round_s']:.3f} s/round  RSS {r['rss_peak_mb']:.0f} MB"
          f"  programs {r['compiled_round_programs']}", flush=True)
  import shutil
  shutil.rmtree(cache, ignore_errors=True)  # ours: made above
  meta = {"machine": {"cpu": platform.processor() or platform.machine(),
                      "cores": os.cpu_count(), "python": platform.python_version()},
          "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}
  try:
    import jax
    meta["jax"] = jax.__version__
  except ImportError:
    pass
  by = {r["layout"]: r for r in rows}
  if "device" in by and "host_cached" in by:
    meta["device_over_host_round_s"] = round(by["device"]["round_s"] /
                                             by["host_cached"]["round_s"], 3)
  if "host_split" in by and "host_cached" in by:
    meta["host_over_host_split_round_s"] = round(by["host_cached"]["round_s"] /
                                                 by["host_split"]["round_s"], 3)
  doc = {"meta": meta, "rows": rows}
  print(json.dumps(meta))
  if a.json:
    path = pathlib.Path(a.json)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
