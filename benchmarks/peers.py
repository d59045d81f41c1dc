"""The peers of ``fedjax-inv bench --peers``: the FL simulators of ``benchmarks/peers/``
run in their own environments (``bench_peers.py``: FedJAX 0.0.17, DrJAX, PyTorch, made by
``setup.sh``; ``bench_pfl.py``: pfl-research 0.6.0, MLP and ConvNet, made by
``setup_pfl.sh``; ``bench_flower.py``: Flower 1.42 with its Ray simulation backend, MLP
and ConvNet, made by ``setup_flower.sh``), their JSON rows merged into this package's by
workload and ``C`` with a ``ratio_vs_loop`` against this package's ``loop`` row. The
summary's ``auto_vs_torch_loop``, ``auto_vs_pfl`` and ``auto_vs_flower`` come from these
rows (``summary.summarize``)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PEERS_DIR = REPO_ROOT / "benchmarks" / "peers"


def run_peers(python: str, clients: list[int], warmup: int, rounds: int,
              timeout_s: float, log=print, *, script: str = "bench_peers.py",
              extra_args: tuple = (), setup: str = "setup.sh") -> tuple[list[dict], list[str]]:
  """Runs a peer script of ``benchmarks/peers/`` (``bench_peers.py``: FedJAX, DrJAX,
  PyTorch; ``bench_pfl.py``: pfl-research; ``bench_flower.py``: Flower) with its
  environment's interpreter; returns
  ``(rows, notes)``. Never raises for a missing or failing peer: the notes say why
  (``setup`` names the script that makes the environment)."""
  label = pathlib.Path(script).stem
  script = PEERS_DIR / script
  if not script.is_file():
    return [], [f"{label}: {script} not found (run from a source checkout)."]
  if not pathlib.Path(python).exists():
    return [], [f"{label}: interpreter {python} not found; run "
                f"`bash benchmarks/peers/{setup}` first."]
  cmd = [python, str(script), "--clients", ",".join(map(str, clients)), "--warmup",
         str(warmup), "--rounds", str(rounds), "--json", "-", *extra_args]
  log(f"  {label}: " + " ".join(cmd))
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
  except subprocess.TimeoutExpired:
    return [], [f"{label}: timed out after {timeout_s:.0f} s."]
  if out.returncode != 0:
    return [], [f"{label}: exit {out.returncode}: {out.stderr.strip()[-800:]}"]
  try:
    payload = json.loads(out.stdout)
  except json.JSONDecodeError as e:
    return [], [f"{label}: unreadable output ({e}): {out.stdout[-300:]}"]
  return payload.get("rows", []), payload.get("notes", [])


def merge_peers(rows: list[dict], peer_rows: list[dict]) -> list[dict]:
  """Adds peer rows, with ``ratio_vs_loop`` against this package's loop row of the same
  workload and ``C``."""
  loops = {(r["workload"], r["clients"]): r for r in rows
           if r["impl"] == "loop" and r.get("round_s")}
  out = list(rows)
  for p in peer_rows:
    p = dict(p)
    loop = loops.get((p.get("workload"), p.get("clients")))
    if loop and p.get("round_s"):
      p["ratio_vs_loop"] = loop["round_s"] / p["round_s"]
    out.append(p)
  return out


def run_all_peers(rows: list[dict], peers_python: str, pfl_python: str, warmup: int,
                  rounds: int, log=print, *,
                  flower_python: str | None = None) -> tuple[list[dict], list[str]]:
  """``--peers``: runs ``bench_peers.py`` (FedJAX, DrJAX, PyTorch) at the MLP FedAvg
  cohort sizes of ``rows`` (10 and 100 when there are none), then ``bench_pfl.py``
  (pfl-research) and, given ``flower_python``, ``bench_flower.py`` (Flower, Ray backend)
  for the MLP and the ConvNet at this run's ``C`` values of each, and merges their rows
  (:func:`merge_peers`). Returns ``(rows, notes)``; never raises for a missing or failing
  peer (see :func:`run_peers`)."""
  notes = []
  mlp_clients = sorted({r["clients"] for r in rows if r["workload"] == "mlp_fedavg"})
  prow, pnotes = run_peers(peers_python, mlp_clients or [10, 100], warmup, rounds,
                           timeout_s=1800, log=log)
  rows = merge_peers(rows, prow)
  notes += pnotes
  # pfl-research and Flower (each in its own environment): the MLP and the ConvNet at
  # this run's C values.
  own = [(pfl_python, "bench_pfl.py", "setup_pfl.sh")]
  if flower_python:
    own.append((flower_python, "bench_flower.py", "setup_flower.sh"))
  for python, script, setup in own:
    for model, workload in (("mlp", "mlp_fedavg"), ("cnn", "cnn_fedavg")):
      cs = sorted({r["clients"] for r in rows
                   if r["workload"] == workload and r.get("source") != "peer"})
      if not cs:
        continue
      prow, pnotes = run_peers(python, cs, warmup, rounds, timeout_s=3600, log=log,
                               script=script, extra_args=("--models", model), setup=setup)
      rows = merge_peers(rows, prow)
      notes += pnotes
  return rows, notes
