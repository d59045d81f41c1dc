"""Renders a ``fedjax-inv bench --json`` file as the Markdown tables of RESULTS.md.

Usage:
  python benchmarks/render_results.py benchmarks/results.json > /tmp/tables.md
"""
from __future__ import annotations

import json
import sys


def fmt(v, spec="{:.3g}"):
  return "–" if v is None else spec.format(v)


def render(payload: dict) -> str:
  meta, rows = payload["meta"], payload["rows"]
  out = [
      f"- machine: {meta.get('cpu')}, {meta.get('cores')} cores; backend "
      f"{meta.get('backend')} ({meta.get('devices')} device(s), {meta.get('device_kind')})",
      f"- JAX {meta.get('jax')}, Python {meta.get('python')}, {meta.get('platform')}",
      f"- date {meta.get('date')}; command `{meta.get('command')}`",
      f"- measured f32 matmul peak: {fmt(meta.get('matmul_peak_gflops'), '{:.1f}')} GFLOP/s "
      f"(large square matmul); the MLP step's own matmul shapes: "
      f"{fmt(meta.get('mlp_step_matmul_peak_gflops'), '{:.1f}')} GFLOP/s",
      f"- load average at start {meta.get('loadavg_start')}, at end "
      f"{meta.get('loadavg_end')}; total {fmt(meta.get('seconds'), '{:.0f}')} s",
      f"- data: {meta.get('workload_data')}; local recipe {meta.get('local')}; "
      f"{meta.get('warmup')} warm-up round(s), up to {meta.get('rounds')} timed",
      ""]
  for w in sorted({r["workload"] for r in rows}, key=lambda w: (w != "mlp_fedavg", w)):
    out += [f"### {w}", "",
            "| C | impl | strategy | round s median (min–max) | client upd/s | ratio_vs_loop "
            "| compile s | GFLOP/round | GFLOP/s | % peak | est. MB | XLA temp MB | "
            "RSS Δ MB | note |",
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    order = ["loop", "auto", "scan", "vmap", "chunked", "sharded"]
    for r in sorted((r for r in rows if r["workload"] == w),
                    key=lambda r: (r["clients"], r.get("source") != "fedjax_inv",
                                   order.index(r["impl"]) if r["impl"] in order else 9,
                                   r["impl"])):
      t = (f"{r['round_s']:.4g} ({r['round_s_min']:.3g}–{r['round_s_max']:.3g})"
           if r.get("round_s") else "skipped")
      note = (r.get("note") or "").replace("|", "/").replace("\n", " ")
      out.append(
          f"| {r['clients']} | {r['impl']} | {r.get('strategy') or '–'} | {t} | "
          f"{fmt(r.get('client_updates_per_s'), '{:.0f}')} | "
          f"{fmt(r.get('ratio_vs_loop'), '{:.2f}')} | {fmt(r.get('compile_s'), '{:.1f}')} | "
          f"{fmt(r.get('gflop_per_round'), '{:.3g}')} | {fmt(r.get('gflops'), '{:.1f}')} | "
          f"{fmt(r.get('pct_of_peak'), '{:.1f}')} | {fmt(r.get('mem_estimate_mb'), '{:.0f}')}"
          f" | {fmt(r.get('xla_temp_mb'), '{:.0f}')} | "
          f"{fmt(r.get('rss_peak_delta_mb'), '{:.0f}')} | {note[:160]} |")
    out.append("")
  if payload.get("notes"):
    out += ["Notes from the run:", ""] + [f"- {n.splitlines()[0]}" for n in payload["notes"]]
    out.append("")
  s = payload.get("summary") or {}
  out += ["Performance targets:", "",
          f"- `auto` vs loop at C=1000 (≥ 1.7): {fmt(s.get('auto_vs_loop_at_1000'), '{:.2f}')}",
          f"- `auto` vs loop, minimum over C (≥ 1.0): "
          f"{fmt(s.get('auto_vs_loop_min'), '{:.2f}')}; per C: "
          + ", ".join(f"C={k}: {v:.2f}" for k, v in (s.get("auto_vs_loop") or {}).items()),
          "- `auto` vs the PyTorch loop (≥ 3): " + (", ".join(
              f"C={k}: {v:.2f}" for k, v in (s.get("auto_vs_torch_loop") or {}).items())
              or "–"),
          "- fishr_inter_geo round / FedAvg round (≤ 1.3): " + (", ".join(
              f"C={k}: {v:.2f}" for k, v in
              (s.get("fishr_inter_geo_vs_fedavg") or {}).items()) or "–"),
          "- fishr_inter_geo round / FedSGD round (same local work): " + (", ".join(
              f"C={k}: {v:.2f}" for k, v in
              (s.get("fishr_inter_geo_vs_fedsgd") or {}).items()) or "–"),
          ""]
  return "\n".join(out)


if __name__ == "__main__":
  with open(sys.argv[1]) as f:
    print(render(json.load(f)))
