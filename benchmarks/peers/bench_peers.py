"""The MLP FedAvg workload of ``fedjax-inv bench`` run with peer FL simulators.

Runs in the separate environment made by ``benchmarks/peers/setup.sh`` (never a
dependency of fedjax_inv) and prints JSON rows in the harness's format, which
``fedjax-inv bench --peers`` merges (``ratio_vs_loop`` is computed there against
fedjax_inv's own per-client loop).

Workload (same as ``mlp_fedavg`` in ``benchmarks/harness.py``): C clients (pool = C, all
trained every round) with 64 synthetic MNIST-shaped examples each (x uniform in [0, 1),
10 uniform labels), MLP 784-128-10 with ReLU, 5 local SGD steps (lr 0.1) of batch 32,
server: weighted mean of the client models (FedAvg, McMahan et al. 2017, Alg. 1).

Peers:
  * ``fedjax 0.0.17 (jit backend)``: ``fedjax.algorithms.fed_avg`` with a Haiku MLP and
    the ``'jit'`` ``for_each_client`` backend (a jitted client step called per batch;
    batches are shuffled and batched on the host by ``shuffle_repeat_batch``, without
    replacement inside an epoch, unlike the with-replacement sampling of fedjax_inv: same
    FLOPs). The ``'pmap'`` backend calls ``jax.device_put_replicated``, removed from JAX.
  * ``drjax <v> map_fn``: ``drjax.program`` + ``broadcast`` / ``map_fn`` /
    ``reduce_mean`` around a pure-JAX client update (``lax.scan`` over the local steps),
    one ``jax.jit`` per round (DrJAX maps with ``vmap``).
  * ``torch <v> loop``: a Python loop over clients, each copying the global
    ``nn.Sequential`` and running ``torch.optim.SGD`` (CPU; default thread count, and
    ``torch1`` with one thread, which is faster for these tiny matmuls on a busy host).

Usage:
  benchmarks/peers/.venv/bin/python benchmarks/peers/bench_peers.py \
      --clients 10,100,1000 --rounds 5 --warmup 1 --json -
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

N_PER_CLIENT = 64
BATCH = 32
STEPS = 5
LR = 0.1
WORKLOAD = "mlp_fedavg"


def make_data(C: int, seed: int = 0):
  import numpy as np
  rng = np.random.default_rng(seed)
  x = rng.random((C, N_PER_CLIENT, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, 10, (C, N_PER_CLIENT)).astype(np.int32)
  return x, y


def timed(round_fn, state, warmup: int, rounds: int, block, budget_s: float = 60.0):
  """(state, first-call seconds, timed seconds list)."""
  t0 = time.perf_counter()
  state = round_fn(state)
  block(state)
  first = time.perf_counter() - t0
  for _ in range(max(0, warmup - 1)):
    state = round_fn(state)
    block(state)
  if rounds > 2:
    rounds = max(2, min(rounds, int(budget_s / max(first, 1e-9))))
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    state = round_fn(state)
    block(state)
    times.append(time.perf_counter() - t0)
  return state, first, times


def row(impl: str, C: int, first: float, times: list, note: str = "") -> dict:
  med = statistics.median(times)
  return dict(source="peer", workload=WORKLOAD, model="mlp", algorithm="fedavg",
              clients=C, pool=C, impl=impl, strategy=None, chunk_size=None,
              rounds_timed=len(times), round_s=med, round_s_min=min(times),
              round_s_max=max(times), client_updates_per_s=C / med,
              compile_s=max(0.0, first - med), ratio_vs_loop=None, note=note)


# --------------------------------------------------------------------------- FedJAX


def bench_fedjax(C: int, warmup: int, rounds: int) -> dict:
  import fedjax
  import haiku as hk
  import jax
  import jax.numpy as jnp
  import numpy as np

  shim = ""
  if getattr(jax, "tree_map", None) is jax.tree.map or not hasattr(jax, "tree_map"):
    # fedjax/core/tree_util.py (tree_weight, tree_zeros_like, used by fed_avg) calls
    # jax.tree_map, removed from JAX; without this the round fails with
    # "AttributeError: module 'jax' has no attribute 'tree_map'".
    jax.tree_map = jax.tree.map
    shim = "; shim jax.tree_map = jax.tree.map (removed from JAX, used by fedjax.tree_util)"
  fedjax.set_for_each_client_backend("jit")
  x, y = make_data(C)

  def forward(batch):
    h = batch["x"].reshape(batch["x"].shape[0], -1)
    return hk.Sequential([hk.Linear(128), jax.nn.relu, hk.Linear(10)])(h)

  transformed = hk.transform(forward)
  sample_batch = {"x": np.zeros((1, 28, 28, 1), np.float32), "y": np.zeros((1,), np.int32)}

  def train_loss(batch, preds):
    return fedjax.metrics.unreduced_cross_entropy_loss(batch["y"], preds)

  model = fedjax.create_model_from_haiku(transformed, sample_batch, train_loss)
  grad_fn = fedjax.model_grad(model)
  hparams = fedjax.ShuffleRepeatBatchHParams(batch_size=BATCH, num_epochs=None,
                                             num_steps=STEPS)
  algo = fedjax.algorithms.fed_avg.federated_averaging(
      grad_fn, fedjax.optimizers.sgd(LR), fedjax.optimizers.sgd(1.0), hparams)
  ids = [f"c{i:06d}".encode() for i in range(C)]
  fd = fedjax.InMemoryFederatedData({cid: {"x": x[i], "y": y[i]} for i, cid in
                                     enumerate(ids)})
  clients = list(fd.get_clients(ids))
  state = algo.init(model.init(jax.random.PRNGKey(0)))
  rngs = list(jax.random.split(jax.random.PRNGKey(1), C))
  rnd = [0]

  def one_round(state):
    rnd[0] += 1
    batch = [(cid, cds, rng) for (cid, cds), rng in zip(clients, rngs)]
    state, _ = algo.apply(state, batch)
    return state

  _, first, times = timed(one_round, state, warmup, rounds,
                          lambda s: jax.block_until_ready(s.params))
  return row(f"fedjax {getattr(fedjax, '__version__', '0.0.17')} (jit backend)", C, first,
             times, note="fedjax.algorithms.fed_avg, for_each_client 'jit' backend; "
             "batches built on host" + shim)


# --------------------------------------------------------------------------- DrJAX


def bench_drjax(C: int, warmup: int, rounds: int) -> dict:
  import drjax
  import jax
  import jax.numpy as jnp

  # vmap keeps ~4 copies of the 0.4 MB model per client (params, grads, update, delta).
  need = C * 4 * 4 * (784 * 128 + 128 + 128 * 10 + 10) + C * N_PER_CLIENT * 785 * 4
  ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  if need > 0.4 * ram:
    raise MemoryError(f"skipped: ~{need / 2**30:.1f} GiB for C={C} clients vmapped "
                      f"> 40% of {ram / 2**30:.1f} GiB RAM")

  x, y = make_data(C)
  x = jnp.asarray(x.reshape(C, N_PER_CLIENT, -1))
  y = jnp.asarray(y)
  k1, k2 = jax.random.split(jax.random.PRNGKey(0))
  params = {"w1": jax.random.normal(k1, (784, 128)) / 28.0, "b1": jnp.zeros(128),
            "w2": jax.random.normal(k2, (128, 10)) / 11.3, "b2": jnp.zeros(10)}

  def loss(p, xb, yb):
    h = jax.nn.relu(xb @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), yb[:, None], 1))

  def client_update(p, xc, yc, key):
    def step(p, k):
      idx = jax.random.randint(k, (BATCH,), 0, N_PER_CLIENT)
      g = jax.grad(loss)(p, xc[idx], yc[idx])
      return jax.tree.map(lambda w, g: w - LR * g, p, g), None
    p1, _ = jax.lax.scan(step, p, jax.random.split(key, STEPS))
    return jax.tree.map(lambda a, b: a - b, p, p1)

  @drjax.program(placements={"clients": C})
  def fl_round(p, xs, ys, keys):
    deltas = drjax.map_fn(client_update, (drjax.broadcast(p), xs, ys, keys))
    mean_delta = drjax.reduce_mean(deltas)  # equal client sizes: = weighted mean
    return jax.tree.map(lambda w, d: w - d, p, mean_delta)

  rnd_fn = jax.jit(fl_round)
  keys = jax.random.split(jax.random.PRNGKey(1), C)
  _, first, times = timed(lambda p: rnd_fn(p, x, y, keys), params, warmup, rounds,
                          jax.block_until_ready)
  return row(f"drjax {drjax.__version__} map_fn", C, first, times,
             note="drjax.program + broadcast/map_fn/reduce_mean, one jit per round")


# --------------------------------------------------------------------------- PyTorch


def bench_torch(C: int, warmup: int, rounds: int, threads: int | None = None) -> dict:
  import torch
  if not hasattr(bench_torch, "default_threads"):
    bench_torch.default_threads = torch.get_num_threads()
  torch.set_num_threads(threads or bench_torch.default_threads)

  x, y = make_data(C)
  X = torch.from_numpy(x.reshape(C, N_PER_CLIENT, -1))
  Y = torch.from_numpy(y).long()
  torch.manual_seed(0)
  make = lambda: torch.nn.Sequential(  # noqa: E731
      torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
  glob = make()
  work = make()
  loss_fn = torch.nn.CrossEntropyLoss()
  gen = torch.Generator().manual_seed(1)

  def one_round(_):
    gparams = [p.detach().clone() for p in glob.parameters()]
    acc = [torch.zeros_like(p) for p in gparams]
    for c in range(C):
      with torch.no_grad():
        for p, g in zip(work.parameters(), gparams):
          p.copy_(g)
      opt = torch.optim.SGD(work.parameters(), lr=LR)
      for _ in range(STEPS):
        idx = torch.randint(0, N_PER_CLIENT, (BATCH,), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss_fn(work(X[c, idx]), Y[c, idx]).backward()
        opt.step()
      with torch.no_grad():
        for a, g, p in zip(acc, gparams, work.parameters()):
          a.add_(g - p, alpha=N_PER_CLIENT)
    with torch.no_grad():
      for p, g, a in zip(glob.parameters(), gparams, acc):
        p.copy_(g - a / (N_PER_CLIENT * C))
    return None

  _, first, times = timed(one_round, None, warmup, rounds, lambda s: None)
  n = torch.get_num_threads()
  return row(f"torch {torch.__version__.split('+')[0]} loop ({n} thread{'s' * (n > 1)})",
             C, first, times,
             note=f"per-client Python loop, torch.optim.SGD, torch.set_num_threads({n})")


PEERS = {"fedjax": bench_fedjax, "drjax": bench_drjax, "torch": bench_torch,
         "torch1": lambda C, w, r: bench_torch(C, w, r, threads=1)}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--clients", default="10,100", help="comma list of cohort sizes")
  p.add_argument("--peers", default="fedjax,drjax,torch,torch1",
                 help=f"subset of {list(PEERS)} (torch1: PyTorch with 1 thread)")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--max-round-s", type=float, default=60.0,
                 help="skip a peer at a larger C when its predicted round (linear in C) "
                      "is longer")
  p.add_argument("--json", default=None, help="write JSON here ('-' = stdout)")
  args = p.parse_args(argv)
  clients = [int(c) for c in args.clients.split(",") if c]
  rows, notes = [], []
  for name in [s for s in args.peers.split(",") if s]:
    if name not in PEERS:
      notes.append(f"unknown peer {name!r}; choose from {list(PEERS)}")
      continue
    last = None  # (C, seconds per round) of the previous cohort size
    for C in clients:
      if last and last[1] * C / last[0] > args.max_round_s:
        notes.append(f"{name}: C={C} skipped (predicted {last[1] * C / last[0]:.0f} s per "
                     f"round from C={last[0]}, > --max-round-s {args.max_round_s:.0f})")
        continue
      print(f"  peer {name} C={C} ...", file=sys.stderr, flush=True)
      try:
        r = PEERS[name](C, args.warmup, args.rounds)
        rows.append(r)
        last = (C, r["round_s"])
      except MemoryError as e:
        notes.append(f"{name}: C={C} {e}")
        break
      except Exception as e:  # record the exact error, go on with the other peers
        tb = traceback.format_exc(limit=3)
        notes.append(f"{name}: C={C} failed: {type(e).__name__}: {e}\n{tb}")
        break
  meta = dict(python=platform.python_version(), cpu_count=os.cpu_count())
  for mod in ("jax", "fedjax", "drjax", "torch", "haiku"):
    try:
      meta[mod] = __import__(mod).__version__
    except Exception as e:  # noqa: BLE001 - report what is missing
      meta[mod] = f"unavailable: {type(e).__name__}: {e}"
  payload = dict(meta=meta, rows=rows, notes=notes)
  text = json.dumps(payload, indent=1)
  if args.json == "-":
    print(text)
  elif args.json:
    with open(args.json, "w") as f:
      f.write(text)
  else:
    for r in rows:
      print(f"{r['impl']:32s} C={r['clients']:<6d} {r['round_s']:.4g} s/round "
            f"({r['client_updates_per_s']:.0f} updates/s)")
    for n in notes:
      print(n)
  return 0


if __name__ == "__main__":
  sys.exit(main())
