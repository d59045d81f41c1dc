"""The ratios of ``fedjax-inv bench``: ``ratio_vs_loop`` per row
(:func:`add_ratios_vs_loop`) and the performance targets computed from the rows
(:func:`summarize`)."""
from __future__ import annotations


def add_ratios_vs_loop(rows: list[dict]) -> list[dict]:
  """Sets ``ratio_vs_loop = loop round_s / row round_s`` (> 1: faster than the Python
  loop) on every timed row that has a timed ``loop`` row of the same workload and ``C``
  (the first one); other rows keep theirs. Returns ``rows`` (changed in place)."""
  loops: dict = {}
  for r in rows:
    if r["impl"] == "loop" and r.get("round_s"):
      loops.setdefault((r["workload"], r["clients"]), r)
  for r in rows:
    loop = loops.get((r["workload"], r["clients"]))
    if loop and r.get("round_s"):
      r["ratio_vs_loop"] = loop["round_s"] / r["round_s"]
  return rows


def _timed_row(rows, workload, impl, C):
  """The first timed row of ``workload``, ``impl`` and ``C``, or None."""
  return next((r for r in rows if r["workload"] == workload and r["impl"] == impl
               and r["clients"] == C and r.get("round_s")), None)


def _auto_vs_peer(rows: list[dict], workload: str, prefix: str, Cs: list[int]) -> dict:
  """``{C: fastest peer round_s / auto round_s}`` over the peer rows of ``workload``
  whose ``impl`` starts with ``prefix`` ('torch', 'pfl', 'flower'), for each ``C`` of ``Cs`` that
  has both."""
  out = {}
  for C in Cs:
    ts = [r["round_s"] for r in rows if r["workload"] == workload and r["clients"] == C
          and r.get("source") == "peer" and r["impl"].startswith(prefix)
          and r.get("round_s")]
    a = _timed_row(rows, workload, "auto", C)
    if ts and a:
      out[C] = min(ts) / a["round_s"]  # against the peer's fastest setting or layout
  return out


def summarize(rows: list[dict]) -> dict:
  """The performance targets, computed from the rows (None / empty where a row is missing):
  ``auto_vs_loop_at_1000`` (target >= 1.7), ``auto_vs_loop_min`` over C (>= 1.0),
  ``auto_vs_torch_loop`` per C against the fastest PyTorch row (>= 3), ``auto_vs_pfl``
  per workload and C against pfl-research's fastest layout,
  ``auto_vs_flower`` likewise against Flower's fastest ``client_resources`` setting,
  ``fishr_inter_geo_vs_fedavg`` per C (<= 1.3; FedAvg runs 5 local steps of 32 examples,
  fishr_inter_geo one full-batch step) and ``fishr_inter_geo_vs_fedsgd`` (the same local
  work as fishr_inter_geo)."""
  Cs = sorted({r["clients"] for r in rows})
  auto = {C: _timed_row(rows, "mlp_fedavg", "auto", C) for C in Cs}
  ratios = {C: r["ratio_vs_loop"] for C, r in auto.items() if r and r.get("ratio_vs_loop")}
  torch = _auto_vs_peer(rows, "mlp_fedavg", "torch", Cs)
  pfl, flower = {}, {}
  for w in ("mlp_fedavg", "cnn_fedavg"):
    vs = _auto_vs_peer(rows, w, "pfl", Cs)
    if vs:
      pfl[w] = vs
    vs = _auto_vs_peer(rows, w, "flower", Cs)
    if vs:
      flower[w] = vs
  fishr, fishr_sgd = {}, {}
  for C in Cs:
    f, a, g = (_timed_row(rows, "mlp_fishr_inter_geo", "auto", C), auto.get(C),
               _timed_row(rows, "mlp_fedsgd", "auto", C))
    if f and a:
      fishr[C] = f["round_s"] / a["round_s"]
    if f and g:
      fishr_sgd[C] = f["round_s"] / g["round_s"]
  return dict(auto_vs_loop_at_1000=ratios.get(1000),
              auto_vs_loop_min=min(ratios.values()) if ratios else None,
              auto_vs_loop=ratios, auto_vs_torch_loop=torch, auto_vs_pfl=pfl,
              auto_vs_flower=flower,
              fishr_inter_geo_vs_fedavg=fishr, fishr_inter_geo_vs_fedsgd=fishr_sgd,
              targets=dict(auto_vs_loop_at_1000=">= 1.7", auto_vs_loop_min=">= 1.0",
                           auto_vs_torch_loop=">= 3", fishr_inter_geo_vs_fedavg="<= 1.3",
                           auto_vs_pfl="mlp >= 3 at C >= 100; cnn >= 1.2 at C = 100, 1000"))
