r"""Memory estimate (``core/memory.py``) against XLA's buffer assignment, ConvNet rounds.

Usage: .venv/bin/python benchmarks/memory_check.py --baseline HEAD \
         --json benchmarks/results_memory_convnet.json

For each model (``models.cnn(1)``, ``models.convnet()`` FedSR's RotatedMNIST network, and
a narrow ResNet-18 on 32×32×3; ``--models mlp`` for the harness's MLP 784-128-10),
algorithm (fedavg, fedsr, fishr_inter_geo, fediir), cohort ``C`` and execution strategy
(scan, vmap, chunked), the jitted round is built by the engine and compiled (never run),
and the row records the estimate (``memory.round_memory``), XLA's
``compiled.memory_analysis()`` (temp, argument and output bytes) and
``ratio = estimate / (temp + output)``: the estimate excludes the client pool, which is
the round's argument. ``--baseline REV`` also evaluates ``core/memory.py`` as of
git revision ``REV`` (``git show``, nothing is checked out) for the before/after column.
No timings are taken (compile only), so the numbers do not depend on the machine's load.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import pathlib
import platform
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
LOCAL = dict(client_lr=0.1, local_steps=5, batch_size=32)
N_MAX = 64
ALGORITHMS = ("fedavg", "fedsr", "fishr_inter_geo", "fediir")
STRATEGIES = ("scan", "vmap", "chunked")


def _models():
  from fedjax_inv import models
  from fedjax_inv.models import resnet
  return {
      "cnn": (lambda: models.cnn(1), (28, 28, 1)),
      "convnet": (lambda: models.convnet(), (28, 28, 1)),
      "resnet18_w8": (lambda: resnet.resnet18(10, base_width=8, groups=8, feature_dim=64),
                      (32, 32, 3)),
      "mlp": (lambda: models.mlp(784, (128,), 10), (28, 28, 1)),  # the MLP rows' model
  }


def _algorithm(name: str):
  """The harness's local recipe (5 SGD steps of 32), or the factory's own where it fixes
  it (fishr_inter_geo: one full-batch step)."""
  from fedjax_inv.algorithms import make_algorithm
  try:
    return make_algorithm(name, **LOCAL)
  except ValueError:
    return make_algorithm(name)


def _load_memory_at(rev: str):
  """``fedjax_inv/core/memory.py`` as of git revision ``rev``, as a module."""
  src = subprocess.run(["git", "show", f"{rev}:fedjax_inv/core/memory.py"], cwd=REPO_ROOT,
                       check=True, capture_output=True, text=True).stdout
  spec = importlib.util.spec_from_loader(f"memory_at_{rev}", loader=None)
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod  # dataclasses look their module up
  exec(compile(src, f"memory.py@{rev}", "exec"), mod.__dict__)  # noqa: S102
  return mod


def _xla_bytes(model, alg, C, n_max, feat, strategy, chunk_size) -> dict:
  """Compile the engine's jitted round (never run it): XLA's ``memory_analysis()``."""
  import jax
  import jax.numpy as jnp

  from fedjax_inv.core import engine
  from fedjax_inv.core.data import ClientData
  data = ClientData(x=jnp.zeros((C, n_max) + feat), y=jnp.zeros((C, n_max), jnp.int32),
                    n=jnp.full((C,), n_max, jnp.int32))
  trained = alg.model_for(model)  # the engine takes the algorithm's model (FedSR's head)
  rf = engine.build_round(trained, "multiclass", alg, C, C, execution=strategy,
                          chunk_size=chunk_size)
  server, cs = engine.init_state(alg, trained.init(0), C)
  ma = rf.jitted.lower(server, cs, data, jax.random.key(0)).compile().memory_analysis()
  out = dict(xla_temp_bytes=int(ma.temp_size_in_bytes),
             xla_argument_bytes=int(ma.argument_size_in_bytes),
             xla_output_bytes=int(ma.output_size_in_bytes))
  del rf, ma
  gc.collect()
  jax.clear_caches()
  return out


def _key(row) -> tuple:
  return (row["model"], row["algorithm"], row["clients"], row["strategy"],
          row.get("chunk_size"), row.get("n_max"))


def measure(model_name, alg_name, C, strategy, *, baseline=None, chunk_size=None,
            n_max=N_MAX, xla_rows=None) -> dict:
  """One row: XLA's memory of the compiled round (or the same row of ``xla_rows``, rows
  of an earlier run) against the estimate(s)."""
  from fedjax_inv.core import memory
  make_model, feat = _models()[model_name]
  model, alg = make_model(), _algorithm(alg_name)
  row = dict(model=model_name, algorithm=alg_name, clients=C, strategy=strategy,
             chunk_size=chunk_size, n_max=n_max, feature_shape=list(feat),
             local_steps=alg.local_steps, batch_size=alg.batch_size)
  old = (xla_rows or {}).get(_key(row))
  if old is not None:
    row.update({k: old[k] for k in ("xla_temp_bytes", "xla_argument_bytes",
                                     "xla_output_bytes")}, xla_reused=True)
  else:
    row.update(_xla_bytes(model, alg, C, n_max, feat, strategy, chunk_size))
  xla = row["xla_temp_bytes"] + row["xla_output_bytes"]
  m = memory.round_memory(model, alg, C, n_max, feat, strategy, chunk_size)
  row.update(params_bytes=m.params, resident_clients=m.resident_clients,
             estimate_bytes=m.total, ratio=m.total / xla,
             breakdown={k: int(v) for k, v in vars(m).items()})
  if baseline is not None:
    before = baseline.estimate_round_bytes(model, alg, C, n_max, feat, strategy, chunk_size)
    row.update(estimate_before_bytes=int(before), ratio_before=before / xla)
  return row


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", default="cnn,convnet,resnet18_w8")
  ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
  ap.add_argument("--clients", default="10,100")
  ap.add_argument("--strategies", default=",".join(STRATEGIES))
  ap.add_argument("--baseline", default=None, help="git revision of core/memory.py to "
                  "compare with (e.g. HEAD)")
  ap.add_argument("--json", default=None, help="write the rows here")
  ap.add_argument("--xla-from", default=None, help="a JSON of an earlier run (same JAX): "
                  "take XLA's numbers of its rows instead of compiling them again, e.g. "
                  "after a change of the estimate alone")
  args = ap.parse_args(argv)
  import jax
  baseline = _load_memory_at(args.baseline) if args.baseline else None
  xla_rows = xla_meta = None
  if args.xla_from:
    earlier = json.loads(pathlib.Path(args.xla_from).read_text())
    if earlier["meta"]["jax"] != jax.__version__:
      raise SystemExit(f"--xla-from {args.xla_from}: measured with JAX "
                       f"{earlier['meta']['jax']}, this is {jax.__version__}.")
    xla_rows = {_key(r): r for r in earlier["rows"] if "error" not in r}
    xla_meta = earlier["meta"].get("xla_from") or earlier["meta"]
  rows = []
  for mname in args.models.split(","):
    for alg in args.algorithms.split(","):
      for C in (int(c) for c in args.clients.split(",")):
        for s in args.strategies.split(","):
          try:
            r = measure(mname, alg, C, s, baseline=baseline, xla_rows=xla_rows)
          except Exception as e:  # report and go on (e.g. an algorithm/model mismatch)
            r = dict(model=mname, algorithm=alg, clients=C, strategy=s,
                     error=f"{type(e).__name__}: {str(e)[:300]}")
            print(f"{mname:12s} {alg:16s} C={C:<4d} {s:8s} error {r['error']}", flush=True)
            rows.append(r)
            continue
          rows.append(r)
          before = f" before {r['ratio_before']:.2f}" if baseline else ""
          print(f"{mname:12s} {alg:16s} C={C:<4d} {s:8s} XLA "
                f"{(r['xla_temp_bytes'] + r['xla_output_bytes']) / 1e6:9.1f} MB  est "
                f"{r['estimate_bytes'] / 1e6:9.1f} MB  ratio {r['ratio']:.2f}{before}",
                flush=True)
  meta = dict(command=" ".join([pathlib.Path(sys.argv[0]).name] + (argv or sys.argv[1:])),
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              jax=jax.__version__, backend=jax.default_backend(),
              platform=platform.platform(), python=platform.python_version(),
              baseline=args.baseline, n_max=N_MAX, local_recipe=LOCAL,
              xla_bytes="temp + output (memory_analysis); ratio = estimate / that",
              xla_from=xla_meta)  # the run that compiled the reused rows (xla_reused)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
