"""Memory estimate of one federated round, before anything is compiled.

The engine (``core/engine.py``) runs a round as map-reduces over a client axis. How many
clients are *resident at once* decides the memory: all ``C`` under ``vmap``, one loop
iteration (``SCAN_UNROLL`` clients) under ``scan``, ``chunk_size`` under ``chunked``
(divided by the number of devices when the client axis is sharded). This module
estimates the bytes a round needs from the model, the algorithm and the data shapes, so
that a strategy can be chosen, or refused with a clear message, before XLA would run out
of memory.

The model's share is read from the model itself, not from per-layer rules:
:func:`client_peak_bytes` traces, with ``jax.make_jaxpr`` on abstract values (no
compile, no device memory), one local step's gradient on a minibatch (the forward pass
and its backward pass, through the algorithm's own forward, loss terms and gradient
estimator) and each component's message hooks on a client's data, and
:func:`peak_live_bytes` finds the most bytes their values keep alive at once: the
forward values kept for the backward pass, their cotangents, per-sample gradients. The
estimate (bytes, per device; float32 unless the pytrees say otherwise)::

    total = max(R · per-client bytes, R_pre · pre-stage bytes)
          + the aggregators' running sums   |lifted stats of a delta|
                                           + |params| per message / pre-message component
          + stacked per-client outputs     C · |client state| / D
          + server state                   |params| + |server opt state| + |extras|

    per-client bytes = its rows of the pool       n_max · (|x| + |y|)
                     + parameter copies           3 · |params|  (local model, optimizer
                                                  update, delta; the gradient is in the
                                                  step's peak)
                     + |client opt state|
                     + 2 · |client state|         (gathered in, updated out; with
                                                  client_optimizer_state='persistent'
                                                  it includes the client opt state)
                     + the minibatches            m · B · (|x| + |y|)  (m = K when the
                                                  engine pre-gathers all K local steps'
                                                  minibatches, else 1; 0 for full-batch
                                                  clients, which use their rows)
                     + κ · model work
    model work       = under 'scan':  max(step, message_1, ...)
                       otherwise:     step + message_1 + ...
    pre-stage bytes  = its rows + pre_message_1 + ...

* ``step``, ``message_i``, ``pre_message_i``: the jaxpr liveness peaks of
  :class:`ClientPeaks`. One step stands for the whole local-training loop: each step
  needs the previous step's parameters, so XLA runs the steps of the unrolled loop one
  after the other (measured: 5 unrolled SGD steps of ``models.cnn(1)``, 1.07x the XLA temp
  of one step; the per-layer formula before counted the K steps' activations K times).
* 'scan' vs the rest: in a ``scan`` iteration one client's work runs after the other's,
  and a client's messages after its local training. With the clients batched (``vmap``,
  ``chunked``) XLA runs the work that does not depend on the trained parameters alongside
  the local training (measured, ``models.cnn(1)``, fishr_inter_geo, whose message is a
  VJP at the global model: 32 MB of XLA temp for one client alone, 55 MB per client
  vmapped; the local step's peak is 22 MB and the message's 22 MB).
* The pre-stage (messages at the global model before local training: Fishr's variances,
  FedIIR's classifier gradient) runs before the main stage: the round needs the larger.
  It runs forward passes only, whose elementwise ops XLA fuses into their producers (a
  ReLU into its convolution) while the jaxpr holds both, so its liveness is counted
  without ``κ`` (measured: the 'scan' rounds of fediir take the same XLA memory as
  fedavg's, so XLA's pre-stage is below 0.8x its liveness there).
* The running sums: a client's lifted statistics are elementwise functions of its delta
  and messages, which XLA fuses into the sum over clients (the loop's carry under
  'scan', the reduction under 'vmap'), so they are held once, not per client.
* ``κ`` = :data:`XLA_OVERHEAD` = 1.4: XLA's buffers over the jaxpr's liveness. XLA:CPU's
  heap leaves gaps between buffers of different sizes, and some values exist twice or
  wider (a convolution operand transposed into the kernel's layout, the max-pool
  gradient's mask as float32). One SGD step of batch 32 (XLA temp / liveness):
  ``models.cnn(1)`` 1.40, ``models.convnet()`` 1.21, a ResNet-18 of width 8 1.09.
* ``R`` = ``C`` (vmap), ``min(C, strategy.SCAN_UNROLL)`` (scan), ``k`` (chunked: the
  largest divisor of ``C`` that is ``<= chunk_size``, the engine's rule), then
  ``ceil(R / D)`` with the client axis sharded over ``D`` devices. ``R_pre = R``, except
  under ``scan``, where the engine runs the pre-stage vmapped in chunks of
  :data:`PRE_CHUNK` (the largest divisor of ``C`` that is ``<= 8``).
* ``B`` = ``algorithm.batch_size`` (or ``n_max`` for full-batch clients). The loss head
  is traced as 'multiclass' (the estimate does not take the task's kind; the ``[B, K]``
  logits are negligible next to the model).
* The client pool (``data.x.nbytes`` ...) is resident before the round and is *not*
  included; each resident client's own rows, which it reads inside the map, are.

Measured against ``compiled.memory_analysis()`` (temp + output bytes) of the compiled
round on XLA:CPU, JAX 0.10.2 (``benchmarks/memory_check.py``; ``benchmarks/RESULTS.md``,
'Memory estimate for ConvNets'): 0.85-1.93x for 72 ConvNet rounds
(``models.cnn(1)``, FedSR's ``models.convnet()``, a ResNet-18 of width 8; fedavg, fedsr,
fishr_inter_geo, fediir; scan, vmap, chunked; C = 10 and 100), where the per-layer
formula it replaces was 1.65-15.6x; 1.2-3.0x for the MNIST MLP (was 1.7-5.2x). Known
gap: fishr_intra_geo on a ConvNet under 'scan' is 0.55-0.79x (XLA runs its local step
alongside its Fishr message there; 1.5-1.8x under 'vmap'). Not measured on GPU/TPU,
whose allocators differ. ``tests/test_memory.py`` checks 0.8-2x on
a tiny ConvNet round under each strategy, the order of magnitude for an MLP, and the
monotonicity in ``C``, ``n_max``, the input size and the resident clients.

Source: docs/ARCHITECTURE.md, 'A round is a map-reduce over a client axis' (execution
strategies; "more clients than memory → chunks").
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_inv.core import client as client_lib
from fedjax_inv.core.aggregator import lift, main_aggregator
from fedjax_inv.core import state as state_lib
from fedjax_inv.core import strategy as strategy_lib
from fedjax_inv.core.algorithm import CLIENT_OPT_STATE, Batch, Context

STRATEGIES = strategy_lib.CONCRETE_STRATEGIES
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
    per_client: bytes per resident client, main stage (its data rows, model copies,
      optimizer and client state, minibatches, ``XLA_OVERHEAD`` x its model work), or
      the pre-stage's if larger.
    client_work: jaxpr liveness peak of one client's model work in the main stage
      (:class:`ClientPeaks`: ``sequential`` under 'scan', else ``overlapped``).
    pre_client_work: the same for its pre-stage (0 without one).
    cohort_data: the data rows of the resident clients (per device; part of
      ``per_client``).
    sums: the aggregators' running sums of the lifted statistics (delta, messages).
    outputs: stacked per-client outputs (client state) (per device).
    server: server params, server optimizer state and component server state.
    params: bytes of one copy of the model parameters.
  """
  total: int
  resident_clients: int
  per_client: int
  client_work: int
  pre_client_work: int
  cohort_data: int
  sums: int
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


def sub_jaxprs(eqn) -> list:
  """The jaxprs nested in one equation's params (scan/while/cond/pjit bodies)."""
  out = []
  for v in eqn.params.values():
    for item in (v if isinstance(v, (tuple, list)) else (v,)):
      if hasattr(item, "eqns"):
        out.append(item)
      elif hasattr(item, "jaxpr") and hasattr(item.jaxpr, "eqns"):
        out.append(item.jaxpr)
  return out


def _is_var(v) -> bool:
  return not hasattr(v, "val")  # a Literal carries its value; Vars (and DropVars) do not


def peak_live_bytes(jaxpr) -> int:
  """Peak bytes of the values a jaxpr keeps alive at once, in its equation order.

  A value is live from the equation that makes it to its last use (the jaxpr's outputs
  to the end); the jaxpr's inputs are not counted (the caller holds them). An equation
  with nested jaxprs (``scan``/``while`` bodies, ``cond`` branches, ``pjit``, custom
  derivatives) costs, while it runs, the largest peak of its bodies on top of what is
  live around it; a loop body counts once (its iterations reuse their buffers).
  """
  eqns = jaxpr.eqns
  last = {}
  for i, eqn in enumerate(eqns):
    for v in eqn.invars:
      if _is_var(v):
        last[v] = i
  for v in jaxpr.outvars:
    if _is_var(v):
      last[v] = len(eqns)
  inputs = set(jaxpr.invars) | set(jaxpr.constvars)
  live = peak = 0
  for i, eqn in enumerate(eqns):
    made = sum(_var_bytes(v) for v in eqn.outvars)
    inner = max((peak_live_bytes(s) for s in sub_jaxprs(eqn)), default=0)
    peak = max(peak, live + max(made, inner))
    live += sum(_var_bytes(v) for v in eqn.outvars if v in last)
    for v in {v for v in eqn.invars if _is_var(v)}:
      if last.get(v) == i and v not in inputs:
        live -= _var_bytes(v)
  return peak


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


# κ, XLA's buffers over the jaxpr's liveness peak of a client's model work (the module
# docstring says why and what it was measured on).
XLA_OVERHEAD = 1.4
# Under 'scan' the engine runs the pre-stage vmapped in chunks of this many clients.
PRE_CHUNK = strategy_lib.PRE_CHUNK
# The loss kind the client's work is traced with: the loss head ([B, K] logits) is
# negligible next to the model, so the estimate does not need the task's kind.
_KIND = "multiclass"
_PEAKS: dict = {}  # (id(model), id(algorithm), n_max, feature_shape, conv form) -> (model,
#                    alg, peaks)


class ClientPeaks(NamedTuple):
  """Peak live bytes of one client's model work (:func:`client_peak_bytes`).

  Attributes:
    step: one local step's gradient (forward, backward; a gradient estimator's work).
    messages: each component's work after local training, its ``message`` and
      ``update_client`` (``core.client.client_outputs``; component order).
    pre: each pre-stage message hook (component order).
  """
  step: int
  messages: tuple
  pre: tuple

  @property
  def sequential(self) -> int:
    """The main stage with its parts one after the other (a 'scan' iteration)."""
    return max((self.step,) + self.messages)

  @property
  def overlapped(self) -> int:
    """The main stage with its parts side by side (batched clients, 'vmap'/'chunked')."""
    return self.step + sum(self.messages)


def client_view(algorithm, params) -> Context:
  """What a client is handed in a round (``core.algorithm.Context``), as abstract values,
  built by the engine's own ``core.state.init_state`` and
  ``core.client.client_context``: ``extras[name]`` a
  component's server state, ``client[name]`` its per-client state."""
  server, pool = jax.eval_shape(lambda p: state_lib.init_state(algorithm, p, 1), params)
  client = {k: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), v)
            for k, v in pool.items() if k != CLIENT_OPT_STATE}
  return jax.eval_shape(lambda sv, cl: client_lib.client_context(
      sv.params, sv.round, sv.extras, cl, 1, 1), server, client)


def client_peak_bytes(model, algorithm, n_max: int,
                      feature_shape: Sequence[int]) -> ClientPeaks:
  """Peak live bytes of one client's model work in a round, read from its jaxprs.

  Traces, with ``jax.make_jaxpr`` on abstract values (no compile, no device memory), one
  local step's gradient on a minibatch (``batch_size``, or ``n_max`` for full-batch
  clients) and each component's ``message`` / ``pre_message`` hook on the client's
  ``n_max`` examples, in the :func:`client_view` a client is handed, and returns
  :func:`peak_live_bytes` of each. One step stands for the local-training loop: each
  step needs the previous step's parameters, so XLA runs the steps of the unrolled loop
  one after the other (measured: 5 unrolled SGD steps of ``models.cnn(1)`` take 1.07x
  the XLA temp of one).

  Args:
    model: the task's ``FunctionalModel`` (``algorithm.model_transform`` is applied).
    algorithm: ``Algorithm``.
    n_max: padded examples per client.
    feature_shape: one example's shape.

  Returns:
    :class:`ClientPeaks` (bytes), traced in the convolution form in force
    (``strategy.conv_form``). Cached per (model, algorithm) object, shapes and form.
  """
  key = (id(model), id(algorithm), int(n_max), tuple(feature_shape),
         strategy_lib.current_conv_form())
  hit = _PEAKS.get(key)
  if hit is not None and hit[0] is model and hit[1] is algorithm:
    return hit[2]
  trained = algorithm.model_for(model)
  params = jax.eval_shape(lambda: trained.init(0))
  ctx = client_view(algorithm, params)
  rng = jax.eval_shape(jax.random.key, 0)
  feat = tuple(feature_shape)
  b = algorithm.batch_size or n_max
  batch = Batch(x=jax.ShapeDtypeStruct((b,) + feat, jnp.float32),
                y=jax.ShapeDtypeStruct((b,), jnp.int32),
                w=jax.ShapeDtypeStruct((b,), jnp.float32))
  data = Batch(x=jax.ShapeDtypeStruct((n_max,) + feat, jnp.float32),
               y=jax.ShapeDtypeStruct((n_max,), jnp.int32),
               w=jax.ShapeDtypeStruct((n_max,), jnp.float32))

  def peak(fn, *args):
    return peak_live_bytes(jax.make_jaxpr(fn)(*args).jaxpr)

  comps = algorithm.components
  # The engine's own functions: one local step's gradient, each component's work after
  # local training (message and client-state update) and its pre-round message.
  peaks = ClientPeaks(
      step=peak(lambda p, bt, cx, k: client_lib.step_gradient(trained, _KIND, algorithm, cx)(
          p, bt, k), params, batch, ctx, rng),
      messages=tuple(peak(lambda p, d, cx, k, c=c: client_lib.client_outputs(
          trained, _KIND, c, p, d, cx, k), params, data, ctx, rng)
          for c in comps if c.message is not None or c.update_client is not None),
      pre=tuple(peak(lambda p, d, cx, k, c=c: c.call(
          "pre_message", model=trained, kind=_KIND, params=p, batch=d, ctx=cx, key=k),
                     params, data, ctx, rng) for c in comps if c.pre_message is not None))
  if len(_PEAKS) >= 64:
    _PEAKS.pop(next(iter(_PEAKS)))
  _PEAKS[key] = (model, algorithm, peaks)
  return peaks


def round_memory(model, algorithm, cohort: int, n_max: int, feature_shape: Sequence[int],
                 strategy: str, chunk_size: int | None = None, *, num_devices: int = 1,
                 label_bytes: int = 4) -> RoundMemory:
  """The breakdown behind :func:`estimate_round_bytes` (same arguments)."""
  strategy, form = strategy_lib.split_execution(strategy)
  _check_args(cohort, n_max, feature_shape, strategy, chunk_size, num_devices)
  with strategy_lib.conv_form(form if form != "lax" else strategy_lib.current_conv_form()):
    peaks = client_peak_bytes(model, algorithm, n_max, feature_shape)
  model = algorithm.model_for(model)
  params = jax.eval_shape(lambda: model.init(0))
  p = _tree_bytes(params)
  one = jnp.ones((), jnp.float32)
  opt = _tree_bytes(jax.eval_shape(algorithm.client_chain().init, params))
  # the lift may read the client's context (DP's adaptive clip norm): give it one
  stats = _tree_bytes(jax.eval_shape(lambda q, cx: lift(algorithm.aggregator, q, one, cx),
                                     params, client_view(algorithm, params)))
  cstate = sum(_tree_bytes(jax.eval_shape(lambda q, c=c: c.call("init_client", params=q),
                                          params))
               for c in algorithm.components if c.init_client is not None)
  if algorithm.client_optimizer_state == "persistent":  # gathered and scattered back too
    cstate += opt
  extras = sum(_tree_bytes(jax.eval_shape(lambda q, c=c: c.call("init_server", params=q), params))
               for c in algorithm.components if c.init_server is not None)
  n_msgs = len(peaks.messages) + len(peaks.pre)
  server = p + _tree_bytes(jax.eval_shape(algorithm.server_optimizer_state, params)) + extras

  x_bytes = math.prod(feature_shape) * 4
  b = algorithm.batch_size or n_max
  # The engine gathers all K minibatches of a client at once when they are small
  # (strategy.PREGATHER_BYTES); otherwise one minibatch per local step; full-batch
  # clients train on their rows as they are. Under local_epochs a client gathers one
  # minibatch per step (plus its epochs' permutations, [E, ceil(n_max/B)*B] int32).
  batches = 0
  if algorithm.batch_size is not None:
    batches = 1
    if algorithm.local_epochs is None and strategy_lib.pregathered(
        algorithm.local_steps, b, x_bytes):
      batches = algorithm.local_steps
  # Under 'scan' a loop iteration's clients run one after the other, and so do a client's
  # local training and messages; with the clients batched ('vmap', 'chunked') XLA runs
  # the work that does not depend on the trained parameters (e.g. Fishr's message at the
  # global model) alongside the local training.
  work = peaks.sequential if strategy == "scan" else peaks.overlapped
  rows = n_max * (x_bytes + label_bytes) + 4  # the client's rows of the pool, read once
  # Three parameter copies besides the step's work (whose peak holds the gradient): the
  # local model, the optimizer's update and the delta.
  if algorithm.local_epochs is not None:
    rows += 4 * algorithm.local_epochs * -(-n_max // b) * b
  per_client = (rows + 3 * p + opt + 2 * cstate + batches * b * (x_bytes + label_bytes)
                + math.ceil(XLA_OVERHEAD * work))
  # The pre-stage runs forward passes only, whose elementwise ops XLA fuses into their
  # producers (a ReLU into its convolution) while the jaxpr keeps both: its liveness is
  # above XLA's already (no XLA_OVERHEAD; see the module docstring).
  pre_client = rows + sum(peaks.pre) if peaks.pre else 0
  resident = _resident(strategy, cohort, chunk_size, num_devices)
  resident_pre = resident
  if strategy == "scan" and PRE_CHUNK:  # the engine's pre-stage chunks (PRE_CHUNK)
    resident_pre = strategy_lib.largest_divisor_at_most(cohort, PRE_CHUNK)
  shard = lambda v: -(-v // num_devices)  # noqa: E731
  # The pre-stage and the main stage run one after the other: the round needs the larger.
  clients = max(resident * per_client, resident_pre * pre_client)
  outputs = shard(cohort * cstate)
  # A gathered aggregator (robust.py; any aggregator under an attack) stacks its lifted
  # values over the client axis: C copies of the message and the weight.
  if main_aggregator(algorithm).gather:
    outputs += shard(cohort * (p + 8))
  outputs += sum(shard(cohort * (p + 4)) for c in algorithm.components
                 if c.message is not None and getattr(c.aggregator, "gather", False))
  # The aggregators' running sums: a client's lifted statistics fuse into their sum
  # (elementwise functions of its delta / messages), so they are held once, not per client.
  sums = stats + n_msgs * p
  total = clients + sums + outputs + server
  return RoundMemory(total=int(total), resident_clients=int(resident),
                     per_client=int(max(per_client, pre_client)),
                     client_work=int(work), pre_client_work=int(sum(peaks.pre)),
                     cohort_data=int(resident * rows), sums=int(sums),
                     outputs=int(outputs), server=int(server), params=int(p))


def estimate_round_bytes(model, algorithm, cohort: int, n_max: int,
                         feature_shape: Sequence[int], strategy: str,
                         chunk_size: int | None = None, *, num_devices: int = 1) -> int:
  """Estimated peak device bytes of one round (per device), before compiling.

  See the module docstring for the formula. Non-decreasing in ``n_max``, ``chunk_size``
  and the size of ``feature_shape``, and in ``cohort`` under 'vmap' (the other
  strategies hold a divisor of it); ``chunked <= vmap`` for the same arguments, and
  ``scan`` (at most ``SCAN_UNROLL`` resident clients) below both unless a pre-stage's
  chunk of ``engine.PRE_CHUNK`` clients is the larger.

  Args:
    model: the task's ``FunctionalModel`` (``algorithm.model_transform`` is applied).
    algorithm: ``Algorithm`` (its client optimizer, aggregator, components, batch size).
    cohort: clients per round ``C``.
    n_max: padded examples per client.
    feature_shape: one example's input shape, e.g. ``(28, 28, 1)``.
    strategy: 'vmap' | 'scan' | 'chunked' (a resolved strategy, not 'auto'), or
      'vmap+patches' / 'chunked+patches' (the model traced with its convolutions in the
      patches form, ``strategy.CONV_FORMS``).
    chunk_size: clients per chunk for 'chunked' (default ``min(C, 64)``, rounded down to
      a divisor of ``C`` as the engine does).
    num_devices: devices the client axis is sharded over (``client_mesh``); the result is
      per device.

  Returns:
    int bytes (excluding the already-resident client pool).

  Raises:
    ValueError: unknown strategy (incl. 'auto'), ``cohort``/``n_max``/``chunk_size``/
      ``num_devices`` < 1, or a non-positive feature dimension.

  Source: docs/ARCHITECTURE.md, 'A round is a map-reduce over a client axis' (vmap /
  scan / chunked / sharded strategies).
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

  ``model``, ``algorithm``, ``cohort``, ``n_max``, ``feature_shape``, ``strategy``,
  ``chunk_size`` and ``num_devices`` are as in :func:`estimate_round_bytes`.

  Args:
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
    fix = ("even one client at a time does not fit: lower n_max, the batch size, the "
           "model size or clients_per_round (the per-client outputs are stacked)")
  raise DoesNotFitError(
      f"execution={strategy!r} with clients_per_round={cohort} (n_max={n_max}, "
      f"feature_shape={tuple(feature_shape)}, {m.resident_clients} clients resident per "
      f"device) needs ~{_gib(m.total)} per device: {m.resident_clients} x "
      f"{m.per_client / 2**20:.1f} MiB per client (its data rows, activations, model "
      f"copies, messages) + {_gib(m.outputs + m.server)} outputs/server; the budget is "
      f"{_gib(budget)} "
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
        f"~{_gib(base.total)} per device ({base.per_client / 2**20:.1f} MiB for the "
        f"client, {_gib(fixed)} sums/outputs/server) > budget {_gib(budget)} "
        f"({fraction:.0%} of {_gib(capacity)}). Fix: lower clients_per_round, n_max, the "
        "batch size or the model size.")
  per_dev = max(1, (budget - fixed) // base.per_client)
  limit = min(cohort, per_dev * num_devices, max_chunk or cohort)
  divisors = [d for d in range(int(limit), 0, -1) if cohort % d == 0]
  even = [d for d in divisors if d % num_devices == 0]
  return int((even or divisors)[0])


# 'auto' on an accelerator, models with convolutions: above this many clients per device,
# 'chunked' (chunks of at most CONV_CHUNK clients per device) instead of 'vmap'. Measured on
# one H200 (benchmarks/gpu/h200_short_*.json, models.cnn(1), FedAvg, 64 examples, 5 steps
# of 32): C=100 vmap 48.5 ms vs chunked 49.9 ms; C=1000 vmap 2671 ms (0.38x the per-client
# loop: XLA runs a vmapped convolution as one grouped convolution) vs chunked 495 ms.
CONV_VMAP_MAX = 128
CONV_CHUNK = 64
# Backends on which 'auto' runs a model's convolutions in the 'patches' form
# (core.strategy.CONV_FORMS: im2col and one matrix product, batched over the clients),
# and there 'vmap' when it fits, else 'chunked' (CONV_VMAP_MAX does not apply: it is the
# grouped convolution's limit). Measured on one H200 (benchmarks/results_side_by_side_h200,
# float32-exact, seconds per round): the ConvNet at C=1000 vmap+patches 0.243, chunked+patches
# 0.271, scan 1.18, chunked 1.45, vmap 2.85; pfl-research's CIFAR10 CNN at C=10 vmap+patches
# 0.0047 vs chunked 0.0118, at C=100 0.031 vs scan 0.118, at C=1000 0.285 vs scan 1.60; the
# FEMNIST CNN at C=100 vmap+patches 0.14. Not measured on a TPU: there 'auto' keeps 'lax' and
# times both forms when it measures (runner/auto_strategy.py).
CONV_PATCHES_BACKENDS = ("gpu", "cuda")
_CONV: dict = {}  # (id(model), feature_shape) -> (model, bool)


def uses_convolution(model, feature_shape: Sequence[int]) -> bool:
  """Whether ``model``'s forward pass on one example of ``feature_shape`` contains a
  convolution (``conv_general_dilated`` anywhere in its jaxpr, nested calls included).
  Traced on abstract values (no compile) in the 'lax' convolution form, whichever form
  is in force; cached per model object and shape."""
  key = (id(model), tuple(feature_shape))
  hit = _CONV.get(key)
  if hit is not None and hit[0] is model:
    return hit[1]
  params = jax.eval_shape(lambda: model.init(0))
  x = jax.ShapeDtypeStruct((1,) + tuple(feature_shape), jnp.float32)
  with strategy_lib.conv_form("lax"):
    jaxpr = jax.make_jaxpr(lambda p, v: model.classify(p, model.features(p, v)))(params, x)
  todo, found = [jaxpr.jaxpr], False
  while todo and not found:
    for eqn in todo.pop().eqns:
      found = found or eqn.primitive.name == "conv_general_dilated"
      todo.extend(sub_jaxprs(eqn))
  if len(_CONV) >= 64:
    _CONV.clear()
  _CONV[key] = (model, found)
  return found


def auto_conv_form(model, feature_shape: Sequence[int], backend: str | None = None) -> str:
  """The convolution form (``core.strategy.CONV_FORMS``) that ``execution='auto'`` runs
  ``model`` in: 'patches' on a backend of :data:`CONV_PATCHES_BACKENDS` (default: JAX's)
  for a model with convolutions (:func:`uses_convolution`), else 'lax'. Source: the H200
  measurement above :data:`CONV_PATCHES_BACKENDS`."""
  backend = backend or jax.default_backend()
  if backend in CONV_PATCHES_BACKENDS and uses_convolution(model, feature_shape):
    return "patches"
  return "lax"


def conv_chunks(model, cohort: int, feature_shape: Sequence[int], num_devices: int) -> bool:
  """True when 'auto' on an accelerator should run ``cohort`` clients of a convolutional
  ``model`` in chunks rather than one vmap: more than :data:`CONV_VMAP_MAX` clients per
  device (see the measurement above :data:`CONV_VMAP_MAX`)."""
  return (cohort > CONV_VMAP_MAX * max(1, num_devices)
          and uses_convolution(model, feature_shape))


def auto_strategy(model, algorithm, cohort: int, n_max: int, feature_shape: Sequence[int],
                  *, backend: str | None = None, num_devices: int | None = None,
                  shard_devices: int | None = None, capacity_bytes: int | None = None,
                  fraction: float = DEFAULT_FRACTION) -> tuple[str, int | None]:
  """What ``execution='auto'`` resolves to, memory included: the one definition of the
  fixed rule, which ``engine.build_round`` applies whenever it is given the data shapes.

  Rule (docs/ARCHITECTURE.md, 'A round is a map-reduce over a client axis'): on a
  single CPU device, 'scan' (measured fastest there; ``strategy.base_strategy``); on a
  GPU, for a model with convolutions, 'vmap+patches' when it fits, else 'chunked+patches'
  with the largest chunk that fits (:func:`auto_conv_form`); elsewhere, for a model with
  convolutions and more than :data:`CONV_VMAP_MAX` clients per device, 'chunked' with the
  largest chunk of at most :data:`CONV_CHUNK` clients per device that fits; else 'vmap'
  (sharded over ``shard_devices``) when it fits, otherwise 'chunked' with the largest
  chunk that fits (:func:`choose_chunk_size`).

  Args:
    model: ``FunctionalModel`` (``algorithm.model_for`` is applied to it).
    algorithm: ``Algorithm``.
    cohort: clients in the round's client axis ``C``.
    n_max: padded examples per client.
    feature_shape: one example's shape, without the client and example axes.
    backend: 'cpu' | 'gpu' | 'cuda' | 'tpu' (default: JAX's).
    num_devices: devices present (default: every device JAX sees); with a CPU backend,
      one device means 'scan'.
    shard_devices: devices the client axis is sharded over (default ``num_devices``;
      the engine passes its mesh's size, 1 without a mesh).
    capacity_bytes, fraction: the memory budget (:func:`check_fits`).

  Returns:
    ``(execution, chunk_size)``: a name of ``core.strategy.STRATEGIES`` other than 'auto'
    ('vmap+patches' included), ``chunk_size`` None except for the chunked ones.

  Raises:
    DoesNotFitError: not even one client at a time fits.
  """
  num_devices = num_devices or jax.device_count()
  ndev = shard_devices or num_devices
  capacity, _ = _budget(capacity_bytes, fraction)
  if strategy_lib.base_strategy(backend, num_devices) == "scan":
    check_fits(model, algorithm, cohort, n_max, feature_shape, "scan",
               capacity_bytes=capacity, fraction=fraction)
    return "scan", None
  alg_model = algorithm.model_for(model)
  form = auto_conv_form(alg_model, feature_shape, backend)
  suffix = strategy_lib.PATCHES if form == "patches" else ""
  if form == "lax" and conv_chunks(alg_model, cohort, feature_shape, ndev):
    return "chunked", choose_chunk_size(model, algorithm, cohort, n_max, feature_shape,
                                        num_devices=ndev, capacity_bytes=capacity,
                                        fraction=fraction, max_chunk=CONV_CHUNK * ndev)
  with strategy_lib.conv_form(form):
    try:
      check_fits(model, algorithm, cohort, n_max, feature_shape, "vmap",
                 num_devices=ndev, capacity_bytes=capacity, fraction=fraction)
      return "vmap" + suffix, None
    except DoesNotFitError:
      return "chunked" + suffix, choose_chunk_size(
          model, algorithm, cohort, n_max, feature_shape, num_devices=ndev,
          capacity_bytes=capacity, fraction=fraction)
