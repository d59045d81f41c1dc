"""Analytic memory estimate of one federated round, before anything is compiled.

The engine (``core/engine.py``) runs a round as map-reduces over a client axis. How many
clients are *resident at once* decides the memory: all ``C`` under ``vmap``, one loop
iteration (``SCAN_UNROLL`` clients) under ``scan``, ``chunk_size`` under ``chunked``
(divided by the number of devices when the client axis is sharded). This module
estimates the bytes a round needs from the model, the algorithm and the data shapes only
(``jax.eval_shape`` / ``jax.make_jaxpr``, no compilation, no device memory), so that a
strategy can be chosen, or refused with a clear message, before XLA would run out of
memory.

The estimate (bytes, float32 unless the pytrees say otherwise)::

    total = resident clients' data    R · (n_max · |x| + n_max · |y| + 4)
          + resident clients R  ×  per-client bytes
          + stacked per-client outputs    C · |client state|                    / D
          + server state                  |params| + |server opt state| + |extras|

    per-client bytes = params copies      4 · |params|   (local model, gradient,
                                                          optimizer update, delta)
                     + |client opt state| + |lifted aggregator stats|
                     + 2 · |client state| (gathered in, updated out; with
                                          client_optimizer_state='persistent'
                                          it includes the client opt state)
                     + |params| per message / pre-message component
                     + 6 · B · |params|  when a component replaces the gradient
                                          estimator (per-sample gradients, FedILC
                                          intra-silo geometric mean)
                     + activations        2 · U · B · a  (forward values kept for the
                                                          backward pass + their
                                                          cotangents; U = local steps
                                                          unrolled together, K on CPU
                                                          for K <= 16, else 1)
                     + the minibatches    m · B · (|x| + |y|)   (m = K when the engine
                                                          pre-gathers all K local steps'
                                                          minibatches, else 1)

with ``R = C`` (vmap), ``min(C, strategy.SCAN_UNROLL)`` (scan: the clients of one unrolled
loop iteration), ``k`` (chunked; ``k`` =
the largest divisor of ``C`` that is ``<= chunk_size``, the engine's rule), ``D`` devices
over which the client axis is sharded (``R`` becomes ``ceil(R / D)``), ``B`` =
``algorithm.batch_size`` (or ``n_max`` for full-batch clients) and ``a`` the per-example
activation bytes of the model (every intermediate of one forward pass that grows with the
batch, counted from the jaxpr at batch sizes 1 and 2). The client pool itself
(``data.x.nbytes`` …) is resident before the round and is *not* included.

Clients read their rows of the pool inside the map (engine), so only the resident
clients hold a copy of their data. It is an estimate, mostly on the safe side: measured
against ``compiled.memory_analysis()`` (temp + output bytes) it was 1.0–3.4× XLA's number
for MLP rounds (FedAvg, fishr_intra_geo) and 0.9–1.1× for the ConvNet (``benchmarks/
RESULTS.md``; before unrolled local steps and scan iterations were counted, 0.05–0.23×
for the ConvNet); ``tests/test_memory.py``
checks the order of magnitude and the monotonicity in ``C``, ``n_max``, the input size
and the resident clients.

Source: DESIGN.md §1 (execution strategies; "more clients than memory → chunks").
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core import strategy as strategy_lib

STRATEGIES = ("vmap", "scan", "chunked")
DEFAULT_FRACTION = 0.8


class DoesNotFitError(MemoryError, ValueError):
  """A round's estimated memory exceeds the device budget.

  Subclasses both ``MemoryError`` (what it is) and ``ValueError`` (a bad configuration,
  raised before any compile, and reported cleanly by the CLI)."""


@dataclasses.dataclass(frozen=True)
class RoundMemory:
  """Breakdown of :func:`estimate_round_bytes` (all in bytes).

  Attributes:
    total: the estimate.
    resident_clients: clients materialized at once per device (``R``).
    per_client: bytes per resident client (params copies + optimizer + stats +
      activations + minibatch).
    activations_per_example: forward intermediates per example (``a``).
    cohort_data: the data rows of the resident clients (per device).
    outputs: stacked per-client outputs (client state) (per device).
    server: server params, server optimizer state and component server state.
    params: bytes of one copy of the model parameters.
  """
  total: int
  resident_clients: int
  per_client: int
  activations_per_example: int
  cohort_data: int
  outputs: int
  server: int
  params: int


def _tree_bytes(tree) -> int:
  return int(sum(math.prod(np.shape(l)) * np.dtype(l.dtype).itemsize
                 for l in jax.tree.leaves(tree)))


def _var_bytes(v) -> int:
  aval = getattr(v, "aval", None)
  shape = getattr(aval, "shape", None)
  dtype = getattr(aval, "dtype", None)
  if shape is None or dtype is None:
    return 0
  try:
    return math.prod(shape) * np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes (PRNG keys)
    return 0


def _jaxpr_out_bytes(jaxpr) -> int:
  """Sum of the bytes of every equation output in ``jaxpr`` (recursing into calls)."""
  total = 0
  for eqn in jaxpr.eqns:
    subs = sub_jaxprs(eqn)
    if subs:
      total += sum(_jaxpr_out_bytes(s) for s in subs)
    else:
      total += sum(_var_bytes(v) for v in eqn.outvars)
  return total


def sub_jaxprs(eqn) -> list:
  """The jaxprs nested in one equation's params (scan/while/cond/pjit bodies)."""
  out = []
  for v in eqn.params.values():
    for item in (v if isinstance(v, (tuple, list)) else (v,)):
      if hasattr(item, "eqns"):
        out.append(item)
      elif hasattr(item, "jaxpr") and hasattr(getattr(item, "jaxpr"), "eqns"):
        out.append(item.jaxpr)
  return out


def activation_bytes_per_example(model, feature_shape: Sequence[int],
                                 forward=None) -> int:
  """Bytes of the forward intermediates of one example (the batch-linear part).

  Traces ``model.apply`` (or ``forward(params, x)``) at batch sizes 1 and 2 with
  ``jax.make_jaxpr`` (no compile) and returns the difference of the summed output sizes
  of all equations, so parameter-only intermediates cancel.

  Args:
    model: ``FunctionalModel``.
    feature_shape: one example's shape, e.g. ``(28, 28, 1)``.
    forward: optional ``(params, x[B, ...]) -> logits`` replacing ``model.apply``.

  Returns:
    int bytes per example (>= 0).
  """
  params = jax.eval_shape(lambda: model.init(0))
  fwd = forward or model.apply

  def count(b):
    x = jax.ShapeDtypeStruct((b,) + tuple(feature_shape), jnp.float32)
    return _jaxpr_out_bytes(jax.make_jaxpr(fwd)(params, x).jaxpr)

  return max(0, count(2) - count(1))


def _resident(strategy: str, cohort: int, chunk_size: int | None, num_devices: int) -> int:
  if strategy == "vmap":
    r = cohort
  elif strategy == "scan":
    # XLA keeps the buffers of the clients of one unrolled loop iteration live together.
    return max(1, min(cohort, strategy_lib.SCAN_UNROLL))
  else:
    r = strategy_lib.largest_divisor_at_most(cohort, chunk_size or min(cohort, 64))
  return max(1, -(-r // num_devices))


def _check_args(cohort, n_max, feature_shape, strategy, chunk_size, num_devices):
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy={strategy!r}; the estimate needs a resolved strategy, one "
                     f"of {STRATEGIES} (resolve 'auto' first, or call auto_strategy).")
  if int(cohort) < 1:
    raise ValueError(f"cohort={cohort}; it must be >= 1 clients per round.")
  if int(n_max) < 1:
    raise ValueError(f"n_max={n_max}; it must be >= 1 example per client.")
  if any(int(d) < 1 for d in feature_shape):
    raise ValueError(f"feature_shape={tuple(feature_shape)}; every dimension must be >= 1.")
  if chunk_size is not None and int(chunk_size) < 1:
    raise ValueError(f"chunk_size={chunk_size}; use a positive int or None (default 64).")
  if int(num_devices) < 1:
    raise ValueError(f"num_devices={num_devices}; it must be >= 1.")


def round_memory(model, algorithm, cohort: int, n_max: int, feature_shape: Sequence[int],
                 strategy: str, chunk_size: int | None = None, *, num_devices: int = 1,
                 label_bytes: int = 4) -> RoundMemory:
  """The breakdown behind :func:`estimate_round_bytes` (same arguments)."""
  _check_args(cohort, n_max, feature_shape, strategy, chunk_size, num_devices)
  model = algorithm.model_for(model)
  params = jax.eval_shape(lambda: model.init(0))
  p = _tree_bytes(params)
  one = jnp.ones((), jnp.float32)
  opt = _tree_bytes(jax.eval_shape(algorithm.client_chain().init, params))
  stats = _tree_bytes(jax.eval_shape(lambda q: algorithm.aggregator.lift(q, one), params))
  cstate = sum(_tree_bytes(jax.eval_shape(c.init_client, params))
               for c in algorithm.components if c.init_client is not None)
  if algorithm.client_optimizer_state == "persistent":  # gathered and scattered back too
    cstate += opt
  extras = sum(_tree_bytes(jax.eval_shape(c.init_server, params))
               for c in algorithm.components if c.init_server is not None)
  n_msgs = sum((c.message is not None) + (c.pre_message is not None)
               for c in algorithm.components)
  server = p + _tree_bytes(jax.eval_shape(algorithm.server_chain().init, params)) + extras

  fwd_comp = next((c for c in algorithm.components if c.forward is not None), None)
  forward = None
  if fwd_comp is not None:
    def forward(q, x):
      return fwd_comp.forward(model, q, x, jax.random.key(0)).logits
  act = activation_bytes_per_example(model, feature_shape, forward)
  x_bytes = math.prod(feature_shape) * 4
  b = algorithm.batch_size or n_max
  # The engine gathers all K minibatches of a client at once when they are small
  # (strategy.PREGATHER_BYTES); otherwise one minibatch per local step.
  batches = 1
  if algorithm.batch_size is not None:
    k = algorithm.local_steps
    if k * b * x_bytes <= strategy_lib.PREGATHER_BYTES:
      batches = k

  # A replaced gradient estimator (FedILC's intra-silo geometric mean) works on per-sample
  # gradients: B copies of the parameters, and XLA keeps several such [B, |params|]
  # arrays alive (gradients, log-magnitudes, signs, masks): XLA temp of fishr_intra_geo
  # rounds (MLP 784-128-10, B = 64) was ~6 B |params| per resident client.
  per_sample = 6 * b * p if any(c.grad_estimator is not None
                                for c in algorithm.components) else 0
  if per_sample and algorithm.task_only and getattr(model, "dense_chain", None) is not None:
    # ... except for dense chains (models.mlp), where the engine's estimator works on
    # matmuls of layer inputs and pre-activation gradients (``[m, 4B]``/``[m, 2n]``
    # operands and outputs per layer: a few parameter copies, measured XLA temp 11-14 MB
    # per round for the MNIST MLP).
    per_sample = 8 * p + 12 * b * act

  # Unrolled local steps (the engine unrolls short local loops on CPU) keep their
  # activations live together: measured XLA temp of a ConvNet round grows ~K-fold.
  live_steps = strategy_lib.local_unroll(algorithm.local_steps)
  per_client = (4 * p + opt + stats + 2 * cstate + n_msgs * p + per_sample
                + 2 * live_steps * b * act + batches * b * (x_bytes + label_bytes))
  resident = _resident(strategy, cohort, chunk_size, num_devices)
  shard = lambda v: -(-v // num_devices)  # noqa: E731
  # Clients read their rows of the (already resident) pool inside the map, so only the
  # clients resident at once hold a copy of their data: all C under 'vmap', a chunk under
  # 'chunked', one loop iteration under 'scan'.
  cohort_data = shard(resident * num_devices * (n_max * (x_bytes + label_bytes) + 4))
  outputs = shard(cohort * cstate)
  total = cohort_data + resident * per_client + outputs + server
  return RoundMemory(total=int(total), resident_clients=int(resident),
                     per_client=int(per_client), activations_per_example=int(act),
                     cohort_data=int(cohort_data), outputs=int(outputs),
                     server=int(server), params=int(p))


def estimate_round_bytes(model, algorithm, cohort: int, n_max: int,
                         feature_shape: Sequence[int], strategy: str,
                         chunk_size: int | None = None, *, num_devices: int = 1) -> int:
  """Estimated peak device bytes of one round (per device), before compiling.

  See the module docstring for the formula. Monotone: non-decreasing in ``cohort``,
  ``n_max``, ``chunk_size`` and the size of ``feature_shape``, and
  ``scan <= chunked <= vmap`` for the same arguments.

  Args:
    model: the task's ``FunctionalModel`` (``algorithm.model_transform`` is applied).
    algorithm: ``Algorithm`` (its client optimizer, aggregator, components, batch size).
    cohort: clients per round ``C``.
    n_max: padded examples per client.
    feature_shape: one example's input shape, e.g. ``(28, 28, 1)``.
    strategy: 'vmap' | 'scan' | 'chunked' (a resolved strategy, not 'auto').
    chunk_size: clients per chunk for 'chunked' (default ``min(C, 64)``, rounded down to
      a divisor of ``C`` as the engine does).
    num_devices: devices the client axis is sharded over (``client_mesh``); the result is
      per device.

  Returns:
    int bytes (excluding the already-resident client pool).

  Raises:
    ValueError: unknown strategy (incl. 'auto'), ``cohort``/``n_max``/``chunk_size``/
      ``num_devices`` < 1, or a non-positive feature dimension.

  Source: DESIGN.md §1 (vmap / scan / chunked / sharded strategies).
  """
  return round_memory(model, algorithm, cohort, n_max, feature_shape, strategy,
                      chunk_size, num_devices=num_devices).total


def device_memory_bytes(device=None) -> int:
  """Memory capacity of ``device`` (default ``jax.devices()[0]``) in bytes.

  Accelerators: ``memory_stats()['bytes_limit']`` (what XLA's allocator may use).
  CPU (``memory_stats()`` is None): physical RAM from ``os.sysconf``
  (``SC_PAGE_SIZE × SC_PHYS_PAGES``), or 8 GiB when the OS does not say.
  """
  device = device or jax.devices()[0]
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # some backends raise instead of returning None
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    return 8 << 30


def _gib(b: float) -> str:
  return f"{b / 2**30:.2f} GiB"


def _budget(capacity_bytes, fraction) -> tuple[int, int]:
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction={fraction}; the usable share of device memory must be "
                     "in (0, 1].")
  capacity = int(capacity_bytes) if capacity_bytes is not None else device_memory_bytes()
  if capacity <= 0:
    raise ValueError(f"capacity_bytes={capacity_bytes}; it must be > 0.")
  return capacity, int(capacity * fraction)


def check_fits(model, algorithm, cohort: int, n_max: int, feature_shape: Sequence[int],
               strategy: str, chunk_size: int | None = None, *, num_devices: int = 1,
               capacity_bytes: int | None = None,
               fraction: float = DEFAULT_FRACTION) -> int:
  """Raises unless the estimated round fits ``fraction`` of the device memory.

  Call it for an *explicit* strategy before building the round, so that a configuration
  that cannot fit fails with the numbers instead of an XLA out-of-memory error.

  Args:
    model, algorithm, cohort, n_max, feature_shape, strategy, chunk_size, num_devices:
      as :func:`estimate_round_bytes`.
    capacity_bytes: device memory (default :func:`device_memory_bytes`).
    fraction: usable share of it (default 0.8; leaves room for the pool and XLA).

  Returns:
    the estimate in bytes (when it fits).

  Raises:
    DoesNotFitError (a ``MemoryError`` and a ``ValueError``): the estimate exceeds the
      budget; the message gives the estimate, its breakdown, the budget and the fix (a
      chunk size that fits, 'scan', or a smaller cohort).
    ValueError: bad arguments (see :func:`estimate_round_bytes`; ``fraction`` not in
      (0, 1]).
  """
  capacity, budget = _budget(capacity_bytes, fraction)
  m = round_memory(model, algorithm, cohort, n_max, feature_shape, strategy, chunk_size,
                   num_devices=num_devices)
  if m.total <= budget:
    return m.total
  try:
    k = choose_chunk_size(model, algorithm, cohort, n_max, feature_shape,
                          num_devices=num_devices, capacity_bytes=capacity,
                          fraction=fraction)
    fix = (f"use execution='chunked' with chunk_size<={k} (or 'scan'), or fewer "
           "clients_per_round")
  except DoesNotFitError:
    fix = ("even one client at a time does not fit: lower clients_per_round (the gathered "
           "cohort data is resident), n_max, the batch size or the model size")
  raise DoesNotFitError(
      f"execution={strategy!r} with clients_per_round={cohort} (n_max={n_max}, "
      f"feature_shape={tuple(feature_shape)}, {m.resident_clients} clients resident per "
      f"device) needs ~{_gib(m.total)} per device: {_gib(m.cohort_data)} of resident "
      f"clients' data + {m.resident_clients} x {m.per_client / 2**20:.1f} MiB per client + "
      f"{_gib(m.outputs + m.server)} outputs/server; the budget is {_gib(budget)} "
      f"({fraction:.0%} of {_gib(capacity)}). Fix: {fix}.")


def choose_chunk_size(model, algorithm, cohort: int, n_max: int,
                      feature_shape: Sequence[int], *, num_devices: int = 1,
                      capacity_bytes: int | None = None,
                      fraction: float = DEFAULT_FRACTION,
                      max_chunk: int | None = None) -> int:
  """The largest chunk (a divisor of ``cohort``, as the engine rounds) whose 'chunked'
  round fits ``fraction`` of device memory.

  Prefers multiples of ``num_devices`` (so the chunk's client axis shards evenly).

  Args:
    as :func:`check_fits`; ``max_chunk`` caps the answer (default ``cohort``).

  Returns:
    int chunk size in ``[1, cohort]``.

  Raises:
    DoesNotFitError: not even a chunk of one client fits (message gives the numbers).
    ValueError: bad arguments.
  """
  capacity, budget = _budget(capacity_bytes, fraction)
  if max_chunk is not None and int(max_chunk) < 1:
    raise ValueError(f"max_chunk={max_chunk}; it must be >= 1.")
  # The estimate is affine in the number of resident clients: solve, then round down.
  base = round_memory(model, algorithm, cohort, n_max, feature_shape, "chunked", 1,
                      num_devices=num_devices)  # one resident client
  fixed = base.total - base.per_client
  if fixed + base.per_client > budget:
    raise DoesNotFitError(
        f"clients_per_round={cohort} does not fit even one client at a time: "
        f"~{_gib(base.total)} per device ({_gib(base.cohort_data)} client data, "
        f"{base.per_client / 2**20:.1f} MiB per client) > budget {_gib(budget)} "
        f"({fraction:.0%} of {_gib(capacity)}). Fix: lower clients_per_round, n_max, the "
        "batch size or the model size.")
  per_dev = max(1, (budget - fixed) // base.per_client)
  limit = min(cohort, per_dev * num_devices, max_chunk or cohort)
  divisors = [d for d in range(int(limit), 0, -1) if cohort % d == 0]
  even = [d for d in divisors if d % num_devices == 0]
  return int((even or divisors)[0])


def auto_strategy(model, algorithm, cohort: int, n_max: int, feature_shape: Sequence[int],
                  *, backend: str | None = None, num_devices: int | None = None,
                  capacity_bytes: int | None = None,
                  fraction: float = DEFAULT_FRACTION) -> tuple[str, int | None]:
  """What ``execution='auto'`` should resolve to, memory included.

  Rule (DESIGN.md §1): on a single CPU device, 'scan' (measured fastest there); else
  'vmap' (sharded over ``num_devices``) when it fits, otherwise 'chunked' with the
  largest chunk that fits (:func:`choose_chunk_size`).

  Returns:
    ``(strategy, chunk_size)`` with ``chunk_size`` None except for 'chunked'.

  Raises:
    DoesNotFitError: not even one client at a time fits.
  """
  backend = backend or jax.default_backend()
  num_devices = num_devices or jax.device_count()
  capacity, _ = _budget(capacity_bytes, fraction)
  if backend == "cpu" and num_devices == 1:
    check_fits(model, algorithm, cohort, n_max, feature_shape, "scan",
               capacity_bytes=capacity, fraction=fraction)
    return "scan", None
  try:
    check_fits(model, algorithm, cohort, n_max, feature_shape, "vmap",
               num_devices=num_devices, capacity_bytes=capacity, fraction=fraction)
    return "vmap", None
  except DoesNotFitError:
    return "chunked", choose_chunk_size(model, algorithm, cohort, n_max, feature_shape,
                                        num_devices=num_devices, capacity_bytes=capacity,
                                        fraction=fraction)
