"""Rendering the rows of ``fedjax-inv bench``: the fixed-width text table it prints
(:func:`format_table`) and the throughput plot of ``--plot`` (:func:`plot_throughput`).
``benchmarks/render_results.py`` renders a results JSON as Markdown tables."""
from __future__ import annotations


def fmt(v, spec="{:.3g}", none="-") -> str:
  """``spec.format(v)``, or ``none`` when ``v`` is None (a missing table cell)."""
  return none if v is None else spec.format(v)


def format_table(rows: list[dict]) -> str:
  """A fixed-width text table of the rows (one line each, notes below)."""
  head = (f"{'workload':22s} {'C':>6s} {'impl':34s} {'strategy':8s} "
          f"{'round s (min-max)':>24s}"
          f" {'upd/s':>8s} {'ratio':>6s} {'compile':>7s} {'GFLOP/s':>7s} {'%peak':>5s}"
          f" {'est MB':>7s} {'XLA MB':>7s} {'RSSΔ MB':>7s}")
  lines = [head, "-" * len(head)]
  notes = []
  for r in rows:
    if r.get("round_s"):
      t = f"{r['round_s']:.4g} ({r['round_s_min']:.3g}-{r['round_s_max']:.3g})"
    else:
      t = "skipped"
    xla = (r.get("xla_temp_mb") or 0) + (r.get("xla_out_mb") or 0) \
        if r.get("xla_temp_mb") is not None else None
    lines.append(
        f"{r['workload']:22s} {r['clients']:>6d} {r['impl'][:34]:34s} "
        f"{str(r.get('strategy') or '-')[:8]:8s} {t:>24s} "
        f"{fmt(r.get('client_updates_per_s'), '{:.0f}'):>8s} "
        f"{fmt(r.get('ratio_vs_loop'), '{:.2f}'):>6s} "
        f"{fmt(r.get('compile_s'), '{:.1f}'):>7s} {fmt(r.get('gflops'), '{:.1f}'):>7s} "
        f"{fmt(r.get('pct_of_peak'), '{:.1f}'):>5s} "
        f"{fmt(r.get('mem_estimate_mb'), '{:.0f}'):>7s} {fmt(xla, '{:.0f}'):>7s} "
        f"{fmt(r.get('rss_peak_delta_mb'), '{:.0f}'):>7s}")
    if r.get("note") and (not r.get("round_s") or r["impl"] in ("auto",)):
      notes.append(f"  {r['workload']} C={r['clients']} {r['impl']}: {r['note']}")
  return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def plot_throughput(rows: list[dict], path: str, workload: str = "mlp_fedavg") -> None:
  """PNG of client updates/s vs C (log-log), one line per implementation."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  series: dict = {}
  for r in rows:
    if r["workload"] == workload and r.get("client_updates_per_s"):
      label = r["impl"]
      if label == "auto":
        label = f"auto (-> {r.get('strategy')})"
      elif r.get("source") == "peer":
        label = "peer: " + label
      series.setdefault(label, []).append((r["clients"], r["client_updates_per_s"]))
  fig, ax = plt.subplots(figsize=(8, 5))
  for label, pts in sorted(series.items(), key=lambda kv: (kv[0].startswith("peer"), kv[0])):
    pts.sort()
    auto = label.startswith("auto")
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="s" if auto else "o",
            linestyle="--" if label.startswith("peer") else "-", linewidth=4 if auto else 1.5,
            alpha=0.5 if auto else 1.0, label=label)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("clients per round C")
  ax.set_ylabel("client updates / s")
  ax.set_title(f"{workload}: 5 local SGD steps of batch 32 per client (CPU)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
