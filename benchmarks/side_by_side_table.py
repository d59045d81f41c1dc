"""The side-by-side table of ``benchmarks/peers/side_by_side.sh`` from its raw JSON rows:
client updates per second of fedjax_inv (``auto``, the per-client loop), pfl-research
and Flower per workload and cohort size C, the ratio of ``auto`` to each peer, and peak
RSS (MB). Usage: ``python benchmarks/side_by_side_table.py OUT [OUT_EXTRA ...]`` (later
folders' rows replace earlier ones for the same workload, C and system)."""
import json
import pathlib
import sys


def _rows(folder: pathlib.Path) -> dict:
  out = {}
  for name in ("ours", "pfl", "flower", "ours_cnn1000"):
    f = folder / f"{name}.json"
    if not f.is_file():
      continue
    for r in json.loads(f.read_text())["rows"]:
      if not r.get("client_updates_per_s"):
        continue
      system = ("auto" if r["impl"] == "auto" else "loop" if r["impl"] == "loop"
                else r["impl"].split()[0])
      out[(r["workload"], r["clients"], system)] = r
  return out


def table(folders) -> str:
  rows = {}
  for f in folders:
    rows.update(_rows(pathlib.Path(f)))
  lines = ["| workload | C | fedjax_inv `auto` upd/s | loop | pfl-research | Flower | "
           "auto / pfl | auto / Flower | peak RSS MB: auto (growth in the row) / pfl / "
           "Flower (whole processes) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
  keys = sorted({(w, c) for w, c, _ in rows}, key=lambda k: (k[0] != "mlp_fedavg", k[1]))
  for w, c in keys:
    get = lambda s, k="client_updates_per_s": (rows.get((w, c, s)) or {}).get(k)  # noqa
    a, lp, p, fl = get("auto"), get("loop"), get("pfl"), get("flower")
    fmt = lambda v: "–" if v is None else f"{v:,.1f}"  # noqa: E731
    ratio = lambda x: "–" if a is None or x is None else f"{a / x:.2f}×"  # noqa: E731
    rss = [get("auto", "rss_peak_delta_mb"), get("pfl", "rss_peak_mb"),
           get("flower", "rss_peak_mb")]
    lines.append(f"| {w} | {c} | {fmt(a)} | {fmt(lp)} | {fmt(p)} | {fmt(fl)} | "
                 f"{ratio(p)} | {ratio(fl)} | "
                 + " / ".join("–" if v is None else f"{v:.0f}" for v in rss) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  print(table(sys.argv[1:]))
