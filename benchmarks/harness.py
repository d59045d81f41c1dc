"""The benchmark harness behind ``fedjax-inv bench`` (``fedjax_inv.benchmarks.harness``):
throughput of one federated round, side by side.

For each configuration (workload × cohort size ``C``), in one process and one at a time,
the harness times:

* ``loop`` — the baseline (ratio 1.00): FedJAX's "jit backend" design (FedJAX
  ``for_each_client``): the single-client update is jit-compiled once and a Python loop
  runs it client after client, accumulating the aggregator's sums on device
  (:func:`build_loop_round`; same protocol, same randomness, same numbers as the engine);
* this engine (``core.engine.build_round``) under each execution strategy: ``auto``,
  ``vmap``, ``scan``, ``chunked`` and ``sharded`` (``vmap`` over a ``clients`` mesh, only
  when several devices exist);
* optionally the peers (``--peers``): FedJAX 0.0.17, DrJAX and PyTorch in their own
  environment (``benchmarks/peers/setup.sh``), and pfl-research 0.6.0 (PyTorch backend, MLP
  and ConvNet) in another (``benchmarks/peers/setup_pfl.sh``), merged by workload and ``C``.

Reported per row: steady-state round time (median after warm-up, min–max), client
updates per second (``C / median``), compile time, ``ratio_vs_loop`` (loop median / row
median: > 1 is faster than the loop), FLOPs per round (counted from the round's jaxpr with
loop trip counts, :func:`count_flops`; XLA's ``cost_analysis()`` counts a loop body once,
so it is reported separately for one local step × ``K`` × ``C``), achieved FLOP/s against
the machine's measured f32 matmul peak (:func:`measure_matmul_peak`), and memory: the
analytic estimate (``core.memory``), XLA's ``memory_analysis()`` of the compiled round and
the process's peak-RSS increase while the round ran.

Workloads (synthetic data of MNIST shape ``[C, 64, 28, 28, 1]``, 10 classes, labels
uniform: throughput does not depend on the pixel values):
  * ``mlp_fedavg``: FedAvg, MLP 784-128-10, 64 examples per client, 5 local SGD steps of
    batch 32 (FedAvg, McMahan et al. 2017, Alg. 1);
  * ``cnn_fedavg``: the same with the RotatedMNIST ConvNet stand-in ``models.cnn(1)``;
  * ``mlp_<alg>`` for the heavy algorithms ``fishr_inter_geo``, ``fishr_intra_geo``
    (FedILC Alg. 1/2), ``fediir`` (FedIIR Alg. 1), ``fedsr`` (FedSR §3) when the
    registry knows them.

All timings use ``time.perf_counter`` around a call followed by ``jax.block_until_ready``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable

from fedjax_inv.core import engine

HEAVY_ALGORITHMS = ("fishr_inter_geo", "fishr_intra_geo", "fediir", "fedsr")
ENGINE_IMPLS = ("auto", "vmap", "scan", "chunked", "sharded")
IMPLS = ("loop",) + ENGINE_IMPLS
CLIENT_COUNTS = (10, 100, 1000, 10000)
EXAMPLES_PER_CLIENT = 64
FEATURE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
LOCAL = dict(client_lr=0.1, local_steps=5, batch_size=32)
REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PEERS_DIR = REPO_ROOT / "benchmarks" / "peers"


# ---------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Workload:
  """One benchmark workload: a model, an algorithm and MNIST-shaped synthetic clients.

  Attributes:
    name: row label, e.g. ``'mlp_fedavg'``.
    model: ``'mlp'`` (784-128-10) or ``'cnn'`` (``models.cnn(1)``, 32-64-64 channels).
    algorithm: registry name (``fedjax_inv.algorithms``).
    hparams: keyword arguments for ``make_algorithm`` (local steps, batch size, lr).
  """
  name: str
  model: str
  algorithm: str
  hparams: tuple = tuple(sorted(LOCAL.items()))

  def make_model(self):
    from fedjax_inv import models
    if self.model == "mlp":
      return models.mlp(784, (128,), NUM_CLASSES)
    if self.model == "cnn":
      return models.cnn(1, num_outputs=NUM_CLASSES)
    raise ValueError(f"model={self.model!r}; expected 'mlp' or 'cnn'.")

  def make_algorithm(self):
    """The algorithm with the workload's local recipe; falls back to the factory's own
    defaults (returned note says so) when it fixes some of them."""
    from fedjax_inv.algorithms import make_algorithm
    try:
      return make_algorithm(self.algorithm, **dict(self.hparams)), ""
    except ValueError:
      alg = make_algorithm(self.algorithm)
      return alg, (f"{self.algorithm} fixes its local recipe: {alg.local_steps} local "
                   f"step(s) of {alg.batch_size or 'all 64'} examples, client lr "
                   f"{alg.hparams.get('client_lr')}")


def workloads(names: list[str]) -> list[Workload]:
  """``Workload`` objects for ``names`` ('mlp', 'cnn', 'heavy' or 'mlp_<algorithm>')."""
  out = []
  for n in names:
    if n in ("mlp", "mlp_fedavg"):
      out.append(Workload("mlp_fedavg", "mlp", "fedavg"))
    elif n in ("cnn", "cnn_fedavg"):
      out.append(Workload("cnn_fedavg", "cnn", "fedavg"))
    elif n == "heavy":
      out += [Workload(f"mlp_{a}", "mlp", a) for a in HEAVY_ALGORITHMS]
    elif n.startswith("mlp_") or n.startswith("cnn_"):
      model, alg = n.split("_", 1)
      out.append(Workload(n, model, alg))
    else:
      raise ValueError(f"--workloads {n!r}: use mlp, cnn, heavy, or mlp_<algorithm> / "
                       "cnn_<algorithm> with a registered algorithm name.")
  return out


def synthetic_pool(num_clients: int, n_per_client: int = EXAMPLES_PER_CLIENT,
                   feature_shape=FEATURE_SHAPE, num_classes: int = NUM_CLASSES,
                   seed: int = 0):
  """A device-resident pool of MNIST-shaped synthetic clients.

  Returns ``ClientData`` with ``x: [N, n, *feature_shape]`` float32 uniform in [0, 1),
  ``y: [N, n]`` int32 uniform in ``[0, num_classes)``, ``n: [N]`` all equal to
  ``n_per_client`` (generated on device, no host copy).

  Raises:
    ValueError: a non-positive size.
  """
  import jax
  import jax.numpy as jnp
  from fedjax_inv.core.data import ClientData
  if num_clients < 1 or n_per_client < 1 or num_classes < 2:
    raise ValueError(f"synthetic_pool: num_clients={num_clients}, n_per_client="
                     f"{n_per_client}, num_classes={num_classes}; use positive sizes and "
                     ">= 2 classes.")

  @jax.jit
  def make(key):
    kx, ky = jax.random.split(key)
    x = jax.random.uniform(kx, (num_clients, n_per_client) + tuple(feature_shape))
    y = jax.random.randint(ky, (num_clients, n_per_client), 0, num_classes)
    return x, y

  x, y = make(jax.random.key(seed))
  return ClientData(x=x, y=y, n=jnp.full((num_clients,), n_per_client, jnp.int32))


# ---------------------------------------------------------------------------------------
# The baseline: a Python loop over a jitted single-client update
# ---------------------------------------------------------------------------------------


# The loop is one more execution strategy of the engine (``execution='loop'``), built
# from the same round phases (``core.engine.round_parts``) as the jitted strategies.
LoopRound = engine.LoopRound


def loop_flops(loop: LoopRound, server, client_states, data, key) -> float:
  """FLOPs of one ``loop`` round from the jaxprs of its compiled pieces
  (:func:`count_flops`, each times the number of calls per round)."""
  return sum(n * count_flops(fn, *args)
             for n, fn, args in loop.pieces(server, client_states, data, key))


def build_loop_round(model, kind: str, algorithm, num_clients: int,
                     clients_per_round: int) -> LoopRound:
  """The baseline round (see :class:`LoopRound`).

  Raises:
    ValueError: bad loss kind or cohort size (before any compile).
  """
  return engine.build_round(model, kind, algorithm, num_clients, clients_per_round,
                            execution="loop")


# ---------------------------------------------------------------------------------------
# Measurement helpers
# ---------------------------------------------------------------------------------------

_ELEMENTWISE = frozenset((
    "add", "sub", "mul", "div", "max", "min", "neg", "exp", "exp2", "log", "log1p",
    "tanh", "logistic", "sqrt", "rsqrt", "pow", "integer_pow", "abs", "sign", "square",
    "expm1", "erf", "sin", "cos", "select_n", "clamp", "add_any", "rem", "atan2"))
_REDUCTIONS = frozenset(("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin",
                         "cumsum", "reduce_prod"))


def _size(v) -> int:
  shape = getattr(getattr(v, "aval", None), "shape", None)
  return math.prod(shape) if shape is not None else 0


from fedjax_inv.core.memory import sub_jaxprs  # noqa: E402


def _jaxpr_flops(jaxpr) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (lc, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * _size(eqn.outvars[0]) * math.prod(lhs[d] for d in lc)
    elif name == "conv_general_dilated":
      rhs = eqn.invars[1].aval.shape
      spec = eqn.params["dimension_numbers"].rhs_spec
      total += 2.0 * _size(eqn.outvars[0]) * rhs[spec[1]] * math.prod(
          rhs[d] for d in spec[2:])
    elif name == "scan":
      total += eqn.params["length"] * _jaxpr_flops(eqn.params["jaxpr"].jaxpr)
    elif name == "cond":
      total += max(_jaxpr_flops(b.jaxpr) for b in eqn.params["branches"])
    elif name in _ELEMENTWISE:
      total += sum(_size(v) for v in eqn.outvars)
    elif name in _REDUCTIONS:
      total += sum(_size(v) for v in eqn.invars)
    else:
      total += sum(_jaxpr_flops(s) for s in sub_jaxprs(eqn))  # while: body once
  return total


def count_flops(fn: Callable, *args) -> float:
  """Floating-point operations of ``fn(*args)``, counted from its jaxpr (no compile).

  ``dot_general``: ``2·|out|·Π contracted dims``; ``conv_general_dilated``:
  ``2·|out|·C_in/groups·Π kernel dims``; elementwise arithmetic: one per output element;
  reductions: one per input element; ``scan`` bodies × ``length``; ``cond``: the
  costliest branch; ``while`` bodies once (unknown trip count). Unlike XLA's
  ``compiled.cost_analysis()['flops']``, which counts each loop body once, this makes
  'scan', 'chunked' and 'vmap' rounds count the same work. ``args`` may be arrays or
  ``jax.ShapeDtypeStruct``.

  Returns:
    float FLOPs of one call.
  """
  import jax
  return _jaxpr_flops(jax.make_jaxpr(fn)(*args).jaxpr)


def measure_matmul_peak(n: int = 2048, reps: int = 5) -> float:
  """The machine's measured f32 matmul throughput in FLOP/s: best of ``reps`` timed
  ``jnp.dot`` of two ``[n, n]`` float32 matrices (``2 n³`` FLOPs each), after one
  compile-and-warm-up call.

  Raises:
    ValueError: ``n < 1`` or ``reps < 1``.
  """
  import jax
  import jax.numpy as jnp
  if n < 1 or reps < 1:
    raise ValueError(f"measure_matmul_peak: n={n}, reps={reps}; both must be >= 1.")
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return 2.0 * n ** 3 / best


def mlp_step_shapes(batch: int = LOCAL["batch_size"], sizes=(784, 128, NUM_CLASSES)
                    ) -> list[tuple[int, int, int]]:
  """``(m, k, n)`` of the matmuls in one SGD step of the MLP ``sizes`` on ``batch``
  examples: per layer ``d_in → d_out`` the forward ``[B, d_in] @ [d_in, d_out]``, the
  weight gradient ``[d_in, B] @ [B, d_out]`` and, above the first layer, the input
  gradient ``[B, d_out] @ [d_out, d_in]``."""
  out = []
  for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
    out += [(batch, a, b), (a, batch, b)] + ([(batch, b, a)] if i else [])
  return out


def measure_shape_peak(shapes, iters: int = 500, reps: int = 3) -> float:
  """f32 FLOP/s of XLA running just the matmuls ``shapes`` (``(m, k, n)`` each) back to
  back, ``iters`` times inside one ``lax.fori_loop`` (best of ``reps`` timed calls after a
  warm-up): the matmul roofline of a workload made of small matrices, which on CPU is far
  below :func:`measure_matmul_peak`'s large-square number. Each iteration writes one
  element of every left operand from the loop carry, so nothing is hoisted out.

  Raises:
    ValueError: an empty ``shapes``, a non-positive dimension, ``iters < 1``, ``reps < 1``.
  """
  import jax
  import jax.numpy as jnp
  shapes = [tuple(int(d) for d in s) for s in shapes]
  if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes) or iters < 1 or reps < 1:
    raise ValueError(f"measure_shape_peak: shapes={shapes}, iters={iters}, reps={reps}; "
                     "give (m, k, n) triples of positive ints and iters, reps >= 1.")
  mats = [(jnp.full((m, k), 0.5, jnp.float32), jnp.full((k, n), 0.5, jnp.float32))
          for m, k, n in shapes]

  def body(_, carry):
    acc, ops = carry
    new = []
    for a, b in ops:
      a = a.at[0, 0].set(acc * 1e-30)
      acc = acc + jnp.dot(a, b)[0, 0] * 1e-30
      new.append((a, b))
    return acc, new

  run = jax.jit(lambda ops: jax.lax.fori_loop(0, iters, body, (jnp.float32(0), ops))[0])
  run(mats).block_until_ready()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    run(mats).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  return sum(2.0 * m * k * n for m, k, n in shapes) * iters / best


def _proc_status(field: str) -> int | None:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    return None
  return None


def rss_bytes() -> int | None:
  """Current resident set size of this process (Linux ``VmRSS``), or None."""
  return _proc_status("VmRSS")


def reset_peak_rss() -> bool:
  """Resets the process's peak RSS (``VmHWM``) via ``/proc/self/clear_refs``; False when
  the OS does not allow it (then the peak is the process-lifetime peak)."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


def peak_rss_bytes() -> int | None:
  """Peak resident set size since the last :func:`reset_peak_rss` (``VmHWM``), else
  ``ru_maxrss``."""
  v = _proc_status("VmHWM")
  if v is not None:
    return v
  try:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  except (ImportError, OSError):
    return None


def _timed_rounds(call: Callable, state, warmup: int, rounds: int, budget_s: float):
  """Runs ``state = call(state)`` ``warmup`` times, then up to ``rounds`` timed calls
  (at least 2, fewer than ``rounds`` when they would exceed ``budget_s``)."""
  import jax
  first = None
  for _ in range(warmup):
    t0 = time.perf_counter()
    state = call(state)
    jax.block_until_ready(state)
    first = time.perf_counter() - t0
  if first and rounds > 2:
    rounds = max(2, min(rounds, int(budget_s / max(first, 1e-9))))
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    state = call(state)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t0)
  return state, times


def _mb(b) -> float | None:
  return None if b is None else round(b / 2 ** 20, 1)


def _xla_flops_local(model, kind, algorithm, data, server) -> float | None:
  """``C``-independent part: XLA cost_analysis flops of ONE client's local training with
  one local step (a loop body counted once = exactly one step), times ``K``."""
  import jax
  import jax.numpy as jnp
  from fedjax_inv.core import engine
  from fedjax_inv.core.algorithm import Context
  if any(c.init_client is not None for c in algorithm.components):
    return None
  # No component with client state, so none depends on K: one step of the same recipe.
  alg1 = algorithm.replace(local_steps=1, hparams={**algorithm.hparams, "local_steps": 1})
  ctx = Context(params=server.params, round=server.round, extras=server.extras, client={},
                num_clients=jnp.float32(1), cohort=jnp.float32(1))

  def one(x, y, n, key):
    return engine.local_train(model, kind, alg1, ctx, x, y, n, key)[0]
  try:
    ca = jax.jit(one).lower(data.x[0], data.y[0], data.n[0], jax.random.key(0)).compile()
    ca = ca.cost_analysis()
    ca = ca[0] if isinstance(ca, (list, tuple)) else ca
    return float(ca.get("flops", 0.0)) * algorithm.local_steps
  except Exception:  # cost analysis is best effort
    return None


# ---------------------------------------------------------------------------------------
# One configuration
# ---------------------------------------------------------------------------------------


def _shape_kw() -> dict:
  """``feature_shape=`` for ``build_round`` when the engine accepts it (its 'auto' then
  inspects the model)."""
  import inspect
  from fedjax_inv.core import engine
  if "feature_shape" in inspect.signature(engine.build_round).parameters:
    return dict(feature_shape=FEATURE_SHAPE)
  return {}


def _resolve_auto(model, kind, algorithm, C) -> str:
  """The strategy ``execution='auto'`` resolves to for this model and cohort."""
  from fedjax_inv.core import engine
  return engine.build_round(model, kind, algorithm, C, C, execution="auto",
                            **_shape_kw()).strategy


def _row(workload: Workload, C: int, impl: str, **kw) -> dict:
  row = dict(source="fedjax_inv", workload=workload.name, model=workload.model,
             algorithm=workload.algorithm, clients=C, pool=C, impl=impl, strategy=None,
             chunk_size=None, rounds_timed=0, round_s=None, round_s_min=None,
             round_s_max=None, client_updates_per_s=None, compile_s=None,
             ratio_vs_loop=None, gflop_per_round=None, gflops=None, pct_of_peak=None,
             xla_gflop_per_round=None, mem_estimate_mb=None, xla_temp_mb=None,
             xla_arg_mb=None, xla_out_mb=None, rss_peak_delta_mb=None, note="")
  row.update(kw)
  return row


def run_config(workload: Workload, C: int, impls: list[str], *, warmup: int, rounds: int,
               budget_s: float, peak_flops: float | None, chunk_size: int | None,
               history: dict, max_impl_s: float, fraction: float = 0.8,
               log=print) -> list[dict]:
  """Times every implementation in ``impls`` on one workload with cohort ``C`` (pool
  ``N = C``). Returns one row per implementation (skipped ones carry a ``note``).

  ``history`` maps ``(workload, impl) -> (C, median round seconds)`` of earlier rows and is
  used to skip an implementation whose predicted time (linear in ``C``) for the warm-up
  and timed rounds exceeds ``max_impl_s``.
  """
  import jax
  from fedjax_inv.core import engine, memory
  from fedjax_inv.core import strategy as strategy_lib

  task_model = workload.make_model()
  algorithm, alg_note = workload.make_algorithm()
  model = algorithm.model_for(task_model)
  kind = "multiclass"
  capacity = memory.device_memory_bytes()
  pool_bytes = C * EXAMPLES_PER_CLIENT * (math.prod(FEATURE_SHAPE) + 1) * 4
  if pool_bytes > 0.35 * capacity:
    return [_row(workload, C, i, note=f"skipped: the pool alone is {_mb(pool_bytes)} MB "
                 f"(> 35% of {_mb(capacity)} MB device memory)") for i in impls]
  data = synthetic_pool(C)
  params = model.init(0)
  key = jax.random.key(0)
  start_state = engine.init_state(algorithm, params, C)
  shape_in = jax.tree.structure(start_state[0])
  shape_out = jax.tree.structure(jax.eval_shape(
      engine.build_round(model, kind, algorithm, C, C, execution="scan").jitted,
      *start_state, data, key)[0])
  if shape_in != shape_out:
    # The algorithm's server state changes structure after round 1 (its round would
    # compile twice in a training run): time the steady state, and say so.
    rf0 = engine.build_round(model, kind, algorithm, C, C, execution="scan")
    start_state = rf0(*start_state, data, key)[:2]
    alg_note = ((alg_note + "; ") if alg_note else "") + (
        "server state changes pytree structure after round 1 (compiles twice); timed "
        "from round 2")
  ndev = jax.device_count()
  rows = []
  flops_cache: dict = {}
  xla_local = None

  def predicted_too_slow(impl):
    prev = history.get((workload.name, impl))
    if not prev:
      return None
    c0, t0 = prev
    pred = t0 * C / c0 * (warmup + min(rounds, 3))
    if pred > max_impl_s:
      return (f"skipped: predicted {pred:.0f} s for {warmup}+{min(rounds, 3)} rounds "
              f"(from {t0:.3g} s/round at C={c0}) > --max-impl-s {max_impl_s:.0f}")
    return None

  resolved_auto = _resolve_auto(model, kind, algorithm, C)
  # With several devices the engine's users get 'vmap' sharded over the clients mesh.
  auto_impl = "sharded" if ndev > 1 and resolved_auto == "vmap" else resolved_auto
  order = [i for i in impls if i != "auto"]
  if "auto" in impls and auto_impl not in order:
    order.append("auto")
  measured: dict = {}
  for impl in order:
    if impl == "sharded" and ndev < 2:
      rows.append(_row(workload, C, impl, note=f"skipped: {ndev} device (sharding needs "
                       "several; try --host-devices 8 on CPU)"))
      continue
    slow = predicted_too_slow(impl)
    if slow:
      rows.append(_row(workload, C, impl, note=slow))
      continue
    strategy = {"loop": "loop", "auto": resolved_auto, "sharded": "vmap"}.get(impl, impl)
    sharded = impl == "sharded" or (impl == "auto" and auto_impl == "sharded")
    mesh = engine.client_mesh() if sharded else None
    nd = ndev if sharded else 1
    est = None
    if strategy != "loop":
      try:
        est = memory.check_fits(task_model, algorithm, C, EXAMPLES_PER_CLIENT,
                                FEATURE_SHAPE, strategy, chunk_size, num_devices=nd,
                                capacity_bytes=capacity, fraction=fraction)
      except memory.DoesNotFitError as e:
        rows.append(_row(workload, C, impl, strategy=strategy,
                         note=f"skipped (memory estimate): {e}"))
        continue
    log(f"  {workload.name:22s} C={C:<6d} {impl:8s} ...")
    gc.collect()
    server, cstates = jax.tree.map(lambda a: a.copy() if hasattr(a, "copy") else a,
                                   start_state)
    try:
      if impl == "loop":
        rf = build_loop_round(model, kind, algorithm, C, C)
        compile_s = rf.compile(server, cstates, data, key)
        call = lambda st, rf=rf, d=data: rf(st[0], st[1], d, key)[:2]  # noqa: E731
        ma = rf.client_memory()
        flops = loop_flops(rf, server, cstates, data, key)
        chunk = None
      else:
        dat = data
        if mesh is not None and C % ndev == 0:
          from jax.sharding import NamedSharding, PartitionSpec as P
          dat = jax.device_put(data, NamedSharding(mesh, P("clients")))
        rf = engine.build_round(model, kind, algorithm, C, C, execution=strategy,
                                chunk_size=chunk_size, mesh=mesh, **_shape_kw())
        t0 = time.perf_counter()
        compiled = rf.jitted.lower(server, cstates, dat, key).compile()
        compile_s = time.perf_counter() - t0
        call = lambda st, c=compiled, d=dat: c(st[0], st[1], d, key)[:2]  # noqa: E731
        ma = compiled.memory_analysis()
        if "engine" not in flops_cache:
          flops_cache["engine"] = count_flops(rf.jitted, server, cstates, dat, key)
        flops = flops_cache["engine"]
        chunk = (strategy_lib.largest_divisor_at_most(C, chunk_size or min(C, 64))
                 if strategy == "chunked" else None)
      if xla_local is None:
        xla_local = _xla_flops_local(model, kind, algorithm, data, server) or 0.0
      rss0 = rss_bytes()
      reset_peak_rss()
      _, times = _timed_rounds(call, (server, cstates), warmup, rounds, budget_s)
      peak = peak_rss_bytes()
    except Exception as e:  # report and go on: one failing impl must not stop the bench
      rows.append(_row(workload, C, impl, strategy=strategy,
                       note=f"error: {type(e).__name__}: {str(e)[:300]}"))
      continue
    med = statistics.median(times)
    history[(workload.name, impl)] = (C, med)
    row = _row(
        workload, C, impl, strategy=strategy, chunk_size=chunk, rounds_timed=len(times),
        round_s=med, round_s_min=min(times), round_s_max=max(times),
        client_updates_per_s=C / med, compile_s=compile_s,
        gflop_per_round=flops / 1e9, gflops=flops / med / 1e9,
        pct_of_peak=(100.0 * flops / med / peak_flops) if peak_flops else None,
        xla_gflop_per_round=(xla_local * C / 1e9) if xla_local else None,
        mem_estimate_mb=_mb(est),
        xla_temp_mb=_mb(getattr(ma, "temp_size_in_bytes", None)),
        xla_arg_mb=_mb(getattr(ma, "argument_size_in_bytes", None)),
        xla_out_mb=_mb(getattr(ma, "output_size_in_bytes", None)),
        rss_peak_delta_mb=_mb((peak - rss0) if (peak is not None and rss0) else None),
        note=alg_note)
    if impl == "loop":
      row["note"] = ("jit(single-client update) + Python loop; memory columns are one "
                     "client's" + (f"; {alg_note}" if alg_note else ""))
    if impl == "sharded":
      row["note"] = f"vmap over a {ndev}-device 'clients' mesh"
    rows.append(row)
    measured[impl if impl in ("auto", "sharded") else strategy] = row
    del rf, call
  if "auto" in impls and "auto" not in measured:
    src = measured.get(auto_impl)
    if src is not None:
      rows.append(dict(src, impl="auto", note=f"auto -> {auto_impl}: the same "
                       f"compiled round as the '{auto_impl}' row"))
    else:
      rows.append(_row(workload, C, "auto", strategy=resolved_auto,
                       note=f"auto -> {auto_impl}, which was skipped"))
  add_ratios_vs_loop(rows)
  rank = {i: k for k, i in enumerate(IMPLS)}
  rows.sort(key=lambda r: rank.get(r["impl"], 99))
  del data
  gc.collect()
  return rows


# ---------------------------------------------------------------------------------------
# Peers, table, plot, summary
# ---------------------------------------------------------------------------------------


def run_peers(python: str, clients: list[int], warmup: int, rounds: int,
              timeout_s: float, log=print, *, script: str = "bench_peers.py",
              extra_args: tuple = (), setup: str = "setup.sh") -> tuple[list[dict], list[str]]:
  """Runs a peer script of ``benchmarks/peers/`` (``bench_peers.py``: FedJAX, DrJAX,
  PyTorch; ``bench_pfl.py``: pfl-research) with its environment's interpreter; returns
  ``(rows, notes)``. Never raises for a missing or failing peer: the notes say why
  (``setup`` names the script that makes the environment)."""
  label = pathlib.Path(script).stem
  script = PEERS_DIR / script
  if not script.is_file():
    return [], [f"{label}: {script} not found (run from a source checkout)."]
  if not pathlib.Path(python).exists():
    return [], [f"{label}: interpreter {python} not found; run "
                f"`bash benchmarks/peers/{setup}` first."]
  cmd = [python, str(script), "--clients", ",".join(map(str, clients)), "--warmup",
         str(warmup), "--rounds", str(rounds), "--json", "-", *extra_args]
  log(f"  {label}: " + " ".join(cmd))
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  try:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
  except subprocess.TimeoutExpired:
    return [], [f"{label}: timed out after {timeout_s:.0f} s."]
  if out.returncode != 0:
    return [], [f"{label}: exit {out.returncode}: {out.stderr.strip()[-800:]}"]
  try:
    payload = json.loads(out.stdout)
  except json.JSONDecodeError as e:
    return [], [f"{label}: unreadable output ({e}): {out.stdout[-300:]}"]
  return payload.get("rows", []), payload.get("notes", [])


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


def merge_peers(rows: list[dict], peer_rows: list[dict]) -> list[dict]:
  """Adds peer rows, with ``ratio_vs_loop`` against this package's loop row of the same
  workload and ``C``."""
  loops = {(r["workload"], r["clients"]): r for r in rows
           if r["impl"] == "loop" and r.get("round_s")}
  out = list(rows)
  for p in peer_rows:
    p = dict(p)
    loop = loops.get((p.get("workload"), p.get("clients")))
    if loop and p.get("round_s"):
      p["ratio_vs_loop"] = loop["round_s"] / p["round_s"]
    out.append(p)
  return out


# ---------------------------------------------------------------------------------------
# Whole runs: S seeds batched vs sequential; R fused rounds per call vs one per round
# ---------------------------------------------------------------------------------------


def _steady_seconds(step, state, calls: int) -> float:
  """Seconds per call of ``state = step(state)`` after one untimed (compiling) call."""
  import jax
  state = step(state)
  jax.block_until_ready(state)
  t = time.perf_counter()
  for _ in range(calls):
    state = step(state)
  jax.block_until_ready(state)
  return (time.perf_counter() - t) / calls


def measure_runs(workload: "Workload", C: int, *, replicas: int = 0, fused: int = 0,
                 rounds: int = 20, log=lambda s: None) -> list[dict]:
  """Run-level throughput (issue 13) on synthetic MNIST-shaped clients (pool N = C),
  timing the engine's jitted calls after compiling (steady state):

  * ``replicas=S``: one round of S seeds as one vmapped call
    (``replicas.batched_round``) vs S single-seed round calls; rows
    ``replicas_sequential_xS`` / ``replicas_batched_xS`` (ms per round of all S runs),
    ``speedup`` = sequential / batched.
  * ``fused=R``: ``R`` rounds in one call (``simulation.build_fused_rounds``) vs one call
    per round; rows ``per_round_call`` / ``fused_R`` (ms per round), ``speedup`` =
    per-round / fused.

  ``rounds``: rounds timed per row. Returns rows ``{workload, clients, impl,
  ms_per_round, speedup}``.

  Raises:
    ValueError: ``replicas`` or ``fused`` below 0, ``rounds`` < 1.
  """
  import jax
  import jax.numpy as jnp
  from fedjax_inv import simulation
  from fedjax_inv.core.engine import init_state
  from fedjax_inv.replicas import batched_round, stacked_state
  from fedjax_inv.tasks import Task
  if replicas < 0 or fused < 0 or rounds < 1:
    raise ValueError(f"replicas={replicas}, fused={fused}, rounds={rounds}: use "
                     "replicas/fused >= 0 and rounds >= 1.")
  model = workload.make_model()
  alg, _ = workload.make_algorithm()
  task = Task(f"bench_{workload.name}", "multiclass", synthetic_pool(C), {}, model, {})
  p = simulation.prepare(task, alg, rounds, None, "auto", None, None, True, None,
                         max(1, fused))
  data, key = task.train, jax.random.key(0)
  rows = []

  def row(impl, sec, speedup=None):
    log(f"  {workload.name} C={C} {impl}: {1e3 * sec:.1f} ms/round"
        + ("" if speedup is None else f" (x{speedup:.2f})"))
    rows.append(dict(workload=workload.name, clients=C, impl=impl, ms_per_round=1e3 * sec,
                     speedup=speedup))

  def one_round(st):
    s, c = st
    s, c, _ = p.round_fn(s, c, data, key)
    return s, c
  per = _steady_seconds(one_round, init_state(alg, p.model.init(0), C), rounds)
  if replicas:
    S = replicas
    vround = batched_round(p.round_fn)
    server, cstates, keys = stacked_state(alg, p.model, C, range(S))

    def batched(st):
      s, c = st
      s, c, _ = vround(s, c, data, keys)
      return s, c
    bat = _steady_seconds(batched, (server, cstates), rounds)
    row(f"replicas_sequential_x{S}", S * per)
    row(f"replicas_batched_x{S}", bat, S * per / bat)
  if fused:
    bad = jnp.zeros((), jnp.int32)

    def fused_call(st):
      s, c = st
      s, c, _, _ = p.fused(s, c, data, key, bad, 1, fused)
      return s, c
    fus = _steady_seconds(fused_call, init_state(alg, p.model.init(0), C),
                          max(1, rounds // fused)) / fused
    row("per_round_call", per)
    row(f"fused_{fused}", fus, per / fus)
  return rows


def _fmt(v, spec="{:.3g}", none="-"):
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
        f"{_fmt(r.get('client_updates_per_s'), '{:.0f}'):>8s} "
        f"{_fmt(r.get('ratio_vs_loop'), '{:.2f}'):>6s} "
        f"{_fmt(r.get('compile_s'), '{:.1f}'):>7s} {_fmt(r.get('gflops'), '{:.1f}'):>7s} "
        f"{_fmt(r.get('pct_of_peak'), '{:.1f}'):>5s} "
        f"{_fmt(r.get('mem_estimate_mb'), '{:.0f}'):>7s} {_fmt(xla, '{:.0f}'):>7s} "
        f"{_fmt(r.get('rss_peak_delta_mb'), '{:.0f}'):>7s}")
    if r.get("note") and (not r.get("round_s") or r["impl"] in ("auto",)):
      notes.append(f"  {r['workload']} C={r['clients']} {r['impl']}: {r['note']}")
  return "\n".join(lines + (["", "notes:"] + notes if notes else []))


def summarize(rows: list[dict]) -> dict:
  """The issue's targets, computed from the rows (None / empty where a row is missing):
  ``auto_vs_loop_at_1000`` (target >= 1.7), ``auto_vs_loop_min`` over C (>= 1.0),
  ``auto_vs_torch_loop`` per C against the fastest PyTorch row (>= 3), ``auto_vs_pfl``
  per workload and C against pfl-research's fastest layout (issues 23, 30),
  ``fishr_inter_geo_vs_fedavg`` per C (<= 1.3; FedAvg runs 5 local steps of 32 examples,
  fishr_inter_geo one full-batch step) and ``fishr_inter_geo_vs_fedsgd`` (the same local
  work as fishr_inter_geo)."""
  def get(workload, impl, C):
    return next((r for r in rows if r["workload"] == workload and r["impl"] == impl
                 and r["clients"] == C and r.get("round_s")), None)
  Cs = sorted({r["clients"] for r in rows})
  auto = {C: get("mlp_fedavg", "auto", C) for C in Cs}
  ratios = {C: r["ratio_vs_loop"] for C, r in auto.items() if r and r.get("ratio_vs_loop")}
  torch = {}
  for C in Cs:
    ts = [r["round_s"] for r in rows if r["workload"] == "mlp_fedavg" and r["clients"] == C
          and r.get("source") == "peer" and r["impl"].startswith("torch")
          and r.get("round_s")]
    if ts and auto.get(C):
      torch[C] = min(ts) / auto[C]["round_s"]  # against the fastest PyTorch setting
  pfl = {}
  for w in ("mlp_fedavg", "cnn_fedavg"):
    for C in Cs:
      ps = [r["round_s"] for r in rows if r["workload"] == w and r["clients"] == C
            and r.get("source") == "peer" and r["impl"].startswith("pfl")
            and r.get("round_s")]
      a = get(w, "auto", C)
      if ps and a:
        pfl.setdefault(w, {})[C] = min(ps) / a["round_s"]  # against pfl's fastest layout
  fishr, fishr_sgd = {}, {}
  for C in Cs:
    f, a, g = (get("mlp_fishr_inter_geo", "auto", C), auto.get(C),
               get("mlp_fedsgd", "auto", C))
    if f and a:
      fishr[C] = f["round_s"] / a["round_s"]
    if f and g:
      fishr_sgd[C] = f["round_s"] / g["round_s"]
  return dict(auto_vs_loop_at_1000=ratios.get(1000),
              auto_vs_loop_min=min(ratios.values()) if ratios else None,
              auto_vs_loop=ratios, auto_vs_torch_loop=torch, auto_vs_pfl=pfl,
              fishr_inter_geo_vs_fedavg=fishr, fishr_inter_geo_vs_fedsgd=fishr_sgd,
              targets=dict(auto_vs_loop_at_1000=">= 1.7", auto_vs_loop_min=">= 1.0",
                           auto_vs_torch_loop=">= 3", fishr_inter_geo_vs_fedavg="<= 1.3",
                           auto_vs_pfl="mlp >= 3 at C >= 100; cnn >= 1.2 at C = 100, 1000"))


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


def machine_info() -> dict:
  """CPU model and core count (``lscpu``), platform, JAX version and devices, and the XLA
  flags in effect (``cpu_flags``: what ``fedjax_inv.xla_cpu`` added)."""
  import jax
  from fedjax_inv import xla_cpu
  model = platform.processor() or "unknown"
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
      if line.startswith("Model name:"):
        model = line.split(":", 1)[1].strip()
  except (OSError, subprocess.SubprocessError):
    pass
  try:
    load = os.getloadavg()
  except OSError:
    load = None
  return dict(cpu=model, cores=os.cpu_count(), platform=platform.platform(),
              python=platform.python_version(), jax=jax.__version__,
              backend=jax.default_backend(), devices=jax.device_count(),
              device_kind=jax.devices()[0].device_kind, loadavg_start=load,
              cpu_flags=xla_cpu.status())


# ---------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------

QUICK = dict(plan=[("mlp", (10, 100), ("loop", "auto", "vmap", "chunked", "sharded")),
                   ("mlp_fishr_inter_geo", (10,), ("loop", "auto")),
                   ("mlp_fediir", (10,), ("loop", "auto")),
                   ("mlp_fedsr", (10,), ("loop", "auto"))],
             warmup=1, rounds=3, budget_s=5.0, max_impl_s=30.0, matmul_n=1024)
FULL = dict(plan=[("mlp", CLIENT_COUNTS, IMPLS),
                  ("mlp_fedsgd", (10, 100, 1000), ("loop", "auto")),
                  ("heavy", (10, 100, 1000), ("loop", "auto", "vmap", "sharded")),
                  ("cnn", (10, 100), ("loop", "auto", "vmap", "sharded"))],
            warmup=1, rounds=5, budget_s=60.0, max_impl_s=240.0, matmul_n=2048)


def _csv(s: str, typ=str) -> list:
  try:
    return [typ(v) for v in s.split(",") if v.strip()]
  except ValueError:
    raise ValueError(f"expected a comma-separated list of {typ.__name__}, got {s!r}.")


def add_parser(subparsers) -> argparse.ArgumentParser:
  """Registers ``fedjax-inv bench`` (``args.func = cmd_bench``)."""
  p = subparsers.add_parser(
      "bench", help="round throughput: engine strategies vs a per-client loop (and peers)",
      description=__doc__.split("\n\n")[0])
  p.add_argument("--quick", action="store_true",
                 help="small plan (MLP FedAvg C=10,100; fishr_inter_geo, fediir, fedsr "
                      "C=10), < 2 min on 2 idle CPU cores")
  p.add_argument("--workloads", help="comma list: mlp, cnn, heavy, mlp_<algorithm> "
                 "(default: the plan's)")
  p.add_argument("--clients", help="comma list of cohort sizes C (default 10,100,1000,"
                 "10000; --quick 10,100)")
  p.add_argument("--impls", help=f"comma list from {','.join(IMPLS)} (default all)")
  p.add_argument("--rounds", type=int, help="timed rounds per row (default 5; quick 3)")
  p.add_argument("--warmup", type=int, help="untimed rounds after compiling (default 1)")
  p.add_argument("--chunk-size", type=int, default=None,
                 help="clients per chunk for 'chunked' (default the engine's min(C, 64))")
  p.add_argument("--max-impl-s", type=float, default=None,
                 help="skip an implementation whose predicted time at the next C exceeds "
                      "this (default 240; quick 30)")
  p.add_argument("--replicas", type=int, default=0, metavar="S",
                 help="instead of the plan: S seeds batched as one program vs S sequential "
                      "runs, per workload and C (run_replicas)")
  p.add_argument("--fused", type=int, default=0, metavar="R",
                 help="instead of the plan: R rounds per device call vs one call per "
                      "round, per workload and C (simulation.run(rounds_per_call=R))")
  p.add_argument("--json", metavar="FILE", help="write rows + meta as JSON ('-' = stdout)")
  p.add_argument("--plot", metavar="PNG", help="plot client updates/s vs C (mlp_fedavg)")
  p.add_argument("--peers", action="store_true",
                 help="also run benchmarks/peers/bench_peers.py (FedJAX, DrJAX, PyTorch) and "
                      "bench_pfl.py (pfl-research, MLP and ConvNet) "
                      "in its own environment and merge the rows")
  p.add_argument("--peers-python", default=str(PEERS_DIR / ".venv" / "bin" / "python"),
                 help="interpreter of the peers' environment (benchmarks/peers/setup.sh)")
  p.add_argument("--pfl-python", default=str(PEERS_DIR / ".venv-pfl" / "bin" / "python"),
                 help="interpreter of pfl-research's environment "
                      "(benchmarks/peers/setup_pfl.sh); used with --peers")
  p.add_argument("--host-devices", type=int, default=None,
                 help="CPU only: split the host into N XLA devices (sets XLA_FLAGS before "
                      "JAX starts) so the 'sharded' row runs")
  p.add_argument("--no-matmul-peak", action="store_true",
                 help="skip measuring the f32 matmul peak (no %%peak column)")
  p.set_defaults(func=cmd_bench)
  return p


def _plan(args) -> tuple[dict, list[tuple[list, tuple, tuple]]]:
  cfg = dict(QUICK if args.quick else FULL)
  if args.rounds is not None:
    if args.rounds < 1:
      raise ValueError(f"--rounds {args.rounds}: use >= 1 timed rounds.")
    cfg["rounds"] = args.rounds
  if args.warmup is not None:
    if args.warmup < 0:
      raise ValueError(f"--warmup {args.warmup}: use >= 0.")
    cfg["warmup"] = args.warmup
  if args.max_impl_s is not None:
    cfg["max_impl_s"] = args.max_impl_s
  if args.chunk_size is not None and args.chunk_size < 1:
    raise ValueError(f"--chunk-size {args.chunk_size}: use a positive int.")
  impls = _csv(args.impls) if args.impls else None
  for i in impls or ():
    if i not in IMPLS:
      raise ValueError(f"--impls {i!r}: choose from {IMPLS}.")
  clients = _csv(args.clients, int) if args.clients else None
  for c in clients or ():
    if c < 1:
      raise ValueError(f"--clients {c}: cohort sizes must be >= 1.")
  plan = []
  if args.workloads:
    for w in _csv(args.workloads):
      ws = workloads([w])
      plan.append((ws, tuple(clients or (CLIENT_COUNTS if not args.quick else (10, 100)))
                   , tuple(impls or IMPLS)))
  else:
    for w, cs, im in cfg["plan"]:
      plan.append((workloads([w]), tuple(clients or cs), tuple(impls or im)))
  return cfg, plan


def _write_json(path: str | None, payload: dict) -> None:
  """Writes ``payload`` to ``path`` (also after every configuration, with
  ``meta.partial = True``, so an interrupted run keeps what it measured)."""
  if not path or path == "-":
    return
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(str(path) + ".tmp")
  tmp.write_text(json.dumps(payload, indent=1, default=str))
  tmp.replace(path)


def _backends_started() -> bool:
  """Whether JAX has created its backends (after which XLA_FLAGS has no effect)."""
  from fedjax_inv import xla_cpu
  return xla_cpu.backends_started()


def cmd_bench(args) -> int:
  """Runs the benchmark plan; prints the table (and JSON with ``--json``). Exit 0."""
  cfg, plan = _plan(args)
  if args.host_devices:
    if _backends_started():
      print("fedjax-inv bench: JAX's backends are already initialized; --host-devices is "
            "ignored (set XLA_FLAGS=--xla_force_host_platform_device_count=N instead).",
            file=sys.stderr)
    else:  # XLA reads the flag when the CPU backend starts, not at `import jax`
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                 f" --xla_force_host_platform_device_count="
                                 f"{args.host_devices}").strip()
  import jax  # noqa: F401  (initialize the backend after XLA_FLAGS is set)
  from fedjax_inv.algorithms import registry
  t_start = time.perf_counter()
  log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
  meta = machine_info()
  meta.update(date=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              command="fedjax-inv " + " ".join(sys.argv[1:]) if sys.argv else "",
              workload_data="synthetic MNIST-shaped clients: x uniform [0,1) of shape "
              f"[C, {EXAMPLES_PER_CLIENT}, 28, 28, 1], 10 uniform labels; pool N = C",
              local=dict(LOCAL), warmup=cfg["warmup"], rounds=cfg["rounds"])
  peak = None
  if not args.no_matmul_peak:
    log(f"measuring f32 matmul peak (n={cfg['matmul_n']}) ...")
    peak = measure_matmul_peak(cfg["matmul_n"])
  meta["matmul_peak_gflops"] = None if peak is None else peak / 1e9
  if not args.no_matmul_peak:
    log("measuring the MLP step's matmul roofline (batch 32, 784-128-10) ...")
    meta["mlp_step_matmul_peak_gflops"] = measure_shape_peak(mlp_step_shapes()) / 1e9
  known = registry()
  rows, notes, history = [], [], {}
  if args.replicas or args.fused:
    if args.replicas < 0 or args.fused < 0:
      raise ValueError(f"--replicas {args.replicas} / --fused {args.fused}: use >= 1.")
    for ws, clients, _ in plan:
      for w in ws:
        for C in clients:
          rows += measure_runs(w, C, replicas=args.replicas, fused=args.fused,
                               rounds=max(2 * args.fused, 4 * cfg["rounds"]),
                               log=log)
          _write_json(args.json, dict(meta=dict(meta, partial=True), rows=rows, notes=[]))
    print("\n".join(f"{r['workload']:14s} C={r['clients']:<6d} {r['impl']:28s} "
                     f"{r['ms_per_round']:9.2f} ms/round"
                     + ("" if r["speedup"] is None else f"  x{r['speedup']:.2f}")
                     for r in rows))
    meta["seconds"] = time.perf_counter() - t_start
    _write_json(args.json, dict(meta=meta, rows=rows, notes=[]))
    return 0
  for ws, clients, impls in plan:
    for w in ws:
      if w.algorithm not in known:
        notes.append(f"{w.name}: algorithm {w.algorithm!r} is not registered yet; "
                     "skipped.")
        continue
      for C in clients:
        rows += run_config(w, C, list(impls), warmup=cfg["warmup"], rounds=cfg["rounds"],
                           budget_s=cfg["budget_s"], peak_flops=peak,
                           chunk_size=args.chunk_size, history=history,
                           max_impl_s=cfg["max_impl_s"], log=log)
        _write_json(args.json, dict(meta=dict(meta, partial=True), rows=rows, notes=notes,
                                    summary=summarize(rows)))
  if args.peers:
    mlp_clients = sorted({r["clients"] for r in rows if r["workload"] == "mlp_fedavg"})
    prow, pnotes = run_peers(args.peers_python, mlp_clients or [10, 100], cfg["warmup"],
                             cfg["rounds"], timeout_s=1800, log=log)
    rows = merge_peers(rows, prow)
    notes += pnotes
    # pfl-research (its own environment): the MLP and the ConvNet at this run's C values.
    for model, workload in (("mlp", "mlp_fedavg"), ("cnn", "cnn_fedavg")):
      cs = sorted({r["clients"] for r in rows
                   if r["workload"] == workload and r.get("source") != "peer"})
      if not cs:
        continue
      prow, pnotes = run_peers(args.pfl_python, cs, cfg["warmup"], cfg["rounds"],
                               timeout_s=3600, log=log, script="bench_pfl.py",
                               extra_args=("--models", model), setup="setup_pfl.sh")
      rows = merge_peers(rows, prow)
      notes += pnotes
  try:
    meta["loadavg_end"] = os.getloadavg()
  except OSError:
    pass
  meta["seconds"] = time.perf_counter() - t_start
  summary = summarize(rows)
  shape_peak = meta.get("mlp_step_matmul_peak_gflops")
  summary["auto_pct_of_mlp_step_matmul_peak"] = {
      r["clients"]: 100.0 * r["gflops"] / shape_peak for r in rows
      if shape_peak and r["workload"] == "mlp_fedavg" and r["impl"] == "auto"
      and r.get("gflops")}
  print(format_table(rows))
  if notes:
    print("\n" + "\n".join(notes))
  print("\nsummary: " + json.dumps({k: v for k, v in summary.items() if k != "targets"},
                                   default=str))
  print(f"matmul peak {_fmt(meta['matmul_peak_gflops'], '{:.1f}')} GFLOP/s (MLP step "
        f"shapes: {_fmt(meta.get('mlp_step_matmul_peak_gflops'), '{:.1f}')}); "
        f"{meta['cpu']}, {meta['cores']} cores, jax {meta['jax']}, "
        f"{meta['devices']} device(s); load {meta['loadavg_start']} -> "
        f"{meta.get('loadavg_end')}; {meta['seconds']:.0f} s")
  payload = dict(meta=meta, rows=rows, notes=notes, summary=summary)
  if args.json == "-":
    print(json.dumps(payload, indent=1, default=str))
  else:
    _write_json(args.json, payload)
  if args.plot:
    plot_throughput(rows, args.plot)
  return 0
