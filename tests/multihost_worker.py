"""One process of a multi-host federated run (tests/test_multihost.py, docs/multihost.md).

Launch the same script once per process. Two local CPU processes with 4 devices each:

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/multihost_worker.py \
      --coordinator 127.0.0.1:12355 --num-processes 2 --process-id 0 --out p0.json &
  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/multihost_worker.py \
      --coordinator 127.0.0.1:12355 --num-processes 2 --process-id 1 --out p1.json

With ``--num-processes 1`` (the default) it is the ordinary single-process run, no
``jax.distributed`` at all. On SLURM / TPU pods pass ``--auto`` (JAX reads the cluster
from the environment). Each process writes its view of the result (final parameters,
per-round train loss, sampled clients, placement facts) as JSON.
"""
import argparse
import json


def client_examples(i: int, n_max: int, dim: int, classes: int):
  """Client ``i``'s data, a function of ``i`` alone (any process can load any client
  without generating the others): ``x [n_i, dim]``, ``y [n_i]``, ``3 <= n_i <= n_max``."""
  import numpy as np
  rng = np.random.default_rng([7, i])
  n = int(rng.integers(3, n_max + 1))
  shift = rng.normal(size=dim)
  x = (rng.normal(size=(n, dim)) + shift).astype(np.float32)
  y = rng.integers(0, classes, n).astype(np.int32)
  return x, y


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--coordinator", default=None, help="host:port of process 0")
  ap.add_argument("--num-processes", type=int, default=1)
  ap.add_argument("--process-id", type=int, default=0)
  ap.add_argument("--auto", action="store_true",
                  help="jax.distributed.initialize() from the cluster environment")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--out", required=True)
  args = ap.parse_args(argv)

  from fedjax_inv.core import multihost
  # 1. Connect the processes: before ANY other JAX call.
  if args.auto:
    multihost.initialize()
  elif args.num_processes > 1:
    multihost.initialize(args.coordinator, args.num_processes, args.process_id)

  import jax
  from fedjax_inv import models
  from fedjax_inv.algorithms import make_algorithm
  from fedjax_inv.core import engine
  from fedjax_inv.core.data import from_client_arrays

  # 2. The global 'clients' mesh over every process's devices.
  mesh = engine.client_mesh()
  N, C, n_max, dim, classes = 32, 16, 12, 6, 3

  # 3. Each process loads only its own clients and the global pool is stitched together.
  rows = multihost.local_client_range(N, mesh)
  xs, ys = zip(*(client_examples(i, n_max, dim, classes) for i in rows))
  local = from_client_arrays(xs, ys, n_max=n_max)   # [N / processes, n_max, dim] host
  pool = multihost.global_client_data(local, mesh, N)  # [N, n_max, dim], P('clients')

  # 4. The single-host engine, unchanged: same seed everywhere -> identical state.
  model = models.mlp(dim, (8,), classes)
  out = {"process_index": jax.process_index(), "process_count": jax.process_count(),
         "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
         "rows": [rows.start, rows.stop],
         "pool_local_shards": len(pool.x.addressable_shards),
         "pool_global_shape": list(pool.x.shape)}
  for alg_name, execution in (("fedavg", "vmap"), ("scaffold", "chunked")):
    alg = make_algorithm(alg_name, client_lr=0.2, local_steps=3, batch_size=4)
    round_fn = engine.build_round(model, "multiclass", alg, N, C, execution=execution,
                                  chunk_size=8, mesh=mesh)
    server, client_states = engine.init_state(alg, model.init(0), N)
    server, key = multihost.replicate((server, jax.random.key(0)), mesh)
    client_states = multihost.shard_clients(client_states, mesh)  # SCAFFOLD's c_i
    losses, cohorts = [], []
    for _ in range(args.rounds):
      server, client_states, metrics = round_fn(server, client_states, pool, key)
      m = multihost.to_host(metrics)   # replicated: read on every process
      losses.append(float(m["train_loss"]))
      cohorts.append(m["clients"].tolist())
    out[alg_name] = {
        "train_loss": losses, "clients": cohorts,
        "params": [a.tolist() for a in jax.tree.leaves(multihost.to_host(server.params))],
        "client_states": [float(abs(a).sum()) for a in
                          jax.tree.leaves(multihost.to_host(client_states))]}
  with open(args.out, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  main()
