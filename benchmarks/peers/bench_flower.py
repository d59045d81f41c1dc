"""The FedAvg workloads of ``fedjax-inv bench`` run with Flower (``flwr[simulation]``, Ray).

Runs in its own environment, made by ``benchmarks/peers/setup_flower.sh``
(``benchmarks/peers/.venv-flower``: ``flwr[simulation]`` 1.42 with Ray and the CPU torch
wheel of the other peers; never a dependency of fedjax_inv), and prints JSON rows in the
format of ``bench_peers.py`` / ``bench_pfl.py`` (``source="peer"``), which
``fedjax-inv bench --peers`` merges by workload and ``C``.

Workload (``mlp_fedavg`` / ``cnn_fedavg`` of ``benchmarks/harness.py``, as in
``bench_pfl.py``): C clients per round, pool = C (every client trains every round), 64
synthetic MNIST-shaped examples per client (x uniform in [0, 1), 10 uniform labels; the
arrays of ``bench_peers.make_data``), local training = 5 SGD steps (lr 0.1) on batches of
32 drawn with replacement, server = weighted mean of the client models (FedAvg). Models
(torch, the same modules as ``bench_pfl.py``): ``mlp`` 784-128-10 ReLU (101,770
parameters); ``cnn`` 3x3 convs 1->32->64->64 ('SAME', ReLU, 2x2 max-pool after the first
two), global max, Linear 64->10 (56,394 parameters, He-normal conv init).

Flower configuration (Flower 1.42 docs: "Run simulations" how-to, quickstart-pytorch
example, API reference of ``flwr.simulation.run_simulation`` and
``flwr.serverapp.strategy.FedAvg``):

  * Message API: a ``ClientApp`` whose ``@app.train()`` function loads the global
    ``ArrayRecord`` into a fresh torch module, trains, and replies with
    ``ArrayRecord(model.state_dict())`` and a ``MetricRecord`` with ``num-examples`` (=
    64, FedAvg's weight); a ``ServerApp`` whose ``@app.main()`` runs
    ``flwr.serverapp.strategy.FedAvg(fraction_train=1.0, min_train_nodes=C,
    min_available_nodes=C, fraction_evaluate=0.0)`` (the Message-API names of the legacy
    ``fraction_fit`` / ``min_fit_clients``; no federated evaluation) through
    ``strategy.start(grid, initial_arrays, num_rounds, train_config, evaluate_fn)``.
  * ``flwr.simulation.run_simulation(server_app, client_app, num_supernodes=C,
    backend_name="ray", backend_config={"client_resources": {"num_cpus": K, "num_gpus":
    0.0}})``: C virtual SuperNodes, partition-id = client index; Ray's ``init_args`` are
    left unset ("For the highest performance, do not set options.backend.init-args").
    ``run_simulation`` warns that it is deprecated in favour of ``flwr run``; ``flwr
    run``'s simulation process calls the same ``_run_simulation`` -> ``start_vce`` ->
    ``RayBackend`` path (``flwr/simulation/app.py``), so the rounds are the same.
  * ``client_resources``: ``num_cpus=1`` by default (``--client-cpus``), the docs'
    example ("each ClientApp assumes to use 1 CPU ... as many ClientApps in parallel as
    CPUs you have"): the Ray actor pool has floor(cores / K) actors, 2 on a 2-core host.
    Flower's default is ``num_cpus=2`` (one actor here). Ray sets ``OMP_NUM_THREADS=K``
    in each actor (so torch uses K threads; the launcher removes an inherited
    ``OMP_NUM_THREADS``). ``--client-cpus 1,2`` measures both.
  * Data: the driver writes the pool once to ``.npy`` files in a temporary folder and
    the ``ClientApp`` memory-maps them once per actor process (a module-level cache, as
    the quickstart caches its ``FederatedDataset``), taking its partition by
    ``context.node_config["partition-id"]``; the file name, model and seed travel in the
    ``train_config`` ``ConfigRecord``. Batch indices: ``np.random.default_rng((seed,
    partition, round - 1))``, the same batches as ``bench_pfl.py``.
  * Flower's simulation polls: its message extractor every 0.1 s and the in-memory
    grid's ``send_and_receive`` every 0.1 s (``pull_interval``), so a round has a floor
    of roughly 0.1-0.3 s whatever C is. That is Flower's cost, left as it is.

Every (client_cpus, model, C) runs in a fresh driver process (clean Ray, clean peak RSS).
Timing: ``strategy.start``'s ``evaluate_fn`` hook (called before round 1 and after
every round; it only takes ``time.perf_counter()`` and returns None) gives per-round wall
times. The first round (``first_round_s``: it also waits for the Ray actors' processes to
start and import torch) and ``warmup - 1`` more are untimed, then ``rounds`` timed ones
(at least 2; fewer when they would exceed ``--budget-s``, the remaining rounds then being
configured with no clients). ``round_s`` is their median. Ray's startup is timed apart:
``ray_init_s`` (``RayBackend.init_ray``, i.e. ``ray.init``) and ``actor_pool_s``
(``RayBackend.build``). ``rss_peak_mb`` is the sum of the peak RSS (``VmHWM``) of the
driver and all its descendant processes (Ray's GCS, raylet, workers/actors), read at the
end of the last round while Ray is up (peaks of different processes need not coincide:
an upper bound; shared pages, e.g. the memory-mapped data, count once per process);
``rss_actors_mb`` is the actors' part. Rows also carry a "does it train" check: the loss
and accuracy of the global model on all clients' training data before and after the
rounds (random labels: the loss falls a little from ln 10 = 2.30, the accuracy rises
slightly above 0.1 by memorization).

``--check-training``: per model, the parameter count, one Flower round against the same
FedAvg round written out in plain torch (same batches; measured max abs difference 1.5e-8
MLP, 1.2e-7 CNN), and 20 rounds of 10 clients on the learnable synthetic task of
``bench_pfl.py`` (x = 0.8 U + 0.2 T_y, its seed and batches): held-out accuracy must rise
by > 0.2 from chance (measured: MLP 0.09 -> 1.00, CNN 0.09 -> 0.34, as pfl's). The CNN's
number is fragile: the same run with the batches of the next round (seed offset by one)
reaches only 0.17 in plain torch too. Exit 1 if a check fails.

Usage:
  bash benchmarks/peers/setup_flower.sh
  benchmarks/peers/.venv-flower/bin/python benchmarks/peers/bench_flower.py \\
      --clients 10,100,1000 --models mlp,cnn --rounds 5 --warmup 1 --json -
  ... bench_flower.py --client-cpus 1,2 --clients 100   (Ray actors x torch threads)
  ... bench_flower.py --check-training                  (shows that Flower learns)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

from torch_workload import (BATCH, EXPECTED_PARAMS, LR, N_PER_CLIENT,
                            STEPS, WORKLOADS, learnable_task, make_data,
                            param_count, to_model_layout)
from torch_workload import torch_body as build_torch_model

MODULE = "bench_flower"  # this file's module name in the Ray actors (see worker_main)


# --------------------------------------------------------------------------- shared


def batch_indices(seed: int, client: int, server_round: int):
  """The round's 5 x 32 example indices of a client (Flower's ``server-round`` counts
  from 1), drawn with replacement: the same batches as ``bench_pfl.py``
  (``default_rng((seed, client, round - 1)).integers(0, 64, 160)`` in 5 rows)."""
  import numpy as np
  return np.random.default_rng((seed, client, server_round - 1)).integers(
      0, N_PER_CLIENT, (STEPS, BATCH))


def client_tensors(X, Y, c: int):
  """Client c's examples as torch tensors (a copy: plain NCHW strides, whatever X's;
  the same in the ClientApp and the reference, so the same conv kernels run)."""
  import numpy as np
  import torch
  return torch.from_numpy(np.array(X[c])), torch.from_numpy(np.array(Y[c])).long()


def local_train(net, x, y, idx):
  """5 SGD steps (lr 0.1) on x[idx[s]], y[idx[s]]; returns the mean loss."""
  import torch
  opt = torch.optim.SGD(net.parameters(), lr=LR)
  net.train()
  total = 0.0
  for s in range(STEPS):
    b = torch.from_numpy(idx[s])
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(net(x[b]), y[b])
    loss.backward()
    opt.step()
    total += float(loss.detach())
  return total / STEPS


def versions() -> dict:
  out = {}
  for mod in ("flwr", "ray", "torch", "numpy"):
    try:
      out[mod] = __import__(mod).__version__
    except Exception as e:  # noqa: BLE001 - report what is missing
      out[mod] = f"unavailable: {type(e).__name__}: {e}"
  return out


# --------------------------------------------------------------------------- ClientApp
# Runs in the Ray actors. Imported there as module ``bench_flower`` (the driver imports
# this file under that name so that cloudpickle sends references, not copies, and the
# cache below lives as long as the actor process).

_DATA_CACHE: dict = {}


def _client_data(path: str):
  """The pool's (X, Y), memory-mapped once per actor process."""
  import numpy as np
  if path not in _DATA_CACHE:
    _DATA_CACHE[path] = (np.load(path + ".x.npy", mmap_mode="r"),
                         np.load(path + ".y.npy", mmap_mode="r"))
  return _DATA_CACHE[path]


def client_train(msg, context):
  """The ``@app.train()`` function: FedAvg's local update of one client."""
  import resource
  import torch
  from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

  cfg = msg.content["config"]
  cid = int(context.node_config["partition-id"])
  X, Y = _client_data(str(cfg["data"]))
  x, y = client_tensors(X, Y, cid)
  net = build_torch_model(str(cfg["model"]))
  net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
  loss = local_train(net, x, y, batch_indices(int(cfg["seed"]), cid,
                                              int(cfg["server-round"])))
  metrics = MetricRecord({
      "num-examples": N_PER_CLIENT, "train-loss": loss, "pid": os.getpid(),
      "maxrss-kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      "torch-threads": torch.get_num_threads()})
  return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()),
                             "metrics": metrics}), reply_to=msg)


def make_client_app():
  from flwr.clientapp import ClientApp
  app = ClientApp()
  app.train()(client_train)
  return app


# --------------------------------------------------------------------------- one driver


def _proc_tree(root: int) -> list[int]:
  """``root`` and all its descendants (from /proc/*/stat)."""
  children: dict = {}
  for d in os.listdir("/proc"):
    if d.isdigit():
      try:
        with open(f"/proc/{d}/stat") as f:
          ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d))
      except (OSError, IndexError, ValueError):
        pass
  out, todo = [], [root]
  while todo:
    p = todo.pop()
    out.append(p)
    todo += children.get(p, [])
  return out


def _vm_hwm_kb(pid: int) -> int:
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1])
  except OSError:
    pass
  return 0


def _evaluate(model: str, arrays_or_state, X, Y):
  """(loss, accuracy) of a model state on all examples of X, Y (host arrays)."""
  import torch
  net = build_torch_model(model)
  state = (arrays_or_state if isinstance(arrays_or_state, dict)
           else arrays_or_state.to_torch_state_dict())
  net.load_state_dict(state)
  net.eval()
  x = torch.from_numpy(X.reshape((-1,) + X.shape[2:]))  # [clients * examples, ...]
  y = torch.from_numpy(Y.reshape(-1)).long()
  loss, correct = 0.0, 0
  with torch.no_grad():
    for i in range(0, len(x), 1024):
      logits = net(x[i:i + 1024])
      loss += float(torch.nn.functional.cross_entropy(logits, y[i:i + 1024],
                                                      reduction="sum"))
      correct += int((logits.argmax(-1) == y[i:i + 1024]).sum())
  return loss / len(x), correct / len(x)


def reference_round(model: str, state0: dict, X, Y, seed: int):
  """Round 1 of FedAvg written out in plain torch with the batches the ClientApp uses;
  returns the new flat parameter vector. One torch thread, like the actors here
  (different thread counts sum convolutions in another order)."""
  import torch
  acc, threads = None, torch.get_num_threads()
  torch.set_num_threads(1)
  for c in range(X.shape[0]):
    net = build_torch_model(model)
    net.load_state_dict(state0)
    local_train(net, *client_tensors(X, Y, c), batch_indices(seed, c, 1))
    v = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
    acc = v if acc is None else acc + v
  torch.set_num_threads(threads)
  return acc / X.shape[0]


def worker_main(a) -> int:
  """One Flower simulation (fresh Ray) for one (client_cpus, model, C); writes its
  result to ``a.out``."""
  import resource
  import numpy as np
  import torch
  here = os.path.dirname(os.path.abspath(__file__))
  if here not in sys.path:
    sys.path.insert(0, here)
  mod = __import__(MODULE)  # by name: the actors import it (Flower forwards sys.path)
  from flwr.app import ArrayRecord, ConfigRecord, MetricRecord
  from flwr.serverapp import ServerApp
  from flwr.serverapp.strategy import FedAvg
  from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords
  from flwr.server.superlink.fleet.vce.backend import raybackend
  from flwr.simulation import run_simulation

  C = a.clients
  test = None
  if a.data == "learnable":
    (x, y), (xt, yt) = learnable_task(C, 2000, label_dtype="int32")  # bench_pfl's check: its seed 1
    test = (to_model_layout(a.model, xt)[None], yt[None])
  else:
    x, y = make_data(C, a.seed)
  X = to_model_layout(a.model, x)
  del x
  data = os.path.join(a.data_dir, f"pool_{a.model}_{C}")
  np.save(data + ".x.npy", X)
  np.save(data + ".y.npy", y)

  torch.manual_seed(a.seed)
  net0 = build_torch_model(a.model)
  state0 = {k: v.detach().clone() for k, v in net0.state_dict().items()}
  ref = reference_round(a.model, state0, X, y, a.seed) if a.reference else None
  first_rounds = max(1, a.warmup)
  total_rounds = first_rounds + a.rounds

  # Ray's startup, timed apart by wrapping Flower's own RayBackend methods.
  stamps: dict = {}

  def timed(name, fn):
    def wrapper(*args, **kw):
      t0 = time.perf_counter()
      try:
        return fn(*args, **kw)
      finally:
        stamps[name] = time.perf_counter() - t0
    return wrapper

  raybackend.RayBackend.init_ray = timed("ray_init_s", raybackend.RayBackend.init_ray)
  raybackend.RayBackend.build = timed("actor_pool_s", raybackend.RayBackend.build)

  out: dict = dict(laps=[], clients_trained=[], actors={}, threads=set())

  class Timer:
    """``evaluate_fn`` of ``strategy.start``: a time stamp per round; after the first
    round, how many timed rounds fit ``--budget-s``."""

    def __init__(self):
      self.t = None
      self.stop_after = total_rounds

    def __call__(self, server_round, arrays):
      now = time.perf_counter()
      if self.t is not None and server_round <= self.stop_after:
        out["laps"].append(now - self.t)
      if server_round == 1:
        if a.rounds > 2:
          timed_n = max(2, int(min(a.rounds, a.budget_s / max(out["laps"][0], 1e-9))))
          self.stop_after = first_rounds + timed_n
        if ref is not None:
          net = build_torch_model(a.model)
          net.load_state_dict(arrays.to_torch_state_dict())
          got = torch.nn.utils.parameters_to_vector(net.parameters()).detach()
          out["ref_diff"] = float((got - ref).abs().max())
          out["ref_moved"] = float((ref - torch.nn.utils.parameters_to_vector(
              net0.parameters()).detach()).abs().max())
      if server_round == self.stop_after:  # Ray is up: read the processes' peaks
        tree = _proc_tree(os.getpid())
        out["rss_tree_kb"] = {p: _vm_hwm_kb(p) for p in tree}
      self.t = time.perf_counter()
      return None

  timer = Timer()

  class BudgetFedAvg(FedAvg):
    """FedAvg that configures no clients after the timed rounds (``--budget-s``)."""

    def configure_train(self, server_round, arrays, config, grid):
      if server_round > timer.stop_after:
        return []
      return super().configure_train(server_round, arrays, config, grid)

  def train_metrics(records, weighted_by_key):
    for r in records:
      m = r["metrics"]
      pid = int(m["pid"])
      out["actors"][pid] = max(out["actors"].get(pid, 0), int(m["maxrss-kb"]))
      out["threads"].add(int(m["torch-threads"]))
    out["clients_trained"].append(len(records))
    agg = aggregate_metricrecords(records, weighted_by_key)
    return MetricRecord({"train-loss": agg["train-loss"]})  # pid etc.: not means

  server_app = ServerApp()

  @server_app.main()
  def main(grid, context):
    strategy = BudgetFedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                            min_train_nodes=C, min_available_nodes=C,
                            train_metrics_aggr_fn=train_metrics)
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(net0.state_dict()),
        num_rounds=total_rounds, timeout=a.timeout_s,
        train_config=ConfigRecord({"data": data, "model": a.model, "seed": a.seed}),
        evaluate_fn=timer)
    out["arrays"] = result.arrays

  backend_config = {"client_resources": {"num_cpus": a.client_cpus, "num_gpus": 0.0}}
  t0 = time.perf_counter()
  run_simulation(server_app=server_app, client_app=mod.make_client_app(),
                 num_supernodes=C, backend_name="ray", backend_config=backend_config)
  sim_s = time.perf_counter() - t0
  if "arrays" not in out or len(out["laps"]) < first_rounds + 1:
    raise RuntimeError(f"the simulation did not finish its rounds: laps {out['laps']}, "
                       f"clients per round {out['clients_trained']}")
  trained = out["clients_trained"][:timer.stop_after]
  if any(n != C for n in trained):
    raise RuntimeError(f"rounds trained {trained} clients, expected {C} each")
  loss0, acc0 = _evaluate(a.model, state0, X, y)
  loss1, acc1 = _evaluate(a.model, out["arrays"], X, y)
  tree = out.get("rss_tree_kb", {})
  actors_kb = sum(tree.get(p, v) for p, v in out["actors"].items())
  driver_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  total_kb = driver_kb + sum(v for p, v in tree.items() if p != os.getpid())
  res = dict(params=param_count(net0), first_round_s=out["laps"][0],
             timed=out["laps"][first_rounds:timer.stop_after], sim_s=sim_s,
             ray_init_s=stamps.get("ray_init_s"), actor_pool_s=stamps.get("actor_pool_s"),
             actors=len(out["actors"]), threads=sorted(out["threads"]),
             rss_total_kb=total_kb, rss_driver_kb=driver_kb, rss_actors_kb=actors_kb,
             processes=len(tree), train_loss_before=loss0, train_loss_after=loss1,
             train_acc_before=acc0, train_acc_after=acc1,
             rounds_run=len(trained), **versions())
  if test is not None:
    res["test_loss_before"], res["test_acc_before"] = _evaluate(a.model, state0, *test)
    res["test_loss_after"], res["test_acc_after"] = _evaluate(a.model, out["arrays"],
                                                              *test)
  if ref is not None:
    res["ref_diff"], res["ref_moved"] = out.get("ref_diff"), out.get("ref_moved")
  with open(a.out, "w") as f:
    json.dump(res, f)
  return 0


# --------------------------------------------------------------------------- launcher


def launch(model: str, C: int, client_cpus: float, a, rounds: int | None = None,
           warmup: int | None = None, extra: tuple = ()) -> dict:
  """Runs one simulation in a fresh driver process; returns its result."""
  with tempfile.TemporaryDirectory(prefix="bench_flower_") as tmp:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "XLA_FLAGS")}  # Ray sets it per actor
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no network here
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    out = os.path.join(tmp, "result.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--model", model,
           "--clients", str(C), "--client-cpus", str(client_cpus), "--warmup",
           str(a.warmup if warmup is None else warmup), "--rounds",
           str(a.rounds if rounds is None else rounds), "--budget-s", str(a.budget_s),
           "--seed", str(a.seed), "--timeout-s", str(a.timeout_s), "--data-dir", tmp,
           "--out", out, *extra]
    with open(os.path.join(tmp, "driver.log"), "w") as log:
      proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
      try:
        rc = proc.wait(timeout=a.timeout_s)
      except subprocess.TimeoutExpired:
        proc.kill()  # the driver started here, by its handle; Ray's daemons exit with it
        proc.wait()
        rc = f"timed out after {a.timeout_s:.0f} s"
    with open(log.name) as f:
      tail = f.read()[-2500:]
    if rc != 0 or not os.path.exists(out):
      raise RuntimeError(f"flower driver failed (exit {rc}):\n{tail}")
    with open(out) as f:
      return json.load(f)


def _cpus(spec: str) -> float | int:
  v = float(spec)
  if v <= 0:
    raise ValueError(f"--client-cpus {spec!r}: use > 0")
  return int(v) if v.is_integer() else v


def make_row(model: str, C: int, client_cpus, r: dict) -> dict:
  times = r["timed"]
  med = statistics.median(times)
  first = r["first_round_s"]
  t = r["threads"][0] if len(r["threads"]) == 1 else r["threads"]
  layout = (f"{r['actors']} actor{'s' * (r['actors'] != 1)} x {t} "
            f"thread{'s' * (t != 1)}")
  impl = f"flower {r['flwr']} ({layout})"
  note = (f"flwr {r['flwr']}, ray {r['ray']}, torch {r['torch'].split('+')[0]}: "
          f"flwr.simulation.run_simulation, Ray backend, client_resources num_cpus="
          f"{client_cpus} -> {r['actors']} actor(s) used; Message-API FedAvg("
          "fraction_train=1, min_train_nodes=C, fraction_evaluate=0), ClientApp with a "
          f"fresh torch module per call, pool memory-mapped per actor; {r['params']} "
          f"params; first round includes the actors' start; ray.init "
          f"{r['ray_init_s']:.2f} s, actor pool {r['actor_pool_s']:.2f} s; rss_peak_mb = "
          f"driver + Ray daemons + actors (VmHWM, {r['processes']} processes); train "
          f"loss {r['train_loss_before']:.3f} -> {r['train_loss_after']:.3f}, acc "
          f"{r['train_acc_before']:.3f} -> {r['train_acc_after']:.3f} after "
          f"{r['rounds_run']} rounds")
  return dict(source="peer", workload=WORKLOADS[model], model=model, algorithm="fedavg",
              clients=C, pool=C, impl=impl, strategy=None, chunk_size=None,
              rounds_timed=len(times), round_s=med, round_s_min=min(times),
              round_s_max=max(times), client_updates_per_s=C / med,
              compile_s=max(0.0, first - med), first_round_s=first,
              ray_init_s=r["ray_init_s"], actor_pool_s=r["actor_pool_s"],
              simulation_s=r["sim_s"], rss_peak_mb=r["rss_total_kb"] / 1024.0,
              rss_driver_mb=r["rss_driver_kb"] / 1024.0,
              rss_actors_mb=r["rss_actors_kb"] / 1024.0, processes=r["actors"],
              threads=t, client_cpus=client_cpus, rounds_run=r["rounds_run"],
              train_loss_before=r["train_loss_before"],
              train_loss_after=r["train_loss_after"],
              train_acc_before=r["train_acc_before"], train_acc_after=r["train_acc_after"],
              versions={k: r[k] for k in ("flwr", "ray", "torch", "numpy")},
              ratio_vs_loop=None, note=note)


def _meta() -> dict:
  meta = dict(python=platform.python_version(), cpu_count=os.cpu_count() or 1,
              **versions())
  try:
    meta["loadavg"] = os.getloadavg()
  except OSError:
    pass
  return meta


def _emit(payload: dict, dest: str | None, text_lines) -> None:
  if dest == "-":
    print(json.dumps(payload, indent=1))
  elif dest:
    with open(dest, "w") as f:
      f.write(json.dumps(payload, indent=1))
  if dest != "-":
    for line in text_lines:
      print(line)


def bench_main(a) -> int:
  cpus = [_cpus(s) for s in a.client_cpus.split(",") if s]
  clients = [int(c) for c in a.clients.split(",") if c]
  models = [m for m in a.models.split(",") if m]
  rows, notes = [], []
  for k in cpus:
    for model in models:
      if model not in WORKLOADS:
        notes.append(f"unknown model {model!r}; choose from {list(WORKLOADS)}")
        continue
      last = None
      for C in clients:
        if last and last[1] * C / last[0] > a.max_round_s:
          notes.append(f"flower num_cpus={k} {model}: C={C} skipped (predicted "
                       f"{last[1] * C / last[0]:.0f} s per round from C={last[0]}, > "
                       f"--max-round-s {a.max_round_s:.0f})")
          continue
        print(f"  flower num_cpus={k} {model} C={C} ...", file=sys.stderr, flush=True)
        try:
          r = make_row(model, C, k, launch(model, C, k, a))
          rows.append(r)
          last = (C, r["round_s"])
        except Exception as e:  # record the exact error, go on with the other configs
          notes.append(f"flower num_cpus={k} {model}: C={C} failed: {type(e).__name__}: "
                       f"{e}\n{traceback.format_exc(limit=2)}")
          break
  lines = [f"{r['workload']:11s} {r['impl']:36s} C={r['clients']:<6d} "
           f"{r['round_s']:.4g} s/round ({r['client_updates_per_s']:.0f} updates/s, "
           f"first {r['first_round_s']:.3g} s, ray.init {r['ray_init_s']:.2f} s, peak RSS "
           f"{r['rss_peak_mb']:.0f} MB, train loss {r['train_loss_before']:.3f} -> "
           f"{r['train_loss_after']:.3f})" for r in rows] + notes
  _emit(dict(meta=_meta(), rows=rows, notes=notes), a.json, lines)
  return 0


# --------------------------------------------------------------------------- checks


def check_main(a) -> int:
  checks, ok = [], True
  a.budget_s = float("inf")  # all --check-rounds rounds
  k = _cpus(a.client_cpus.split(",")[0])
  for model in [m for m in a.models.split(",") if m]:
    print(f"  flower check {model} ...", file=sys.stderr, flush=True)
    try:
      r1 = launch(model, 4, k, a, rounds=1, warmup=1, extra=("--reference",))
      r = launch(model, a.clients_check, k, a, rounds=a.check_rounds - 1, warmup=1,
                 extra=("--data", "learnable"))
    except Exception as e:  # noqa: BLE001 - report, fail the check
      checks.append(dict(model=model, ok=False, error=f"{type(e).__name__}: {e}"))
      ok = False
      continue
    c = dict(model=model, params=r["params"], expected_params=EXPECTED_PARAMS[model],
             one_round_vs_reference_max_abs_diff=r1["ref_diff"],
             one_round_max_abs_change=r1["ref_moved"], clients=a.clients_check,
             rounds=r["rounds_run"], test_acc_before=r["test_acc_before"],
             test_acc_after=r["test_acc_after"], test_loss_before=r["test_loss_before"],
             test_loss_after=r["test_loss_after"], simulation_s=r["sim_s"])
    c["ok"] = (c["params"] == c["expected_params"]
               and c["one_round_vs_reference_max_abs_diff"] < 1e-4 * max(
                   1.0, c["one_round_max_abs_change"])
               and c["test_acc_after"] > c["test_acc_before"] + 0.2)
    ok &= c["ok"]
    checks.append(c)
    print(f"{model}: {c['params']} params (expected {c['expected_params']})\n  one round "
          f"vs torch reference: max |diff| {c['one_round_vs_reference_max_abs_diff']:.2e}"
          f" (update max {c['one_round_max_abs_change']:.2e})\n  {c['rounds']} rounds x "
          f"{c['clients']} clients: test accuracy {c['test_acc_before']:.3f} -> "
          f"{c['test_acc_after']:.3f}, loss {c['test_loss_before']:.3f} -> "
          f"{c['test_loss_after']:.3f} ({c['simulation_s']:.1f} s)  "
          f"{'OK' if c['ok'] else 'FAIL'}", file=sys.stderr, flush=True)
  _emit(dict(meta=_meta(), checks=checks), a.json, [])
  return 0 if ok else 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--clients", default="10,100", help="comma list of cohort sizes")
  p.add_argument("--models", default="mlp,cnn", help="comma list from mlp,cnn")
  p.add_argument("--client-cpus", default="1",
                 help="comma list of Flower client_resources num_cpus per ClientApp "
                      "(Ray actors = cores // num_cpus, each with OMP_NUM_THREADS = "
                      "num_cpus); default 1 (the docs' example; Flower's own default "
                      "is 2)")
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--budget-s", type=float, default=60.0,
                 help="fewer timed rounds (>= 2) when they would take longer")
  p.add_argument("--max-round-s", type=float, default=300.0,
                 help="skip a larger C when its predicted round (linear in C) is longer")
  p.add_argument("--timeout-s", type=float, default=1800.0,
                 help="per (client_cpus, model, C) simulation")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default=None, help="write JSON here ('-' = stdout)")
  p.add_argument("--check-training", action="store_true",
                 help="check the models' sizes, one Flower round against a torch "
                      "reference, and learning on a learnable synthetic task")
  p.add_argument("--check-rounds", type=int, default=20)
  p.add_argument("--clients-check", type=int, default=10)
  # internal: one driver process of a measurement
  p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--model", default="mlp", help=argparse.SUPPRESS)
  p.add_argument("--data", default="synthetic", choices=("synthetic", "learnable"),
                 help=argparse.SUPPRESS)
  p.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--data-dir", default=None, help=argparse.SUPPRESS)
  p.add_argument("--out", default=None, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a.rounds < 1 or a.warmup < 0:
    p.error(f"--rounds {a.rounds} / --warmup {a.warmup}: use rounds >= 1, warmup >= 0")
  if a.worker:
    a.clients = int(a.clients)
    a.client_cpus = _cpus(a.client_cpus)
    return worker_main(a)
  if a.check_training:
    return check_main(a)
  return bench_main(a)


if __name__ == "__main__":
  sys.exit(main())
