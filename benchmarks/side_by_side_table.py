"""The side-by-side tables of fedjax_inv against its peers, from raw JSON rows.

CPU (``benchmarks/peers/side_by_side.sh``): client updates per second of fedjax_inv
(``auto``, the per-client loop), pfl-research and Flower per workload and cohort size C,
the ratio of ``auto`` to each peer, and peak RSS (MB). Usage: ``python
benchmarks/side_by_side_table.py OUT [OUT_EXTRA ...]`` (later folders' rows replace earlier
ones for the same workload, C and system).

GPU (``benchmarks/gpu/side_by_side_call.sh``): ``--gpu OUT`` (a folder with ``ours.json``
and ``pfl.json``) or ``--gpu OURS.json PFL.json`` prints, per workload (MLP, ConvNet,
pfl-research's CIFAR10 setting) and C, fedjax_inv's ``auto`` and its fastest
implementation, pfl-research's fastest process layout (named), client updates per second,
peak device memory and the ratios ours / pfl. Device memory: ours is JAX's
``peak_bytes_in_use`` after the row (``≤`` where the row did not raise the process's peak,
so the value is an upper bound); pfl's the sum over its processes of
``torch.cuda.max_memory_allocated()`` (neither counts the CUDA contexts).

``--merge OUT.json IN.json [IN.json ...]`` writes the rows of several runs of one system
as one JSON (the first run's ``meta``, every run's under ``metas``, notes concatenated;
missing or unreadable inputs are named in the notes).
"""
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


# --------------------------------------------------------------------------- GPU


def merge(out: str, inputs) -> dict:
  """Concatenates the rows and notes of ``inputs`` (JSON files of one system) into
  ``out``; returns the payload."""
  rows, notes, metas = [], [], []
  for p in inputs:
    try:
      d = json.loads(pathlib.Path(p).read_text())
    except (OSError, ValueError) as e:
      notes.append(f"{p}: not read ({type(e).__name__}: {e})")
      continue
    rows += d.get("rows", [])
    notes += [f"{pathlib.Path(p).name}: {n}" for n in d.get("notes", [])]
    metas.append(dict(d.get("meta", {}), file=pathlib.Path(p).name))
  payload = dict(meta=metas[0] if metas else {}, metas=metas, rows=rows, notes=notes)
  tmp = pathlib.Path(out + ".tmp")
  tmp.write_text(json.dumps(payload, indent=1, default=str))
  tmp.replace(out)
  return payload


def _load(path) -> list:
  p = pathlib.Path(path)
  if not p.is_file():
    return []
  return [r for r in json.loads(p.read_text()).get("rows", [])
          if r.get("client_updates_per_s")]


def _layout(r: dict) -> str:
  """A pfl row's process layout, e.g. '4 procs x 4 threads (gloo)'."""
  procs, t = r.get("processes", 1), r.get("threads")
  s = f"{procs} proc{'s' * (procs > 1)}" + (f" x {t} thr" if t else "")
  if r.get("dist_backend") not in (None, "pfl"):
    s += f", {r['dist_backend']}"
  return s


def _mb(v, exact=True) -> str:
  if v is None:
    return "–"
  return ("" if exact is not False else "≤") + f"{v:,.0f}"


WORKLOAD_ORDER = ("mlp_fedavg", "cnn_fedavg", "cifar10_fedavg")


def gpu_table(ours_rows: list, pfl_rows: list) -> str:
  """The GPU side-by-side table (see the module docstring)."""
  ours, best, pfl = {}, {}, {}
  for r in ours_rows:
    k = (r["workload"], r["clients"])
    if r["impl"] == "auto" and k not in ours:  # the first run's (the call's main steps)
      ours[k] = r
    if r["impl"] == "loop":
      continue
    b = best.get(k)
    if b is None or r["client_updates_per_s"] > b["client_updates_per_s"] or (
        r["client_updates_per_s"] == b["client_updates_per_s"] and b["impl"] == "auto"):
      best[k] = r  # a named implementation over `auto`'s copy of the same round
  for r in pfl_rows:
    k = (r["workload"], r.get("C", r["clients"]))
    if k not in pfl or r["client_updates_per_s"] > pfl[k]["client_updates_per_s"]:
      pfl[k] = r
  keys = sorted(set(ours) | set(best) | set(pfl), key=lambda k: (
      WORKLOAD_ORDER.index(k[0]) if k[0] in WORKLOAD_ORDER else 99, k[0], k[1]))
  lines = ["| workload | C | ours `auto` upd/s (strategy) | ours fastest upd/s (impl) | "
           "pfl-research fastest upd/s (layout) | auto / pfl | fastest / pfl | "
           "peak device MB: auto / pfl |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
  for k in keys:
    a, b, p = ours.get(k), best.get(k), pfl.get(k)
    ups = lambda r: None if r is None else r["client_updates_per_s"]  # noqa: E731
    fmt = lambda v: "–" if v is None else f"{v:,.1f}"  # noqa: E731
    ratio = lambda x, y: "–" if x is None or y is None else f"{x / y:.2f}×"  # noqa: E731
    a_s = "–" if a is None else f"{fmt(ups(a))} ({a.get('strategy') or '?'})"
    b_s = "–" if b is None else f"{fmt(ups(b))} ({b['impl']})"
    p_s = "–" if p is None else f"{fmt(ups(p))} ({_layout(p)})"
    mem = (_mb(a.get("device_peak_mb"), a.get("device_peak_exact")) if a else "–") + \
        " / " + (_mb(p.get("device_mem_peak_mb")) if p else "–")
    lines.append(f"| {k[0]} | {k[1]} | {a_s} | {b_s} | {p_s} | {ratio(ups(a), ups(p))} | "
                 f"{ratio(ups(b), ups(p))} | {mem} |")
  return "\n".join(lines)


def _gpu_main(args) -> str:
  if len(args) == 1:
    folder = pathlib.Path(args[0])
    ours, pfl = folder / "ours.json", folder / "pfl.json"
  elif len(args) == 2:
    ours, pfl = args
  else:
    raise SystemExit("usage: side_by_side_table.py --gpu OUT | --gpu OURS.json PFL.json")
  return gpu_table(_load(ours), _load(pfl))


if __name__ == "__main__":
  if sys.argv[1:2] == ["--merge"]:
    if len(sys.argv) < 4:
      raise SystemExit("usage: side_by_side_table.py --merge OUT.json IN.json [...]")
    merge(sys.argv[2], sys.argv[3:])
  elif sys.argv[1:2] == ["--gpu"]:
    print(_gpu_main(sys.argv[2:]))
  else:
    print(table(sys.argv[1:]))
