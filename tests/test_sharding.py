"""The client axis sharded over 8 (virtual CPU) devices gives the unsharded numbers, and
a 100,000-client pool runs rounds with its data resident on device.

The 8-device checks run in a subprocess, because ``XLA_FLAGS`` must be set before JAX is
imported (shard the client axis over a ``clients`` mesh: docs/ARCHITECTURE.md, 'A round
is a map-reduce over a client axis').
"""
import json
import os
import subprocess
import sys
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_inv import models
from fedjax_inv.algorithms import make_algorithm
from fedjax_inv.core import engine
from fedjax_inv.core.data import ClientData
from tests.trees import max_abs_diff

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import json
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from fedjax_inv import models
    from fedjax_inv.algorithms import make_algorithm
    from fedjax_inv.core import engine
    from fedjax_inv.core.data import ClientData

    out = {"device_count": jax.device_count()}
    rng = np.random.default_rng(0)
    N, C, n_max = 40, 16, 12
    data = ClientData(x=jnp.asarray(rng.normal(size=(N, n_max, 6)).astype(np.float32)),
                      y=jnp.asarray(rng.integers(0, 3, (N, n_max)).astype(np.int32)),
                      n=jnp.asarray(rng.integers(3, n_max + 1, N).astype(np.int32)))
    model = models.mlp(6, (8,), 3)
    alg = make_algorithm("fedavg", client_lr=0.2, local_steps=3, batch_size=4)
    mesh = engine.client_mesh()
    out["mesh"] = None if mesh is None else dict(mesh.shape)
    key = jax.random.key(0)
    for strategy in ("vmap", "chunked"):
      res = {}
      for name, m in (("plain", None), ("sharded", mesh)):
        rf = engine.build_round(model, "multiclass", alg, N, C, execution=strategy,
                                chunk_size=8, mesh=m)
        server, cs = engine.init_state(alg, model.init(0), N)
        lowered = rf.jitted.lower(server, cs, data, key)
        compiled = lowered.compile()
        hlo = compiled.as_text()
        res[name + "_all_reduce"] = "all-reduce" in hlo
        res[name + "_partitions8"] = "num_partitions=8" in hlo
        # 16 sampled clients over 8 devices: 2 clients' [12, 6] data per device
        res[name + "_per_device_cohort"] = "f32[2,12,6]" in hlo
        res[name + "_annotated"] = '{"clients"}' in lowered.as_text()
        for _ in range(3):
          server, cs, metrics = compiled(server, cs, data, key)
        res[name + "_params"] = [np.asarray(l).tolist() for l in
                                 jax.tree.leaves(server.params)]
        res[name + "_loss"] = float(metrics["train_loss"])
      out[strategy] = res

    # 'auto' off a single CPU device: vmap for dense models; chunks for a ConvNet above
    # memory.CONV_VMAP_MAX clients per device (built only: the rule, not a compile).
    from fedjax_inv.core import memory
    cnn, lim = models.cnn(1, num_outputs=3), memory.CONV_VMAP_MAX
    for name, mdl, feat, c in (("dense", model, (6,), 16 * lim), ("conv_small", cnn,
                               (12, 12, 1), 8 * lim), ("conv_big", cnn, (12, 12, 1),
                               16 * lim)):
      rf = engine.build_round(mdl, "multiclass", alg, c, c, execution="auto", mesh=mesh,
                              feature_shape=feat, n_max=n_max)
      out["auto_" + name] = [rf.strategy, rf.chunk_size]

    # A packed host pool on the 8 devices: each round's cohort is sent and sharded over
    # the mesh (not the pool); the same numbers as the sharded device pool.
    from fedjax_inv.runner import simulation
    from fedjax_inv.tasks import Task
    task = Task("s", "multiclass", data, {}, model, {})
    alg2 = make_algorithm("scaffold", client_lr=0.2, local_steps=3, batch_size=4)
    kw = dict(rounds=2, clients_per_round=16, eval_every=1, progress=False,
              execution="vmap", seed=0)
    a = simulation.run(task, alg2, pool="device", **kw)
    b = simulation.run(task, alg2, pool="host", **kw)
    out["host_pool"] = [b.pool["residency"], b.pool["programs_at_once"],
                        b.pool["clients_with_state"]]
    out["host_pool_diff"] = max(jax.tree.leaves(jax.tree.map(
        lambda u, v: float(jnp.max(jnp.abs(u - v))), a.params, b.params)))

    # 100,000 clients sharded by client over the 8 devices; 1,000 sampled per round.
    N = 100_000
    pool = ClientData(x=jax.random.normal(jax.random.key(1), (N, 4, 8)),
                      y=jax.random.randint(jax.random.key(2), (N, 4), 0, 2),
                      n=jnp.full((N,), 4, jnp.int32))
    pool = jax.device_put(pool, NamedSharding(mesh, P("clients")))
    out["pool_devices"] = len(pool.x.sharding.device_set)
    tiny = models.mlp(8, (4,), 1)
    alg = make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=4)
    rf = engine.build_round(tiny, "binary", alg, N, 1000, execution="vmap", mesh=mesh)
    server, cs = engine.init_state(alg, tiny.init(0), N)
    # The server state starts replicated over the mesh (one placement before the loop).
    server, key = jax.device_put((server, key), NamedSharding(mesh, P()))
    p0 = server.params
    with jax.transfer_guard("disallow"):
      for _ in range(2):
        server, cs, metrics = rf(server, cs, pool, key)
      jax.block_until_ready(server)
    out["scale_rounds"] = int(server.round)
    # jax.tree.map pairs the leaves by structure (it raises if the trees differ).
    out["scale_moved"] = max(jax.tree.leaves(jax.tree.map(
        lambda a, b: float(jnp.max(jnp.abs(a - b))), server.params, p0)))
    out["scale_unique"] = int(np.unique(np.asarray(metrics["clients"])).size)
    print("RESULT" + json.dumps(out))
""")


def _run_8_devices():
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
  return json.loads(line[len("RESULT"):])


_CACHE = {}


def result():
  if "r" not in _CACHE:
    _CACHE["r"] = _run_8_devices()
  return _CACHE["r"]


@pytest.mark.multiprocess  # the 8-device subprocess (result())
def test_eight_devices_and_mesh():
  r = result()
  assert r["device_count"] == 8
  assert r["mesh"] == {"clients": 8}


@pytest.mark.multiprocess  # the 8-device subprocess (result())
def test_sharded_rounds_equal_unsharded():
  r = result()
  for strategy in ("vmap", "chunked"):
    res = r[strategy]
    # The leaves came back as JSON lists: compare them as a list of arrays (chex checks
    # the leaf count and numpy each leaf's shape).
    chex.assert_trees_all_close([np.asarray(a) for a in res["plain_params"]],
                                [np.asarray(b) for b in res["sharded_params"]],
                                rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(res["plain_loss"], res["sharded_loss"], rtol=1e-5)


@pytest.mark.multiprocess  # the 8-device subprocess (result())
def test_auto_chunks_a_convnet_cohort_above_the_per_device_limit():
  from fedjax_inv.core import memory
  r = result()
  assert r["auto_dense"] == ["vmap", None]
  assert r["auto_conv_small"] == ["vmap", None]  # 8 devices x CONV_VMAP_MAX clients
  assert r["auto_conv_big"] == ["chunked", 8 * memory.CONV_CHUNK]


@pytest.mark.multiprocess  # the 8-device subprocess (result())
def test_client_axis_is_actually_sharded():
  """The sharded round constrains the client axis to the 'clients' mesh axis, XLA
  partitions it 8 ways and sums the clients' statistics with a cross-device all-reduce;
  the unsharded round has none of these."""
  r = result()
  for strategy in ("vmap", "chunked"):
    res = r[strategy]
    for k in ("annotated", "partitions8", "all_reduce"):
      assert res["sharded_" + k], (strategy, k)
      assert not res["plain_" + k], (strategy, k)
  assert r["vmap"]["sharded_per_device_cohort"] and not r["vmap"]["plain_per_device_cohort"]


@pytest.mark.multiprocess  # the 8-device subprocess (result())
def test_100k_client_pool_sharded_runs_without_host_transfers():
  r = result()
  assert r["pool_devices"] == 8
  assert r["scale_rounds"] == 2
  assert r["scale_moved"] > 1e-4
  assert r["scale_unique"] == 1000  # sampling without replacement


def test_100k_client_pool_single_device_stays_on_device():
  """2 rounds of 1,000 of 100,000 tiny clients (4 examples × 8 features) under 'auto',
  with every implicit host<->device transfer forbidden inside the loop."""
  N = 100_000
  pool = ClientData(x=jax.random.normal(jax.random.key(1), (N, 4, 8)),
                    y=jax.random.randint(jax.random.key(2), (N, 4), 0, 2),
                    n=jnp.full((N,), 4, jnp.int32))
  model = models.mlp(8, (4,), 1)
  alg = make_algorithm("fedavg", client_lr=0.1, local_steps=2, batch_size=4)
  rf = engine.build_round(model, "binary", alg, N, 1000, execution="auto")
  server, cs = engine.init_state(alg, model.init(0), N)
  key = jax.random.key(0)
  p0 = server.params
  seen = []
  with jax.transfer_guard("disallow"):
    for _ in range(2):
      server, cs, metrics = rf(server, cs, pool, key)
      seen.append(metrics["clients"])
    jax.block_until_ready(server)
  assert int(server.round) == 2
  a, b = (np.asarray(s) for s in seen)
  assert np.unique(a).size == 1000 and not np.array_equal(np.sort(a), np.sort(b))
  assert max_abs_diff(server.params, p0) > 1e-4


@pytest.mark.multiprocess  # the 8-device subprocess (result())
def test_host_pool_on_eight_devices_equals_the_device_pool():
  """A packed host pool with a mesh: the streamed cohort's client axis is sharded like
  the resident one's, one program per round, per-client state kept on the host."""
  r = result()
  residency, programs, with_state = r["host_pool"]
  assert (residency, programs) == ("host", 1) and with_state > 0
  assert r["host_pool_diff"] < 1e-5
