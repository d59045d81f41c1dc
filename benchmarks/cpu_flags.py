"""XLA:CPU flag settings timed on the benchmark's rounds.

Each flag setting runs in its own process (XLA reads ``XLA_FLAGS`` when the CPU backend
starts), with the package's own CPU flags switched off (``FEDJAX_INV_CPU_FLAGS=0``) so that
exactly the listed flags apply. The settings are interleaved over ``--repeats`` passes
(A, B, C, A, B, C, ...) so that load on the machine hits each alike. A child times the
engine rounds of ``benchmarks/harness.py``: the ConvNet (``cnn_fedavg``, ``scan``, C=10 and
100), the MLP (``mlp_fedavg``, ``vmap``, C=100) and heavy algorithms
(``mlp_fishr_inter_geo``, ``mlp_fediir``, ``auto``, C=10). Printed: median seconds per round
per setting and its speed-up over the first setting (ratio > 1: faster).

Usage (about 5 minutes on 2 idle cores):
  python benchmarks/cpu_flags.py --json benchmarks/results_cpu_flags.json
  python benchmarks/cpu_flags.py --settings "" "--xla_cpu_use_xnnpack=false" --repeats 3
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SETTINGS = ["", "--xla_cpu_experimental_ynn_fusion_type="]
# More candidates (pass with --settings): "--xla_cpu_experimental_xnn_fusion_type=",
# "--xla_cpu_use_xnnpack=false", "--xla_cpu_use_onednn=true".
ROWS = [("cnn", 10, "scan"), ("cnn", 100, "scan"), ("mlp", 100, "vmap"),
        ("mlp_fishr_inter_geo", 10, "auto"), ("mlp_fediir", 10, "auto")]


def child(rounds: int) -> dict:
  sys.path.insert(0, str(HERE.parent))
  from benchmarks import harness
  out = {}
  for name, C, impl in ROWS:
    (w,) = harness.workloads([name])
    rows = harness.run_config(w, C, [impl], warmup=1, rounds=rounds, budget_s=30.0,
                              peak_flops=None, chunk_size=None, history={},
                              max_impl_s=600.0, log=lambda s: None)
    out[f"{w.name} C={C} {impl}"] = rows[0].get("round_s")
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--settings", nargs="*", default=SETTINGS,
                 help="XLA_FLAGS values to compare (the first is the baseline); write a "
                 'value that starts with -- after =, e.g. --settings "" " --xla_..."')
  p.add_argument("--repeats", type=int, default=2, help="interleaved passes (default 2)")
  p.add_argument("--rounds", type=int, default=3, help="timed rounds per row (default 3)")
  p.add_argument("--json", help="write the result here (atomically)")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.child:
    print(json.dumps(child(a.rounds)))
    return 0
  runs = {s: [] for s in a.settings}
  for r in range(a.repeats):
    for s in a.settings:
      env = dict(os.environ, XLA_FLAGS=s, FEDJAX_INV_CPU_FLAGS="0", JAX_PLATFORMS="cpu")
      res = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(a.rounds)],
                           env=env, capture_output=True, text=True)
      if res.returncode:
        sys.exit(f"setting {s!r} failed:\n{res.stderr[-2000:]}")
      runs[s].append(json.loads(res.stdout.strip().splitlines()[-1]))
      print(f"pass {r + 1}/{a.repeats} {s or '(none)'}: {runs[s][-1]}", file=sys.stderr,
            flush=True)
  base = a.settings[0]
  table = {}
  for s, rs in runs.items():
    table[s or "(none)"] = {k: dict(round_s=statistics.median(x[k] for x in rs),
                                    speedup_vs_first=statistics.median(
                                        b[k] / x[k] for b, x in zip(runs[base], rs)))
                            for k in rs[0]}
  sys.path.insert(0, str(HERE.parent))
  from benchmarks.harness import machine_info
  payload = dict(meta=dict(machine_info(), repeats=a.repeats, rounds=a.rounds,
                           command="python benchmarks/cpu_flags.py "
                           + " ".join(argv or sys.argv[1:])),
                 settings=table)
  text = json.dumps(payload, indent=1, default=str)
  print(text)
  if a.json:
    path = pathlib.Path(a.json)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
